r"""Side-by-side benchmark: mha_jax's paths against the libraries.

  python -m experiments.benchmark --workdir=runs/benchmark
  python -m experiments.benchmark --workdir=runs/benchmark_long \
      --config.sets=long --config.long_n=32768 --config.long_fwd_n=65536 \
      --config.repeats=1 --config.warmup=0 --config.paths=flash

About 5 minutes on 2 idle cores with the defaults. Shape sets: "standard"
and "bf16" time `shape` in float32 and bfloat16 (forward and
forward+backward, not causal); "long" times B=1, D and h of `long_shape` at
every n of `long_n`, causal and not, plus forward-only causal runs at every
n of `long_fwd_n`; "window" times a causal sliding window of `window`
keys at every n of `window_n` (B, D and h of `long_shape`); "train_step"
times whole training steps of the `train_step` specs against PyTorch and
TransformerLens (about 100 s for the two default shapes). `:smoke` times
two paths on one tiny shape and one tiny training step (seconds).
"""

import ml_collections

from configs import default


def get_config(arg=None) -> ml_collections.ConfigDict:
  smoke = default.is_smoke(arg, "configs/benchmark.py")
  c = ml_collections.ConfigDict()
  c.smoke = smoke  # a smoke report draws no conclusion
  # The report's file name in --workdir: table.md for a run of one's own
  # (the docs and the GPU check read that name); the runs committed under
  # docs/results/ write report.md, as every committed result does.
  c.report_name = "table.md"
  # Comma-separated names (a tuple of strings cannot be overridden from the
  # command line as "a,b").
  c.sets = "standard,bf16,long,train_step"  # shape sets, in this order
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
  # True (as the training loop does): every timing process keeps freed
  # host memory for reuse (mha_jax.training.host_memory), so XLA's scratch
  # stops page-faulting on every call; False: glibc's default, what a
  # script of its own gets unless it calls host_memory.keep_freed_memory.
  c.keep_freed_memory = True
  # The "train_step" set (experiments/benchmark/train_step.py): one whole
  # optimizer step of an experiment's model, mha_jax's paths against the
  # same model in PyTorch and TransformerLens, timed in interleaved rounds
  # in one process. A spec is an experiment config plus overrides of its
  # model and task fields.
  c.train_step = ml_collections.ConfigDict()
  ts = c.train_step
  # keys of `specs`, in this order; "random" is drawn from `random` below
  ts.shapes = "induction,text_size,random"
  ts.paths = ("einsum,vmap,flash,auto,torch,torch_compile,"
              "transformer_lens")
  ts.rounds = 10  # timed steps per path (medians and per-round ratios)
  ts.warmup = 3  # untimed steps per path after compiling
  # Each timed block of a path's consecutive steps lasts about this long
  # (after one untimed step); experiments/benchmark/train_step.py says why.
  ts.min_block_s = 0.1
  # The roofline's yardstick: a plain float32 matmul of this size, timed
  # in the same rounds as the steps (a step's matmul FLOPs per second over
  # its FLOPs per second is the fraction of the rate a step reaches).
  ts.matmul_n = 1024
  # mha_jax's paths train on a data mesh of this many devices (the
  # training loop's own sharded step, the batch split over them). On a
  # CPU, > 1 means host devices: XLA runs each batched attention product
  # on one thread and a program's operations one after another, so a
  # second device's program is what keeps a second core busy (docs/
  # performance.md). The benchmark then starts itself again with
  # XLA_FLAGS=--xla_force_host_platform_device_count=<this>; every other
  # set of the same run sees those devices too. The peers are unchanged.
  ts.host_devices = 1
  ts.specs = ml_collections.ConfigDict(dict(
      # Experiment 1's model as it trains (L2 H4 D64 T32 B64 V32).
      induction=dict(config="induction", model={}, task={}),
      # The real-text experiment's default model (L2 H4 D64 T256 B8).
      text=dict(config="text", model={}, task={}),
      # The text task at a size where the step is matmul-bound.
      text_size=dict(config="text",
                     model=dict(num_layers=4, num_heads=8, d_model=256),
                     task=dict(batch_size=16)),
      # Experiment 1's smoke model: the smoke run's one step (seconds).
      tiny=dict(config="induction:smoke", model={}, task={}),
  ))
  # The "random" shape: the text task's model at sizes drawn afresh each
  # run (each field uniform over its choices), so that a speed-up tuned to
  # the named shapes shows whether it holds between them. seed -1 draws
  # the seed itself from the operating system; the row records it and the
  # sizes drawn, so any run can be repeated with --config.train_step.
  # random.seed=<its seed>.
  ts.random = ml_collections.ConfigDict(dict(
      seed=-1, config="text", num_layers=(2, 3, 4), num_heads=(2, 4, 8),
      head_dim=(16, 32, 64), seq_len=(64, 128, 256), batch_size=(4, 8, 16)))
  if smoke:
    c.sets = "standard,train_step"
    c.shape.update(B=1, n=32, D=16, h=2)
    c.paths = "einsum,jax.nn"
    c.update(repeats=1, warmup=0, matmul_n=64, timeout_s=300)
    ts.update(shapes="tiny", paths="einsum,torch", rounds=2, warmup=1,
              matmul_n=64)
  return c
