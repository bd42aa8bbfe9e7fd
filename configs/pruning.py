r"""Experiment 5: prune the induction model's heads in order of importance.

  python -m experiments.pruning --workdir=runs/pruning

A few minutes on 2 CPU cores. Trains the 2-layer induction model of
`configs/induction.py` (5 seeds), ranks its heads on one held-out batch by
zero, mean and resample ablation, the gradient (Taylor) estimate and
Michel et al.'s expected |gradient| (one-shot and iterated), then removes
heads cumulatively (least important first) and measures the loss on
ANOTHER held-out batch. A good ranking keeps the loss flat until the few heads
that carry the circuit go; a random order is the baseline. `:smoke`: two
seeds of the tiny induction model (configs/induction.py), 2 random orders.
"""

import ml_collections

from configs import default
from configs import induction


def get_config(arg=None):
  smoke = default.is_smoke(arg, "configs/pruning.py")
  c = induction.get_config()
  c.train.eval_every = 100

  c.experiment = e = ml_collections.ConfigDict()
  e.seeds = (0, 1, 2, 3, 4)  # 5: an interval against random order
  e.analysis_examples = 128  # per batch: one to rank, one to measure
  e.random_orders = 5  # random pruning orders averaged for the baseline
  if smoke:
    induction.shrink(c)
    e.random_orders = 2
  return c
