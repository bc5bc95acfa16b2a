#!/bin/bash
# Gemma 3 270M plain decoding on the long Spec-Bench prompts (summarization, RAG), this commit against
# 33ebcdc (a worktree), alternated: tandem bench --versus, 2 prompts a category x 128 tokens.
set -e
G=~/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf
Q=/work/shared/data/spec_bench/question.jsonl
source /work/main/.venv/bin/activate
export HF_HUB_OFFLINE=1
for rep in 1 2; do
  for w in /tmp/base /work/main; do
    name=$( [ $w = /tmp/base ] && echo before || echo after )
    echo "== $name rep $rep $(date -u +%T)"
    (cd $w && timeout 600 python -m tandem.cli bench --versus --target $G --drafter suffix --questions $Q \
       --categories summarization,rag --limit-per-category 2 --max-tokens 128 --repeats 1 --verifier-threads 2 \
       --llama-bench-runs 5 --out /tmp/b27/long-$name-$rep > /dev/null 2>&1)
    grep -E "^\| (tandem-(http|grpc)-plain|llama-server) " /tmp/b27/long-$name-$rep/report.md | cut -d'|' -f2-9
    grep -E "^\| tandem-grpc-plain \| [0-9]+ \| 1\.00" /tmp/b27/long-$name-$rep/report.md | cut -d'|' -f2-7 || true
  done
done
