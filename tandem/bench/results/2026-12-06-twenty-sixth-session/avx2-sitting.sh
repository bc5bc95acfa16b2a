#!/bin/bash
# Default target, fp32, Tandem's AVX2 path forced against llama.cpp built for AVX2: the fp32-scale copies, the commit before, again.
source /work/main/.venv/bin/activate && export HF_HUB_OFFLINE=1
AVX2=$(ls -d ~/.cache/tandem/llama.cpp-avx2/*/bin | head -1)
Q=/work/shared/data/spec_bench/question.jsonl
run() { name=$1; dir=$2; echo "== $name $(date -u +%H:%M:%S)"; (cd $dir && TANDEM_ISA=avx2 python -m tandem.cli bench --versus --questions $Q --verifier-threads 2 --llama-bin-dir $AVX2 --limit-per-category 1 --max-tokens 128 --repeats 1 --llama-bench-runs 4 --out /tmp/b26/out/$name > /tmp/b26/$name.log 2>&1); echo "rc $?"; }
run avx2-scaled /work/main
run avx2-before /tmp/base
run avx2-scaled-again /work/main
echo "== done $(date -u +%H:%M:%S)"
