r"""Experiment 6: the induction circuit, by patching, weights and training.

  python -m experiments.circuits --workdir=runs/circuits

Trains the 2-layer models of experiment 1 (`configs/induction.py`, its
seeds and two more; checkpointing does not change a run) with a
checkpoint at every evaluation, then measures each one on its own
held-out pairs under every corruption of `corruption.KINDS`: Q/K/V
composition scores against random matrices, path patching (single and
joint sets, the embedding as a sender) from every layer-1 head into every
layer-2 head's q, k and v, activation patching per head and per position
with attribution patching beside it, copying scores, direct logit
attribution, and the per-head scores at every checkpoint. 2 min 58 s
wall on 2 idle cores. Shows
which layer-1 head feeds the induction heads through which input, and
that the heads form at the loss drop.
`--config=configs/circuits.py:smoke`: two seeds of a tiny model.
"""

import ml_collections

from configs import default
from configs import induction


def get_config(arg=None):
  """Experiment 1's model and training, plus the circuit analysis."""
  smoke = default.is_smoke(arg, "configs/circuits.py")
  c = induction.get_config()
  c.experiment = e = ml_collections.ConfigDict()
  # Training seeds: experiment 1's three and two more, since three could
  # not tell the value path from zero (t interval about [-0.02, 0.60]).
  e.seeds = (0, 1, 2, 3, 4)
  e.analysis_examples = 128  # clean/corrupted pairs for per-head patching
  e.position_examples = 64  # pairs of the fixed layout (per-position)
  # The fixed layout of the per-position analysis: a segment of `segment`
  # tokens at `first` repeated at `second` (inside the task's support).
  e.segment = 8
  e.first = 6
  e.second = 18
  e.baseline_draws = 200  # random-matrix draws for the score baselines
  e.threshold = 0.5  # a score above which a head is said to have formed
  # Key of the held-out pairs (not a training key), folded with each
  # training seed: every seed is measured on its own draw.
  e.data_seed = 12345
  e.bootstrap_resamples = 1000  # over the examples, per seed
  # Experiment 1's workdir: when its runs exist, their eval curves are
  # compared with these runs' (they should be identical).
  e.induction_workdir = "runs/induction"  # "" skips the comparison
  if smoke:
    induction.shrink(c)
    e.seeds = (0, 1)  # two: every mean ± std is defined
    e.update(analysis_examples=8, position_examples=8, segment=3, first=1,
             second=6, baseline_draws=4, induction_workdir="",
             bootstrap_resamples=50)
  # A checkpoint at every evaluation, all kept: the training dynamics load
  # them (step 0 is the initial state, rebuilt from the seed).
  c.train.checkpoint_every = c.train.eval_every
  c.train.max_checkpoints = c.train.num_steps // c.train.eval_every + 1
  return c
