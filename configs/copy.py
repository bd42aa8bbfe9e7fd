r"""Copy with a rotary-position decoder that has MLPs (not attention-only).

  python -m experiments.train --config=configs/copy.py --workdir=runs/copy

Under a minute on 2 CPU cores. The model reads `x_1..x_n SEP` and must
emit `x_1..x_n`: each output attends exactly n + 1 positions back, an
offset that rotary positions express directly. The eval accuracy on the
copied half should approach 1 (chance is 1/13). `:smoke` (see
configs/default.py) trains one 16-wide layer of 4 heads for 6 steps.
"""

from configs import default


def shrink(c) -> None:
  """Smoke sizes: copies of 4 symbols, one layer of 4 heads of width 4."""
  default.shrink(c)
  c.task.seq_len = 8
  c.model.update(num_layers=1, num_heads=4)


def get_config(arg=None):
  smoke = default.is_smoke(arg, "configs/copy.py")
  c = default.get_config()
  c.task.name = "copy"
  c.task.seq_len = 16  # copies of 8 symbols
  c.model.attention_only = False
  c.model.positions = "rotary"
  c.model.num_layers = 2
  c.model.num_heads = 4
  c.train.num_steps = 300
  c.train.eval_every = 100
  c.train.checkpoint_every = 100
  if smoke:
    shrink(c)
  return c
