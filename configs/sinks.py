r"""Attention sinks: where heads put attention they do not need.

  python -m experiments.sinks --workdir=runs/sinks

The 2-layer attention-only induction model of configs/induction.py (same
sizes, 800 steps), trained with and without a BOS token at position 0,
crossed with three attention rules: plain softmax, a learned sink logit
per head, and a soft cap on the logits; 3 seeds each, 18 runs. Measures
each head's share of attention on position 0, the learned sink's share,
the held-out loss and each head's zero-ablation effect, against uniform
causal attention and the untrained model. The measured wall time and the
result are in the report (and docs/variants.md).
`--config=configs/sinks.py:smoke`: the tiny induction model, 2 seeds.
"""

import ml_collections

from configs import default
from configs import induction


def get_config(arg=None):
  """configs/induction.py plus the experiment's settings."""
  smoke = default.is_smoke(arg, "configs/sinks.py")
  c = induction.get_config()
  c.experiment = e = ml_collections.ConfigDict()
  e.seeds = (0, 1, 2)  # training seeds per setting
  e.bos = (False, True)  # without / with a BOS token at position 0
  # Attention rules compared: plain | sinks (a learned logit per head) |
  # soft_cap (c tanh(s / c) with c = soft_cap below).
  e.variants = ("plain", "sinks", "soft_cap")
  # c of the soft_cap variant, chosen from the plain models' logits (the
  # report's logit table, layer 1 / layer 2): median |s| 2.3 / 3.5, 99th
  # percentile 6.9 / 13.0, median row maximum 4.1 / 9.1. c = 5 bends every
  # logit above 5 by more than a quarter (9% / 32% of them), so it binds
  # on the logits that make heads sharp, while a spread of 2c = 10 still
  # lets one key of 31 take 99.9% of a row.
  e.soft_cap = 5.0
  e.analysis_examples = 128  # held-out sequences per seed
  e.drop_level = 1.0  # the report gives the first eval step below this loss
  e.explorer = "sinks+BOS"  # setting whose first seed gets explorer.html
  if smoke:
    induction.shrink(c)
  return c
