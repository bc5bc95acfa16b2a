#!/bin/bash
source /work/main/.venv/bin/activate; export HF_HUB_OFFLINE=1
for r in 1 2; do for v in new old; do
  if [ $v = new ]; then cd /work/main; else cd /tmp/b22/old; fi
  echo "== $v $r $(date -u +%H:%M:%S)"
  python -m tandem.cli bench --categories summarization,rag,writing,coding --limit-per-category 3 --max-tokens 128 --k-sweep 2 --adaptive-k 0 --hf-drafter none --no-hf --no-llama --verifier-threads 2 --repeats 1 --time-budget 0 --questions /work/shared/data/spec_bench/question.jsonl --out /tmp/b22/ab-$v-$r > /tmp/b22/ab-$v-$r.log 2>&1
  echo "rc $?"
done; done
echo "== done $(date -u +%H:%M:%S)"
