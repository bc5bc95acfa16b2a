#!/usr/bin/env bash
# A drafter for a target in one command: training prompts -> the target's greedy answers (its top-k kept)
# -> distillation -> ONNX export -> acceptance on held-out Spec-Bench prompts. Every stage keeps its output
# in $WORK and is skipped when that output exists, so an interrupted run continues where it stopped.
#
#   bash deploy/distill.sh                          # defaults: the default target, sized for a CUDA GPU
#   SCALE=0.1 TANDEM_DEVICE=cpu bash deploy/distill.sh     # ~1/10 of the data, on the CPU (hours)
#   NAME=my-drafter TARGET=path/to/model bash deploy/distill.sh --layers 4 --hidden 384   # args go to distill
#
# Settings (environment): TARGET (default: default), NAME (my-drafter), WORK (.distill_work/$NAME),
# OUT (drafters/$NAME), TANDEM_DEVICE (auto: a CUDA GPU when torch sees one), SCALE (1: how many prompts:
# at 1, ~48 500 requests to the target, of which it completes about two thirds, plus 2 000 document and
# 1 000 code tasks), ANSWER_TOKENS (256), STEPS (30000), TIME_BUDGET (minutes of training, 0 = by steps),
# QUANTIZE (int8), PROMPTS (a JSONL of prompts to use instead of writing them), EVAL (1; 0 skips the
# held-out evaluation), PY (.venv/bin/python). Arguments after the script name go to `tandem distill`
# (default student: 3 layers, hidden 384, draft vocabulary 8192).
# On a GPU, `answers` batches up to 512 prompts; a 135M target answers ~10^4 tokens/s or more there.
# Paths are taken relative to the current directory.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
TARGET=${TARGET:-default}
NAME=${NAME:-my-drafter}
WORK=${WORK:-.distill_work/$NAME}
OUT=${OUT:-drafters/$NAME}
export TANDEM_DEVICE=${TANDEM_DEVICE:-auto}
SCALE=${SCALE:-1}
ANSWER_TOKENS=${ANSWER_TOKENS:-256}
STEPS=${STEPS:-30000}
TIME_BUDGET=${TIME_BUDGET:-0}
QUANTIZE=${QUANTIZE:-int8}
EVAL=${EVAL:-1}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p "$WORK"
scaled() { "$PY" -c "import sys; print(max(1, round(float(sys.argv[1]) * float(sys.argv[2]))))" "$1" "$SCALE"; }
on_gpu=$("$PY" -c "from tandem.models import resolve_device; print(int(resolve_device('$TANDEM_DEVICE') != 'cpu'))")
if [ "$on_gpu" = 1 ]; then GEN_BATCH=512; ANS_BATCH=512; BATCH_TOKENS=1000000; else GEN_BATCH=64; ANS_BATCH=96; BATCH_TOKENS=32768; fi
stage() { echo "[distill.sh] $(date -u +%H:%M:%S) $*" >&2; }

# 1. prompts (never a held-out Spec-Bench question)
PROMPT_FILE=${PROMPTS:-$WORK/prompts.jsonl}
if [ ! -s "$PROMPT_FILE" ]; then
  stage "prompts -> $PROMPT_FILE"
  "$PY" -m tandem.distill.prompts --out "$PROMPT_FILE" --target "$TARGET" --device "$TANDEM_DEVICE" \
    --per-seed "$(scaled 200)" --per-kind "$(scaled 1500)" --german "$(scaled 5000)" \
    --docs "$(scaled 2000)" --code "$(scaled 1000)" --batch-size "$GEN_BATCH"
fi

# 2. the target's greedy answers with its top-k (answers_NNN.pt; resumes at the first missing shard)
if [ ! -e "$WORK/answers/done" ]; then
  stage "answers -> $WORK/answers"
  "$PY" -m tandem.distill.answers --prompts "$PROMPT_FILE" --out-dir "$WORK/answers" --target "$TARGET" \
    --device "$TANDEM_DEVICE" --max-new-tokens "$ANSWER_TOKENS" --max-batch "$ANS_BATCH" \
    --batch-tokens "$BATCH_TOKENS" --shard-size 2048
  touch "$WORK/answers/done"
fi

# 3. distillation and export (resumes from the checkpoint in $WORK/train)
if [ ! -s "$OUT/model.onnx" ]; then
  stage "distill -> $OUT"
  resume=(); [ -e "$WORK/train/ckpt.pt" ] && resume=(--resume)
  "$PY" -m tandem.cli distill --target "$TARGET" --out "$OUT" --work-dir "$WORK/train" \
    --teacher-shards "$WORK/answers/answers_*.pt" --steps "$STEPS" --time-budget "$TIME_BUDGET" \
    --layers 3 --hidden 384 --draft-vocab 8192 --export --quantize "$QUANTIZE" "${resume[@]}" "$@"
fi

# 4. held-out acceptance (greedy, k = 4, 128 tokens; the references are the target's own greedy answers)
if [ "$EVAL" = 1 ] && [ ! -s "$OUT/eval.json" ]; then
  stage "held-out acceptance -> $OUT/eval.json"
  [ -s "$WORK/heldout_refs.jsonl" ] || "$PY" -m tandem.distill.evaluate refs --target "$TARGET" \
    --device "$TANDEM_DEVICE" --out "$WORK/heldout_refs.jsonl"
  "$PY" -m tandem.distill.evaluate run --target "$TARGET" --refs "$WORK/heldout_refs.jsonl" \
    --onnx "$OUT/model.onnx" --served --k 4 --out "$OUT/eval.json"
fi
stage "done: $OUT (model card: $OUT/README.md)"
