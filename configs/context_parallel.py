r"""Context parallelism on 8 simulated CPU devices: memory per device, and
the longest sequence this machine trains through one attention layer.

  .venv/bin/python -m experiments.context_parallel --workdir=runs/context_parallel

About 4 minutes on 2 idle CPU cores (230 s measured; 19 min on loaded ones),
nearly all of it the long run (skip it with
--config.experiment.long_len=0). Two measurements:
  * memory: XLA's memory analysis of the compiled forward+backward of
    causal attention at `memory_len` tokens, on one device (the blockwise
    kernel) and per device of the ring on a sequence axis of `devices`;
    the ring's per-device peak should be far below 1/4 of one device's.
  * long run: forward+backward of causal ring attention at `long_len`
    tokens, timed once, with each device's compiled memory and the
    process's peak resident memory (simulated devices share this
    machine's memory, so the total is what the machine must hold).
`:smoke`: 256 and 512 tokens, seconds.
"""

import ml_collections

from configs import default


def get_config(arg=None) -> ml_collections.ConfigDict:
  smoke = default.is_smoke(arg, "configs/context_parallel.py")
  c = ml_collections.ConfigDict()
  c.experiment = e = ml_collections.ConfigDict()
  e.devices = 8  # size of the sequence axis (simulated CPU devices)
  e.layout = "zigzag"  # the ring's layout (causal load balance)
  e.memory_len = 65536  # tokens of the memory comparison
  e.memory_heads = 8  # H = K of the memory comparison
  e.memory_head_dim = 64  # Dh of the memory comparison
  e.long_len = 262144  # tokens of the long run; 0 skips it
  e.long_heads = 1  # H = K of the long run (its time is n^2 H Dh)
  e.long_head_dim = 32  # Dh of the long run
  e.block = 512  # kernel block, forward and backward
  if smoke:
    e.memory_len, e.long_len, e.block = 256, 512, 16
  return c
