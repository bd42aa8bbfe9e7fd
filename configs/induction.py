r"""Experiment 1: induction heads in a 2-layer attention-only decoder.

  python -m experiments.induction --workdir=runs/induction

3 seeds x 2 depths x 800 steps: 2 min 40 s of CPU time (measured; 7 min
wall on a machine shared 4 ways, so about 2-3 min on 2 idle cores). Shows the
loss phase change on repeated segments, a previous-token head in layer 1
and induction heads in layer 2 (by score), how the heads differ, a 1-layer
control that cannot do it, and the ablation effect of every head.
`--config=configs/induction.py:smoke`: two seeds of a tiny model, seconds.
"""

import ml_collections

from configs import default


def shrink(c) -> None:
  """Smoke sizes (configs/default.py `shrink`), two seeds, one batch."""
  default.shrink(c)
  # Two seeds, so a spread and an interval exist; held-out batches as
  # large as the training batch reuse its sampler.
  c.experiment.update(seeds=(0, 1), analysis_examples=c.task.batch_size)


def get_config(arg=None):
  """The default model with rotary positions and longer repeated segments."""
  smoke = default.is_smoke(arg, "configs/induction.py")
  c = default.get_config()
  c.model.num_layers = 2  # the 2-layer circuit: previous-token + induction
  c.model.num_heads = 4
  # Relative (rotary) positions make "attend one back" easy to express, so
  # the previous-token head forms within a few hundred steps on 2 cores.
  c.model.positions = "rotary"
  c.model.d_model = 64
  c.task.batch_size = 64  # at 32 some seeds had not formed heads by 800
  c.task.seq_len = 32
  c.task.vocab_size = 32  # 29 symbols: chance loss ln(29) = 3.37
  c.task.min_segment = 4  # segment lengths 4..12: more predictable targets
  c.task.max_segment = 12
  c.train.num_steps = 800
  c.train.learning_rate = 3e-3
  c.train.warmup_steps = 50
  c.train.eval_every = 50  # a fine loss curve to see the phase change
  c.train.log_every = 100
  c.train.checkpoint_every = 100000  # only the final checkpoint

  c.experiment = e = ml_collections.ConfigDict()
  e.seeds = (0, 1, 2)  # training seeds per depth
  e.control_layers = 1  # depth of the control model
  e.analysis_examples = 128  # held-out examples for the head metrics
  e.threshold = 0.5  # score above which a head is called prev-token/induction
  if smoke:
    shrink(c)
  return c
