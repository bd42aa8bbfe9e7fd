r"""The source's cost claims, measured: time, FLOPs and memory vs h and vs n.

  python -m experiments.cost_scaling --workdir=runs/cost_scaling
  python -m experiments.cost_scaling --config.n=256,512,1024,2048,4096,8192

About 3 minutes on 2 cores with the defaults. The head sweep varies h at
fixed n = `head_n` and D = `d_model`; the length sweep varies n at
h = `length_heads`. `:smoke` measures two tiny sizes per sweep (seconds).
"""

import ml_collections

from configs import default


def get_config(arg=None) -> ml_collections.ConfigDict:
  smoke = default.is_smoke(arg, "configs/cost_scaling.py")
  c = ml_collections.ConfigDict()
  c.smoke = smoke  # a smoke report draws no conclusion
  c.heads = (1, 2, 4, 8, 16, 32, 64)  # head counts at fixed D (head sweep)
  c.head_n = 1024  # sequence length of the head sweep
  c.n = (256, 512, 1024, 2048, 4096)  # sequence lengths (length sweep)
  c.length_heads = 8  # h of the length sweep
  c.d_model = 512  # D of both sweeps
  c.batch = 1  # B
  c.paths = "einsum,flash"  # implementations measured, comma-separated
  c.repeats = 3  # timed calls per point (the median is reported)
  c.fit_points = 3  # largest-n points used for the slopes
  if smoke:
    c.update(heads=(1, 2), head_n=16, n=(16, 32), length_heads=2, d_model=16,
             repeats=1, fit_points=2)
  return c
