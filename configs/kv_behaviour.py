r"""Behaviour study: MHA, GQA and MQA decoders trained on the same task.

  python -m experiments.kv_behaviour --workdir=runs/kv_behaviour
  python -m experiments.kv_cache --workdir=runs/kv_cache \
      --behaviour_results=runs/kv_behaviour/results.json

Trains the 2-layer attention-only induction decoder of configs/induction.py
with H = 8 query heads and K = 8 (MHA), 4 (GQA) or 1 (MQA) key/value heads,
5 seeds each, the same steps, data and learning-rate schedule; plus
MQA with its head width widened (Dh = 14 instead of 8) so that it has
nearly the parameter count of MHA (Shazeer 2019 matched by widening the
MLP; these models have none). One schedule for all: linear warmup, then a
CONSTANT rate (end_lr_fraction = 1), so the loss at an intermediate
evaluation of one run is what a shorter run with the same schedule would
have reached, and "when does the loss drop" does not depend on how long
the run is. Each run evaluates every 25 steps; the report shows the
per-seed step at which the eval loss first fell below 1.0 (a survival
curve over seeds), the loss at intermediate steps and at the end, and the
accuracy of free-running generation with the KV cache.
20 runs of 1000 steps (K = 2 is left out to keep the run near 15 minutes
on 2 shared cores: `--config.experiment.kv_heads=8,4,2,1` adds it); the
measured wall time is in docs/kv_cache.md.
`:smoke`: the tiny induction model (configs/induction.py) with H = 2: MHA
and the params-matched MQA, 2 seeds each.
"""

import ml_collections

from configs import default
from configs import induction


def get_config(arg=None):
  smoke = default.is_smoke(arg, "configs/kv_behaviour.py")
  c = induction.get_config()
  c.model.num_heads = 8  # H; Dh = 64 / 8 = 8 for every unmatched variant
  c.model.num_kv_heads = 8  # overridden per variant by experiment.kv_heads
  c.train.num_steps = 1000
  # Constant after warmup: the cosine of configs/default.py decays over
  # num_steps, so runs of different lengths would differ in schedule too.
  c.train.end_lr_fraction = 1.0
  c.train.eval_every = 25  # fine enough to time when the loss drops

  c.experiment = e = ml_collections.ConfigDict()
  e.kv_heads = (8, 4, 1)  # K per variant: MHA, GQA (H/2), MQA
  # K values also trained with Dh widened to match MHA's parameter count.
  e.matched_kv_heads = (1,)
  e.seeds = (0, 1, 2, 3, 4)  # training seeds per variant
  e.loss_threshold = 1.0  # time to drop: first eval step below this loss
  e.report_steps = (250, 500, 750, 1000)  # eval loss shown at these steps
  e.generate_examples = 256  # held-out prompts for cached generation
  if smoke:
    default.shrink(c)
    c.model.num_kv_heads = c.model.num_heads
    e.update(kv_heads=(c.model.num_heads,), matched_kv_heads=(1,),
             seeds=(0, 1),
             report_steps=(3, 6), generate_examples=c.task.batch_size)
  return c
