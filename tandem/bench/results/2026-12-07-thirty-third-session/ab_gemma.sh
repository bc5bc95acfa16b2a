#!/bin/bash
# Gemma 3 270M through tandem bench --versus, this tree against the base worktree, alternated.
OUT=${1:-/tmp/abg33}; mkdir -p $OUT
G=$HOME/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf
run() {
  (cd $1 && HF_HUB_OFFLINE=1 /work/main/.venv/bin/python -m tandem.cli bench --versus --target $G --drafter suffix \
     --limit-per-category 1 --max-tokens 128 --repeats 1 --verifier-threads 2 --llama-bench-runs 4 \
     --questions /work/shared/data/spec_bench/question.jsonl --out $OUT/$2 --no-progress > $OUT/$2.log 2>&1)
  echo "$2 $(date -u +%H:%M):"; grep -E '^\| (llama-server|tandem-grpc-plain|tandem-grpc-auto) \|' $OUT/$2/report.md | cut -d'|' -f2-7
}
run /work/main new-1; run /tmp/base base-1
