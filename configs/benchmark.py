r"""Side-by-side attention benchmark: mha_jax's paths against the libraries.

  python -m experiments.benchmark --workdir=runs/benchmark
  python -m experiments.benchmark --workdir=runs/benchmark_long \
      --config.sets=long --config.long_n=32768 --config.long_fwd_n=65536 \
      --config.repeats=1 --config.warmup=0 --config.paths=flash

About 5 minutes on 2 idle cores with the defaults. Shape sets: "standard"
and "bf16" time `shape` in float32 and bfloat16 (forward and
forward+backward, not causal); "long" times B=1, D and h of `long_shape` at
every n of `long_n`, causal and not, plus forward-only causal runs at every
n of `long_fwd_n`; "window" times a causal sliding window of `window`
keys at every n of `window_n` (B, D and h of `long_shape`). `:smoke`
times two paths on one tiny shape (seconds).
"""

import ml_collections

from configs import default


def get_config(arg=None) -> ml_collections.ConfigDict:
  smoke = default.is_smoke(arg, "configs/benchmark.py")
  c = ml_collections.ConfigDict()
  c.smoke = smoke  # a smoke report draws no conclusion
  # Comma-separated names (a tuple of strings cannot be overridden from the
  # command line as "a,b").
  c.sets = "standard,bf16,long"  # shape sets to run, in this order
  c.shape = ml_collections.ConfigDict(dict(B=8, n=512, D=256, h=8))
  c.long_shape = ml_collections.ConfigDict(dict(B=1, D=512, h=8))
  c.long_n = (2048,)  # "long": causal and not, fwd and fwd+bwd
  c.long_dtypes = "float32"  # "long": comma-separated dtypes to time
  c.long_fwd_n = ()  # "long": forward-only causal lengths (none)
  # "window" (not in the default sets: --config.sets=window): causal
  # sliding window of `window` keys back at every n of `window_n`.
  c.window = 512
  c.window_n = (1024, 16384)
  # Paths to time, comma-separated; empty: all of them. Ours: default, vmap,
  # einsum, flash, xla, cudnn, auto; the anchors that ratios divide by (the
  # fastest anchor of a shape is 1x): flax.linen, flax.nnx, jax.nn,
  # jax.nn.cudnn, torch. cudnn paths run only on a GPU (skipped elsewhere).
  c.paths = ""
  c.repeats = 3  # timed calls per figure (the median is reported)
  c.warmup = 1  # untimed calls after compiling
  # Skip paths that materialise the [B, H, n, n] float32 scores when these
  # alone would exceed this many GiB.
  c.max_score_gib = 1.0
  c.matmul_n = 2048  # the n x n x n matmul whose GFLOP/s is the yardstick
  c.timeout_s = 3600  # per case (each runs in its own process)
  if smoke:
    c.sets = "standard"
    c.shape.update(B=1, n=32, D=16, h=2)
    c.paths = "einsum,jax.nn"
    c.update(repeats=1, warmup=0, matmul_n=64, timeout_s=300)
  return c
