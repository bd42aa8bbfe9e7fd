r"""Experiment 3: is there a head-width sweet spot?

  python -m experiments.head_dim --workdir=runs/head_dim

Part A: the two-offset retrieval task with one attention-only layer at
fixed d_model = 32 and learned absolute positions, h swept from 1 to 32
(d_k = 32 down to 1). One head cannot hold two positions. A 1-wide head
has scores q_t * k_s, a product of two scalars: for each query its argmax
is the visible key with the largest or the smallest k, so "one back" for
every t needs k to alternate with growing amplitude. Whether that makes
narrow heads worse at a plateau, or only slower to train, is the question:
every setting trains 2000 steps at its own learning rate (the best of
`experiment.learning_rates` on a selection seed that is not reported), a
run twice as long checks the plateau, and the report plots NMSE against
steps. (At 400 steps and one rate, 1e-2, d_k = 1 had NMSE 0.385: that was
a run stopped early, not a limit.)
Part B: fit W_q, W_k of width d_k so that softmax(X W_q W_k^T X^T / sqrt d_k)
matches a random n x n attention matrix; the error should vanish near
d_k = n - 1 (a softmax ignores one constant per row).
The measured wall time is in docs/experiments.md.
`:smoke`: h = 1, 2 at d_model 8, one learning rate, 2 seeds, and 3x3 fits
of 20 steps, seconds.
"""

import ml_collections

from configs import default
from configs import two_offsets


def get_config(arg=None):
  smoke = default.is_smoke(arg, "configs/head_dim.py")
  c = two_offsets.get_config()
  c.model.d_model = 32
  c.task.name = "two_offset_continuous"
  # d_k = 1 at its best rate (1e-2) reached NMSE ~0.003 by step 2000 of a
  # 3000-step run; the plateau check doubles this.
  c.train.num_steps = 2000
  c.train.eval_every = 100

  c.experiment = e = ml_collections.ConfigDict()
  e.heads = (1, 2, 4, 8, 16, 32)  # d_k = 32 / h
  e.seeds = (0, 1, 2)  # reported seeds
  e.learning_rates = (3e-3, 1e-2, 3e-2)  # chosen per setting on:
  e.selection_seed = 100
  e.plateau_factor = 2  # the selection seed retrained this many x longer
  e.nmse_threshold = 0.01  # report the first eval step below this NMSE
  e.analysis_examples = 256
  e.fit_n = 8  # part B: n x n target attention
  e.fit_d_model = 8  # rows of X are n random vectors in R^fit_d_model
  e.fit_steps = 3000  # Adam steps per fit
  e.fit_lr = 0.05
  e.fit_temperature = 2.0  # target = softmax(temperature * N(0, 1) logits)
  if smoke:
    two_offsets.shrink(c)
    e.update(fit_n=3, fit_d_model=3, fit_steps=20)
  return c
