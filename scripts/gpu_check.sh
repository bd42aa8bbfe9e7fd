#!/usr/bin/env bash
# `make gpu-check`: on a machine with a GPU, run the test suite there and the
# attend benchmark (every path against flax.linen, flax.nnx, jax.nn and
# jax.nn with cuDNN; the standard shape in float32 and bfloat16; long
# context at n = 8192 and 32768 in both), then write a dated table, with what `auto` chose for each shape
# and why, into docs/gpu.md. Installs nothing: it uses the Python given
# (PY, default .venv/bin/python), which must already have a JAX with CUDA.
#
# On a machine without a GPU it refuses, since CPU numbers in docs/gpu.md
# would be mistaken for GPU ones. GPU_CHECK_FORCE=1 runs a smoke version
# anyway (one test file, the benchmark's tiny :smoke shape) into
# runs/gpu_check/gpu.md, to check the script itself in seconds.
#
# Environment: PY, GPU_CHECK_FORCE=1, GPU_CHECK_OUT (the report; default
# docs/gpu.md, or runs/gpu_check/gpu.md when forced), GPU_CHECK_WORKDIR
# (benchmark outputs; default runs/gpu_check).
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PY:-.venv/bin/python}"
FORCE="${GPU_CHECK_FORCE:-0}"
WORK="${GPU_CHECK_WORKDIR:-runs/gpu_check}"
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

# 1. The test suite on the accelerator. One process: pytest-xdist workers
# would each grab most of the GPU's memory (JAX preallocates 75 %).
if [ "$smoke" = 1 ]; then tests=(tests/core/test_auto_select.py); else tests=(); fi
set +e
XLA_PYTHON_CLIENT_PREALLOCATE=false "$PY" -m pytest -q -p no:xdist \
    "${tests[@]}" 2>&1 | tee "$WORK/tests.log"
tests_rc=${PIPESTATUS[0]}
set -e
tests_summary="$(tail -n 1 "$WORK/tests.log")"

# 2. The attend benchmark (each case in its own process, one at a time).
bench() {  # bench NAME ARGS...: one benchmark run into $WORK/NAME
  local name="$1"; shift
  "$PY" -m experiments.benchmark --workdir="$WORK/$name" "$@"
}
if [ "$smoke" = 1 ]; then
  bench smoke --config=configs/benchmark.py:smoke
  runs=(smoke)
else
  bench standard --config.sets=standard,bf16
  bench long_8192 --config.sets=long --config.long_n=8192 \
      --config.long_dtypes=float32,bfloat16
  bench long_32768 --config.sets=long --config.long_n=32768 \
      --config.long_dtypes=float32,bfloat16 --config.repeats=1 \
      --config.warmup=0
  runs=(standard long_8192 long_32768)
fi

# 3. The dated report: device, tests, auto's choices, the tables.
{
  echo "# Attention on GPU"
  echo
  echo "Written by \`make gpu-check\` (scripts/gpu_check.sh) on $(date -u +%Y-%m-%d)."
  [ "$smoke" = 1 ] && echo "SMOKE RUN on $backend (GPU_CHECK_FORCE=1): tiny shapes, not GPU numbers." && echo
  "$PY" - <<'PYEOF'
import jax
import jax.numpy as jnp
import mha_jax
from configs import benchmark

d = jax.devices()[0]
print(f"Device: {getattr(d, 'device_kind', d.platform)} "
      f"(backend {jax.default_backend()}), jax {jax.__version__}.\n")
print("## What `auto` chose\n")
c = benchmark.get_config()
std, long = c.shape, c.long_shape
shapes = [("standard float32", std.B, std.n, std.D,
           std.h, jnp.float32, False),
          ("standard bfloat16", std.B, std.n, std.D, std.h, jnp.bfloat16,
           False)]
shapes += [(f"long causal n={n} {jnp.dtype(t).name}", long.B, n, long.D,
            long.h, t, True)
           for n in (8192, 32768) for t in (jnp.float32, jnp.bfloat16)]
for name, b, n, dm, h, dtype, causal in shapes:
  q = jax.ShapeDtypeStruct((b, n, h, dm // h), dtype)
  print(f"- {name}: `{mha_jax.explain_auto(q, q, is_causal=causal)}`"
        .replace("\n", "; "))
print()
PYEOF
  echo "## Tests"
  echo
  echo "pytest (exit $tests_rc): $tests_summary"
  echo
  for r in "${runs[@]}"; do
    echo "## Benchmark: $r"
    echo
    cat "$WORK/$r/table.md"
    echo
  done
} > "$OUT"
echo "gpu-check: wrote $OUT"
exit "$tests_rc"
