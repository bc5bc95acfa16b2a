#!/bin/bash
# Issue 27's AVX2 rows, each request paired with the llama-bench runs around it.
cd /work/main && source .venv/bin/activate && export HF_HUB_OFFLINE=1
AVX2=~/.cache/tandem/llama.cpp-avx2/11434.0.0/bin
B3=/tmp/b15/llama-3b-q4_k_m.gguf
mkdir -p /tmp/b20/sit27
run() { name=$1; shift; echo "== $name $(date -u +%H:%M:%S)";
  TANDEM_ISA=avx2 tandem bench --versus --verifier-threads 2 --llama-bin-dir $AVX2 --out /tmp/b20/sit27/$name "$@" > /tmp/b20/sit27/$name.log 2>&1; echo "rc $?"; }
run 3b-avx2 --target $B3 --drafter suffix --activations int8 --categories writing,coding,qa,summarization --limit-per-category 1 --max-tokens 64 --repeats 2 --llama-bench-runs 9
run default-avx2 --limit-per-category 1 --max-tokens 128 --repeats 1 --llama-bench-runs 14
echo "== done $(date -u +%H:%M:%S)"
