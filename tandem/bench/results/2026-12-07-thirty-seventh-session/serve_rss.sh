#!/bin/bash
# The verifier's memory with the default --activations (auto): tandem up with a separate verifier, its VmHWM /
# VmRSS once listening and after each of the 13 bench prompts (one a category, 128 tokens).
# TGT: the target (default: Gemma 3 270M Q4_K_M); PC: the prefix cache's MiB (default 0); OUT: a scratch folder.
cd /work/main; export HF_HUB_OFFLINE=1 TANDEM_PREFIX_CACHE_MB=${PC:-0}
G=${TGT:-/root/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf}
OUT=${OUT:-/tmp/b37}; mkdir -p $OUT
.venv/bin/tandem up --target $G --drafter ${DRF:-suffix} --separate-verifier --verifier-threads 2 --gateway-port 50071 --http-port 0 > $OUT/up-rss.log 2>&1 &
for i in $(seq 150); do sleep 2; grep -q "try:" $OUT/up-rss.log && break; done
VP=$(pgrep -f "serve-verifier" | head -1)
grep -o "GEMMs blocks ([^;]*" $OUT/up-rss.log | head -1
echo "after start: $(grep -E 'VmHWM|VmRSS' /proc/$VP/status | tr '\n' ' ')"
.venv/bin/python - "$OUT" <<'PY'
import json, sys
seen, out = set(), []
for line in open('/work/shared/data/spec_bench/question.jsonl'):
    q = json.loads(line)
    if q['category'] not in seen:
        seen.add(q['category']); out.append(q['turns'][0])
open(sys.argv[1] + '/prompts.txt', 'w').write('\n'.join(json.dumps(p) for p in out))
PY
while read -r line; do
  p=$(python3 -c "import json,sys; print(json.loads(sys.argv[1]))" "$line")
  .venv/bin/tandem generate --gateway 127.0.0.1:50071 --max-tokens 128 "$p" > /dev/null 2>&1
  echo "$(grep -E 'VmHWM|VmRSS' /proc/$VP/status | tr '\n' ' ')"
done < $OUT/prompts.txt
pkill -f "tandem up"
