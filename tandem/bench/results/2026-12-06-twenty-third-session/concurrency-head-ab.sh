#!/bin/bash
# fp32 plain, 8 and 1 clients, the head fix (777bab3) against 528cedc, alternated
source /work/main/.venv/bin/activate; export HF_HUB_OFFLINE=1
run() { dir=$1; tag=$2
  (cd $dir && python -m tandem.cli up --no-speculation --verifier-threads 2 --gateway-port 50061 --http-port 8091 > /tmp/b23/cc-$tag.log 2>&1 &)
  for i in $(seq 60); do curl -s -o /dev/null http://127.0.0.1:8091/v1/models && break; sleep 1; done
  python /tmp/b23/load.py 1 2 8091 >/dev/null
  echo "$tag 1 $(python /tmp/b23/load.py 1 6 8091 2>/dev/null)"
  echo "$tag 8 $(python /tmp/b23/load.py 8 3 8091 2>/dev/null)"
  pkill -f "gateway-port 50061"; sleep 3; }
for r in 1 2; do run /work/main new; run /tmp/b23/old old; done
