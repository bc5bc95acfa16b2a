#!/bin/bash
cd /work/main && source .venv/bin/activate && export HF_HUB_OFFLINE=1
C=writing,roleplay,reasoning,math,coding,extraction,stem,humanities,translation,qa,math_reasoning
for r in 1 2; do for m in 16 8; do
  echo "== mix $m r $r $(date +%T)"
  TANDEM_PREFILL_MIX_ROWS=$m tandem bench --concurrency 1,4 --concurrency-requests 4 --concurrency-rounds 2 --no-llama --no-auto --max-tokens 96 --verifier-threads 2 --categories $C --out /tmp/b22/mf-$m-$r > /tmp/b22/mf-$m-$r.log 2>&1; echo "rc $?"
done; done
echo "== done $(date +%T)"
