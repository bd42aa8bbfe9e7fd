r"""Behaviour study: MHA, GQA and MQA decoders trained on the same task.

  python -m experiments.kv_behaviour --workdir=runs/kv_behaviour
  python -m experiments.kv_cache --workdir=runs/kv_cache \
      --behaviour_results=runs/kv_behaviour/results.json

Trains the 2-layer attention-only induction decoder of configs/induction.py
with H = 8 query heads and K = 8 (MHA), 4 and 2 (GQA) or 1 (MQA) key/value
heads, 3 seeds each, the same steps and data; then scores each model's
free-running continuations (KV-cache generation) of held-out repeats.
About 12 x 25 s of training on 2 CPU cores. What it shows: at 800 steps the
variants differ mostly in WHEN the induction phase change happens (K <= 2 had
not reached loss 1 in any seed). With --config.train.num_steps=2400 all
learn it: K = 4 matches MHA, K = 2 is slightly worse and MQA (K = 1) clearly
worse (eval loss 0.184, 0.182, 0.212, 0.330; README, "Behaviour").
`:smoke`: the tiny induction model (configs/induction.py) with H = 2 and
K = 2 or 1, 2 seeds each.
"""

import ml_collections

from configs import default
from configs import induction


def get_config(arg=None):
  smoke = default.is_smoke(arg, "configs/kv_behaviour.py")
  c = induction.get_config()
  c.model.num_heads = 8  # H; Dh = 64 / 8 = 8 for every variant
  c.model.num_kv_heads = 8  # overridden per variant by experiment.kv_heads
  c.train.eval_every = 50  # fine enough to time when the loss drops

  c.experiment = e = ml_collections.ConfigDict()
  e.kv_heads = (8, 4, 2, 1)  # K per variant: MHA, GQA H/2, GQA H/4, MQA
  e.seeds = (0, 1, 2)  # training seeds per variant
  e.loss_threshold = 1.0  # report the first eval step below this loss
  e.generate_examples = 256  # held-out prompts for cached generation
  if smoke:
    default.shrink(c)
    c.model.num_kv_heads = c.model.num_heads
    e.update(kv_heads=(c.model.num_heads, 1), seeds=(0, 1),
             generate_examples=c.task.batch_size)
  return c
