#!/bin/bash
cd /work/main && source .venv/bin/activate && export HF_HUB_OFFLINE=1
for r in 1 2; do for m in 16 8; do
  echo "== mix $m round $r $(date -u +%H:%M:%S)"
  TANDEM_PREFILL_MIX_ROWS=$m tandem bench --concurrency 1,4 --concurrency-requests 6 --concurrency-rounds 3 --no-llama --no-auto --activations int8 --max-tokens 96 --verifier-threads 2 --out /tmp/b22/mix-$m-$r > /tmp/b22/mix-$m-$r.log 2>&1; echo "rc $?"
done; done
echo "== done $(date -u +%H:%M:%S)"
