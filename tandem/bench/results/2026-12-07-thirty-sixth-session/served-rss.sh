#!/bin/bash
cd /work/main
export HF_HUB_OFFLINE=1
G=/root/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf
for T in default $G; do
  n=$(basename $T .gguf)
  .venv/bin/tandem bench --target $T --drafter $([ $T = default ] && echo default || echo suffix) --separate-verifier \
    --limit-per-category 1 --max-tokens 128 --k-sweep 2 --adaptive-k 0 --hf-drafter none --no-hf --no-llama \
    --verifier-threads 2 --repeats 1 --time-budget 0 --questions /work/shared/data/spec_bench/question.jsonl \
    --out /tmp/b36/rss/$n-$TAG > /tmp/b36/rss/$n-$TAG.log 2>&1
done
