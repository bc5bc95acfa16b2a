#!/bin/bash
# issue 27 sitting: Tandem plain vs llama.cpp on the same file and threads with the default --activations
# (auto), beside the arithmetic auto did not choose; AVX-512 and the AVX2 path forced (llama.cpp's AVX2 build).
# Usage: versus.sh OUT_DIR [steps...]; a step is file:isa[:activations], file one of gemma, 1p5b, 3b, default;
# isa 'auto' leaves TANDEM_ISA unset (the kernels' own choice: avx512vnni here, the int8 x8 path picked by
# timing), any other forces that path (and turns the pick off).
cd /work/main; export HF_HUB_OFFLINE=1
OUT=${1:?out dir}; shift
mkdir -p $OUT
G=/root/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf
AVX2BIN=/root/.cache/tandem/llama.cpp-avx2/11434.0.0/bin
for step in "$@"; do
  IFS=: read t isa act <<< "$step"
  case $t in
    gemma) T=$G; D=suffix; sel="--limit-per-category 1 --max-tokens 128" ;;
    default) T=default; D=default; sel="--limit-per-category 1 --max-tokens 128" ;;
    1p5b|3b) T=/tmp/b37/r$t.gguf; D=suffix
       sel="--categories coding,writing,math_reasoning,extraction --limit-per-category 1 --max-tokens 64" ;;
  esac
  extra=""; [ "$isa" = avx2 ] && extra="--llama-bin-dir $AVX2BIN"
  [ -n "$act" ] && extra="$extra --activations $act"
  name=$t-$isa${act:+-$act}
  if [ "$isa" = auto ]; then unset TANDEM_ISA; else export TANDEM_ISA=$isa; fi
  .venv/bin/tandem bench --versus --target $T --drafter $D $sel --repeats 1 --verifier-threads 2 \
    --llama-bench-runs 4 --questions /work/shared/data/spec_bench/question.jsonl $extra --out $OUT/$name \
    --no-progress > $OUT/$name.log 2>&1
  echo "$step done rc=$? $(date +%T)"
done
