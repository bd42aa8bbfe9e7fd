r"""User rules on long sequences: block skipping against no skipping, dense
einsum and PyTorch's FlexAttention, on the CPU.

  nice .venv/bin/python -m experiments.score_rules_bench \
      --workdir=docs/results/score_rules_bench
  .venv/bin/python -m experiments.score_rules_bench \
      --config=configs/score_rules_bench.py:smoke --workdir=runs/srb_smoke

Two causal rules, each at every length of `sizes`: 8 packed documents and
a 512-token sliding window. The committed run took 88 s (the report's
own time, torch's compiles included) on 2 quiet cores (196 s at load 9
for an earlier version with fewer calls); the run with the roofline
beside it (docs/results/score_rules_bench/epyc_roofline), 130 s on a CPU
with half the matmul rate;
the smoke run takes seconds (no torch).
"""

import ml_collections

from configs import default


def get_config(arg=None) -> ml_collections.ConfigDict:
  smoke = default.is_smoke(arg, "configs/score_rules_bench.py")
  c = ml_collections.ConfigDict()
  c.smoke = smoke
  c.sizes = (8192, 32768)  # sequence lengths n (Tq = Tk = n)
  c.batch = 1  # B
  c.heads = 2  # H = K (one kv head per query head)
  c.head_dim = 64  # Dh
  c.documents = 8  # documents of equal length packed in one row
  c.window = 512  # keys a query sees: itself and the 511 before
  c.block = 512  # the block walk's blocks on CPU (and the block mask's)
  # A rule whose block mask on these blocks the kernel walks as spans
  # (`flash_schedule.span_plan`, a banded mask: the window) gets it on them.
  c.span_block = 128
  c.repeats = 5  # timed calls per path after one untimed call
  c.slow_s = 8.0  # a path whose first call takes longer is timed once
  # The dense path forms float32 [B, H, n, n] scores (and a mask of that
  # size); above this many score bytes it is not run.
  c.dense_max_bytes = 2 ** 31
  c.torch = True  # FlexAttention (torch.compile on CPU) beside JAX
  c.torch_threads = 2  # the cores this machine has
  # glibc keeps freed memory for reuse (`host_memory.keep_freed_memory`,
  # process-wide: FlexAttention's calls run with it too), as in the other
  # benchmarks; with glibc's default each call's fresh buffers page-fault
  # (the span walk at n = 32768: 72-79 ms against 64-65 ms with it).
  c.keep_freed_memory = True
  c.seed = 0
  # The roofline's yardstick, timed right before each path: a float32
  # [n, n] x [n, n] product, `yardstick_repeats` calls after an untimed
  # pause (torch's worker threads spin on after its calls).
  c.matmul_n = 1024
  c.yardstick_repeats = 10
  c.yardstick_pause_s = 0.5
  if smoke:
    c.sizes = (1024,)
    c.block = 128
    c.span_block = 64
    c.window = 128
    c.repeats = 2
    c.torch = False
    c.matmul_n, c.yardstick_repeats, c.yardstick_pause_s = 128, 2, 0.0
  return c
