#!/bin/bash
# issue 27 sitting: Tandem plain vs llama.cpp on the same file and threads, AVX-512 and AVX2 forced
cd /work/main; export HF_HUB_OFFLINE=1
G=/root/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf
for step in gemma:avx512 gemma:avx2 default:avx512 default:avx2; do
  t=${step%%:*}; isa=${step##*:}
  T=$([ $t = gemma ] && echo $G || echo default); D=$([ $t = gemma ] && echo suffix || echo default)
  extra=""; [ $isa = avx2 ] && extra="--llama-bin-dir /root/.cache/tandem/llama.cpp-avx2/11434.0.0/bin"
  TANDEM_ISA=$isa .venv/bin/tandem bench --versus --target $T --drafter $D --limit-per-category 1 \
    --max-tokens 128 --repeats 1 --verifier-threads 2 --llama-bench-runs 4 --questions /work/shared/data/spec_bench/question.jsonl \
    $extra --out /tmp/b36/vs/$t-$isa --no-progress > /tmp/b36/vs/$t-$isa.log 2>&1
  echo "$step done $(date +%T)"
done
