#!/bin/bash
G=~/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf
export HF_HUB_OFFLINE=1
for step in base:1 new:3 base:2; do
  v=${step%%:*}; round=${step##*:}
  d=/work/main; [ $v = base ] && d=/tmp/base
  cd $d && /work/main/.venv/bin/python -m tandem.cli bench --versus --target $G --drafter suffix --limit-per-category 1 \
    --max-tokens 128 --repeats 1 --verifier-threads 2 --llama-bench-runs 4 --questions /work/shared/data/spec_bench/question.jsonl \
    --out /tmp/ab/$v-$round --no-progress > /tmp/ab/$v-$round.log 2>&1
  echo "$v $round done $(date +%T)"
done
