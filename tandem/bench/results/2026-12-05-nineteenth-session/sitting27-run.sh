#!/bin/bash
# Issue 27's sitting: each file with Tandem's AVX-512 path against llama.cpp's native build, and with Tandem's AVX2
# path forced against llama.cpp's AVX2 build, back to back.
cd /work/main && source .venv/bin/activate && export HF_HUB_OFFLINE=1
NAT=~/.cache/tandem/llama.cpp/11434.0.0/bin; AVX2=~/.cache/tandem/llama.cpp-avx2/11434.0.0/bin
G=~/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf; B3=/tmp/b15/llama-3b-q4_k_m.gguf
run() { name=$1; isa=$2; bin=$3; shift 3; echo "== $name $(date -u +%H:%M:%S)"; 
  if [ "$isa" = native ]; then env -u TANDEM_ISA tandem bench --versus --verifier-threads 2 --llama-bin-dir $bin --out /tmp/b19/sit27/$name "$@" > /tmp/b19/sit27/$name.log 2>&1;
  else TANDEM_ISA=$isa tandem bench --versus --verifier-threads 2 --llama-bin-dir $bin --out /tmp/b19/sit27/$name "$@" > /tmp/b19/sit27/$name.log 2>&1; fi; echo "rc $?"; }
run default-native native $NAT --limit-per-category 1 --max-tokens 128 --repeats 1
run default-avx2 avx2 $AVX2 --limit-per-category 1 --max-tokens 128 --repeats 1
run gemma-native native $NAT --target $G --drafter suffix --limit-per-category 1 --max-tokens 128 --repeats 1
run gemma-avx2 avx2 $AVX2 --target $G --drafter suffix --limit-per-category 1 --max-tokens 128 --repeats 1
run 3b-native native $NAT --target $B3 --drafter suffix --activations int8 --categories writing,coding,qa,summarization --limit-per-category 1 --max-tokens 64 --repeats 2
run 3b-avx2 avx2 $AVX2 --target $B3 --drafter suffix --activations int8 --categories writing,coding,qa,summarization --limit-per-category 1 --max-tokens 64 --repeats 2
echo "== done $(date -u +%H:%M:%S)"
