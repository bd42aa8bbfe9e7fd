#!/usr/bin/env bash
# `make gpu-check`: on a machine with a GPU, in about 8 minutes of wall time:
#
# 1. the whole `make test` suite on the GPU, in 8 pytest-xdist workers that
#    share it (XLA_PYTHON_CLIENT_PREALLOCATE=false, so that no worker takes
#    75 % of its memory), stopped at GPU_CHECK_SUITE_S seconds;
# 2. the attend benchmark (experiments.benchmark), cut to fit: the standard
#    shape in float32 and bfloat16 (auto, cudnn against flax.linen and
#    jax.nn with cuDNN) and long context at n = 32768 in bfloat16 (auto
#    against jax.nn with cuDNN), each run with a time limit; the long-context
#    search of step 3 covers every path from n = 8192 up;
# 3. experiments.gpu_bench (configs/gpu_bench.py) with the time left: the
#    training step against the same model in PyTorch (eager and
#    torch.compile) in exact float32, TF32 and bf16; SmolLM2-135M and
#    Gemma 3 270M (random weights from their configs) against transformers;
#    the longest causal bf16 sequence that trains per path; what the exact
#    float32 policy costs; the Pallas GPU kernel with user rules (causal,
#    8 documents, a 512-key window, prefix-LM, ALiBi; Dh 64 and 128,
#    n = 8192 and 32768, bf16, forward and forward + backward) against
#    cuDNN, FlexAttention under torch.compile (where torch has CUDA) and
#    the blockwise path, as far as its share of the budget goes;
# 4. docs/gpu.md (experiments/gpu_bench/page.py): the date, the device and
#    versions, the suite's summary and failures, what `auto` chose, every
#    table; gpu_bench's report.md and results.json also go to
#    docs/results/gpu_bench/.
# A stage that fails or runs out of time is recorded on the page and the
# next one still runs. Installs nothing: it uses the Python given (PY,
# default .venv/bin/python), which must already have a JAX with CUDA.
#
# On a machine without a GPU it refuses, since CPU numbers in docs/gpu.md
# would be mistaken for GPU ones. GPU_CHECK_FORCE=1 runs a smoke version
# anyway (one test file in 2 workers, the benchmarks' :smoke configs) into
# runs/gpu_check/gpu.md, never docs/, to check the script itself.
#
# Environment: PY, GPU_CHECK_FORCE=1, GPU_CHECK_OUT (the page; default
# docs/gpu.md, or runs/gpu_check/gpu.md when forced), GPU_CHECK_WORKDIR
# (everything else; default runs/gpu_check), GPU_CHECK_TOTAL_S (the whole
# check's target, 480), GPU_CHECK_SUITE_S (the suite's limit, 270).
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PY:-.venv/bin/python}"
FORCE="${GPU_CHECK_FORCE:-0}"
WORK="${GPU_CHECK_WORKDIR:-runs/gpu_check}"
TOTAL_S="${GPU_CHECK_TOTAL_S:-480}"
SUITE_S="${GPU_CHECK_SUITE_S:-270}"
if [ ! -x "$PY" ] && ! command -v "$PY" >/dev/null; then
  echo "gpu-check: no Python at PY=$PY (make install first, or set PY)" >&2
  exit 2
fi
backend="$("$PY" -c 'import jax; print(jax.default_backend())')"
smoke=0
if [ "$backend" != gpu ]; then
  if [ "$FORCE" != 1 ]; then
    echo "gpu-check: no GPU: jax.default_backend() is $backend." \
         "Run it where JAX sees a CUDA GPU; GPU_CHECK_FORCE=1 runs a smoke" \
         "version here instead (writes $WORK/gpu.md, not docs/)." >&2
    exit 2
  fi
  smoke=1
fi
if [ "$smoke" = 1 ]; then
  OUT="${GPU_CHECK_OUT:-$WORK/gpu.md}"
else
  OUT="${GPU_CHECK_OUT:-docs/gpu.md}"
fi
mkdir -p "$WORK"
# This script's outputs from an earlier check (nothing else in $WORK).
rm -rf "$WORK/stages.tsv" "$WORK/tests.log" "$WORK/smoke" "$WORK/standard" \
  "$WORK/long_32768" "$WORK/gpu_bench"
: > "$WORK/stages.tsv"
# JAX and torch share the device in every process below.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$SECONDS

stage() {  # stage NAME LIMIT_S CMD...: run CMD with a time limit, record it
  local name="$1" limit="$2"; shift 2
  local t0=$SECONDS rc=0
  echo "gpu-check: $name (limit ${limit} s)"
  timeout --signal=INT --kill-after=30 "$limit" "$@" || rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$limit" \
    >> "$WORK/stages.tsv"
  return 0
}

# 1. The test suite on the accelerator.
if [ "$smoke" = 1 ]; then
  tests=(tests/core/test_auto_select.py); workers=2
else
  tests=(); workers=8
fi
tests_command="pytest -q -n $workers ${tests[*]}"
stage tests "$SUITE_S" bash -c \
  '"$0" -m pytest -q -n "$1" "${@:2}" 2>&1 | tee -i "'"$WORK"'/tests.log"; exit "${PIPESTATUS[0]}"' \
  "$PY" "$workers" "${tests[@]}"
tests_rc=$(awk -F'\t' '$1 == "tests" {print $2}' "$WORK/stages.tsv")

# 2. The attend benchmark (each case in its own process, one at a time).
if [ "$smoke" = 1 ]; then
  attend_runs=(smoke)
  stage attend_smoke 300 "$PY" -m experiments.benchmark \
    --workdir="$WORK/smoke" --config=configs/benchmark.py:smoke
else
  attend_runs=(standard long_32768)
  stage attend_standard 90 "$PY" -m experiments.benchmark \
    --workdir="$WORK/standard" --config.sets=standard,bf16 \
    --config.paths=auto,cudnn,flax.linen,jax.nn.cudnn
  stage attend_long_32768 60 "$PY" -m experiments.benchmark \
    --workdir="$WORK/long_32768" --config.sets=long --config.long_n=32768 \
    --config.long_dtypes=bfloat16 --config.paths=auto,jax.nn.cudnn \
    --config.repeats=1 --config.warmup=0
fi

# 3. The GPU benchmark with the time left (20 s kept for the page; at
# least 90 s), stopped 60 s after its own budget at the latest.
left=$((TOTAL_S - (SECONDS - start) - 20))
[ "$left" -lt 90 ] && left=90
if [ "$smoke" = 1 ]; then
  stage gpu_bench 600 "$PY" -m experiments.gpu_bench \
    --config=configs/gpu_bench.py:smoke --workdir="$WORK/gpu_bench"
else
  stage gpu_bench "$((left + 60))" "$PY" -m experiments.gpu_bench \
    --config.budget_s="$left" --workdir="$WORK/gpu_bench"
fi

# 4. The page, from everything above.
smoke_flag=()
[ "$smoke" = 1 ] && smoke_flag=(--smoke)
"$PY" -m experiments.gpu_bench.page --work="$WORK" --out="$OUT" \
  --tests_command="$tests_command" \
  --attend_runs="$(IFS=,; echo "${attend_runs[*]}")" "${smoke_flag[@]}"
if [ "$smoke" = 0 ] && [ -f "$WORK/gpu_bench/results.json" ]; then
  rm -rf docs/results/gpu_bench && mkdir -p docs/results/gpu_bench
  cp "$WORK/gpu_bench/report.md" "$WORK/gpu_bench/results.json" \
    docs/results/gpu_bench/
fi
echo "gpu-check: $((SECONDS - start)) s in all"
exit "$tests_rc"
