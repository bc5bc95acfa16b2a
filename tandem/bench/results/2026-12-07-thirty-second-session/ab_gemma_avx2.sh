#!/bin/bash
G=~/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf
export HF_HUB_OFFLINE=1 TANDEM_ISA=avx2
for step in new:1 base:1; do
  v=${step%%:*}; round=${step##*:}
  d=/work/main; [ $v = base ] && d=/tmp/base
  cd $d && /work/main/.venv/bin/python -m tandem.cli bench --versus --target $G --drafter suffix --limit-per-category 1 \
    --max-tokens 128 --repeats 1 --verifier-threads 2 --llama-bench-runs 4 --questions /work/shared/data/spec_bench/question.jsonl \
    --llama-bin-dir /root/.cache/tandem/llama.cpp-avx2/11434.0.0/bin --out /tmp/ab3/$v-$round --no-progress > /tmp/ab3/$v-$round.log 2>&1
  echo "$v $round done $(date +%T)"
done
