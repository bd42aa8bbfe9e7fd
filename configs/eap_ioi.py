r"""Automatic circuit discovery on the IOI task in SmolLM2-135M: edge
attribution patching (EAP and EAP-IG) over every edge of the graph, the
found circuits' faithfulness on held-out prompts, and the hand-built
circuit of the IOI experiment beside them.

  python -m experiments.eap_ioi --workdir=runs/eap_ioi

Reads SmolLM2-135M-Instruct from its GGUF wheel (a pre-norm decoder:
Gemma 3's sandwich norms are refused by `eap_graph`, so it is not run),
builds 128 IOI prompts with their ABC corruptions, splits them (seeded)
into 64 for scoring and 64 held out, scores all 70,651 edges by EAP and
EAP-IG (each compiled apart from its run) and draws the faithfulness
curves (corrupted and mean ablation) of the top-|score| circuits and of
random circuits of equal size, with bootstrap intervals over the
held-out prompts. Expect about 13 minutes on 2 quiet CPU cores (the
committed run: 12.5 min).
`--config=configs/eap_ioi.py:smoke`: a tiny random Llama with a
word-level tokenizer through the same code (seconds).
"""

import ml_collections

from configs import default


def get_config(arg=None):
  """The experiment's settings; nothing is trained."""
  smoke = default.is_smoke(arg, "configs/eap_ioi.py")
  c = ml_collections.ConfigDict()
  c.smoke = smoke  # a smoke report draws no conclusion
  c.experiment = e = ml_collections.ConfigDict()
  e.model = "smollm2"  # experiments.ioi.models name (pre-norm only)
  e.per_template_order = 8  # prompts: 8 templates x 2 orders x 8 = 128
  e.score_prompts = 64  # scored on these (the first of the seeded split)
  e.eval_prompts = 64  # the circuits' faithfulness on these (held out)
  e.seed = 0  # names drawn, the split, random circuits, bootstrap
  e.ig_steps = 5  # EAP-IG's points from the corrupted to the clean input
  # EAP-IG timed again on this many of the scoring prompts, to state how
  # its run time grows with the prompts (its scores are not used).
  e.timing_prompts = (32,)
  # Circuit sizes as fractions of the edges (interior points; 0 and 1
  # are the ablated and the clean run): the MIB benchmark's.
  e.fractions = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
  e.ablations = ("corrupted", "mean")  # what edges outside carry
  e.random_draws = 3  # random circuits of each size (the baseline)
  e.resamples = 1000  # bootstrap resamples over held-out prompts
  # The hand-built circuit: the heads the IOI experiment's committed run
  # names for this model (its output, negative and path-patching
  # classes), read from its results.json.
  e.hand_built_from = "docs/results/ioi/results.json"
  e.hand_built_heads = ()  # used instead where hand_built_from is ""
  e.overlap_k = (9, 27)  # top-k heads by EAP-IG compared with them
  if smoke:
    e.model = "tiny_llama"
    e.per_template_order = 2  # 32 prompts
    e.score_prompts, e.eval_prompts = 16, 16
    e.ig_steps, e.timing_prompts = 2, (8,)
    e.fractions = (0.05, 0.2, 0.5)
    e.random_draws, e.resamples = 2, 50
    e.hand_built_from, e.hand_built_heads = "", ((1, 0), (1, 2))
    e.overlap_k = (2,)
  return c
