r"""Experiment 4: cross-attention learns the alignment of sequence reversal.

  python -m experiments.cross_attention --workdir=runs/cross_attention

A few minutes on 2 CPU cores. A tiny encoder-decoder reverses sequences of
random length; decoder step t must read source position len - 1 - t, so
the cross-attention heatmaps should show the anti-diagonal. The report
gives each cross-attention head's alignment accuracy (argmax on the right
source token) and its ablation effect. `:smoke`: one seed of a 1-layer,
2-head model on sources of 2-6 tokens, seconds.
"""

import ml_collections

from configs import default


def get_config(arg=None):
  smoke = default.is_smoke(arg, "configs/cross_attention.py")
  c = default.get_config()
  c.task.name = "reverse"
  c.task.seq_len = 12  # longest source; lengths vary in [min_len, seq_len]
  c.task.min_len = 4
  c.task.vocab_size = 16  # 13 symbols
  c.task.batch_size = 64
  c.model.num_layers = 2
  c.model.num_heads = 4
  c.model.d_model = 64
  c.model.attention_only = False  # MLPs help the decoder track its position
  c.model.positions = "learned"
  c.train.num_steps = 800
  c.train.eval_every = 100
  c.train.log_every = 100
  c.train.checkpoint_every = 100000  # only the final checkpoint

  c.experiment = e = ml_collections.ConfigDict()
  e.seeds = (0, 1, 2)
  e.analysis_examples = 256
  if smoke:
    default.shrink(c)
    c.task.update(seq_len=6, min_len=2)
    c.model.num_layers = 1
    e.update(seeds=(0,), analysis_examples=c.task.batch_size)
  return c
