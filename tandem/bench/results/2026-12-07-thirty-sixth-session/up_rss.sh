#!/bin/bash
# up_rss.sh DIR [extra up flags]: tandem up with Gemma and the suffix node; RSS of each process once ready
D=$1; shift
cd $D; export HF_HUB_OFFLINE=1
/work/main/.venv/bin/python -m tandem.cli up --target ${TGT:-/root/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf} --drafter ${DRF:-suffix} --gateway-port 50081 --http-port 0 "$@" > /tmp/b36/up_rss.log 2>&1 &
UP=$!
for i in $(seq 120); do sleep 2; grep -q "try:" /tmp/b36/up_rss.log && break; done
sleep 2
for p in $(pgrep -P $UP); do echo "$(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-60) : $(grep -E 'VmHWM|VmRSS' /proc/$p/status | tr -s ' \t\n' ' ')"; done
kill $UP; wait $UP 2>/dev/null; sleep 2
