#!/usr/bin/env bash
# The x8 GEMM picked by timing (a3bb216) against the flags' choice (TANDEM_ISA=avx512vnni, the path every
# int8 x8 call took before), AMD EPYC family 25 model 17 (Zen 4), 2 CPUs, twenty-fifth session.
set -euo pipefail
F=${F:-/tmp/llama-3b-q4_k_m.gguf}          # python -m tandem.bench.random_gguf --params 3b --out $F
LB=$(ls -d ~/.cache/tandem/llama.cpp/*/bin)/llama-bench   # python -m tandem.bench.llama_tools build
for i in 1 2; do
  for isa in "" avx512vnni; do
    echo "== TANDEM_ISA=$isa default"
    TANDEM_ISA=$isa python -m tandem.bench.forward_costs --threads 2 --widths 1,2,4,8 --repeats 9 --context 100 \
      --activations int8 | grep -E "^\| *[0-9]+ \||x8 GEMM"
  done
done
for i in 1 2; do
  $LB -m $F -t 2 -p 0 -n 32 -r 2 -o md | grep tg
  for isa in "" avx512vnni; do
    echo "== TANDEM_ISA=$isa 3 B"
    TANDEM_ISA=$isa python -m tandem.bench.forward_costs --target $F --threads 2 --widths 1,2,4 --repeats 5 \
      --context 100 --activations int8 | grep -E "^\| *[0-9]+ \||x8 GEMM"
  done
done
# end to end, one sitting each (versus-*.md)
for isa in "" avx512vnni; do
  name=$([ -z "$isa" ] && echo picked || echo forced)
  TANDEM_ISA=$isa tandem bench --versus --target $F --drafter suffix --activations int8 \
    --categories writing,coding,qa,summarization --limit-per-category 1 --max-tokens 64 --repeats 1 \
    --verifier-threads 2 --llama-bench-runs 5 --out bench_out/3b-$name
done
for isa in "" avx512vnni; do
  name=$([ -z "$isa" ] && echo picked || echo forced)
  TANDEM_ISA=$isa tandem bench --versus --activations int8 --limit-per-category 1 --max-tokens 128 --repeats 1 \
    --verifier-threads 2 --llama-bench-runs 4 --out bench_out/default-int8-$name
done
