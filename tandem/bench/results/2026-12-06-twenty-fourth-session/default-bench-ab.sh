#!/bin/bash
source /work/main/.venv/bin/activate; export HF_HUB_OFFLINE=1
for i in 1 2; do
  for v in new base; do
    d=/work/main; [ $v = base ] && d=/tmp/b24/base
    (cd $d && timeout 900 python -m tandem.cli bench --limit-per-category 1 --max-tokens 96 --k-sweep 2 --default-k 2 --adaptive-k 0 --hf-drafter none --no-hf --no-llama --verifier-threads 2 --repeats 1 --time-budget 0 --questions /work/shared/data/spec_bench/question.jsonl --out /tmp/b24/def-$v-$i > /tmp/b24/def-$v-$i.log 2>&1)
    grep -E "^\| (plain|\*\*auto|auto|k = 2)" /tmp/b24/def-$v-$i/report.md | head -3 | sed "s/^/$v $i /" | cut -c1-120
  done
done
