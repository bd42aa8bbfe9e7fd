r"""The upstream classes of the IOI circuit in SmolLM2-135M and Gemma 3
270M (S-inhibition, induction and duplicate-token, previous-token),
each chosen on one half of the prompts and confirmed on the other.

  python -m experiments.ioi_classes --workdir=runs/ioi_classes

128 prompts per model (the IOI experiment's eight templates, ABBA and
BABA, 8 each), split into the same 64 selection and 64 held-out prompts
as the ioi_output_heads run, whose confirmed positive output heads (name
movers, S suppressors) receive the first round. Each round path-patches
every earlier head into its receivers on the selection half, the group
rule names the class, and on the held-out half the class's joint path
effect is set against random sets of its size drawn from the heads in
no class; a confirmed class receives the next round.
`--config=configs/ioi_classes.py:smoke`: tiny random Llama and Gemma 3
models through the same code (seconds).
"""

import ml_collections

from configs import default


def get_config(arg=None):
  """The experiment's settings; nothing is trained."""
  smoke = default.is_smoke(arg, "configs/ioi_classes.py")
  c = ml_collections.ConfigDict()
  c.smoke = smoke  # a smoke report draws no conclusion
  c.experiment = e = ml_collections.ConfigDict()
  e.models = ("smollm2", "gemma3")  # experiments.ioi_task.models names
  e.per_template_order = 8  # 8 templates x 2 orders x 8 = 128 prompts
  e.selection_share = 0.5  # of each template and order, for selection
  # The first round's receivers: the output heads this file's run
  # confirmed, chosen on the same selection half (checked) ...
  e.output_heads_results = "docs/results/ioi_output_heads/results.json"
  # ... or given here ({model: [[layer, head], ...]}) for a model the
  # file does not hold (the smoke run's tiny models; read only when
  # `models` holds them, so both variants have the same fields).
  e.output_heads = ml_collections.ConfigDict()
  e.output_heads.tiny_llama = [[1, 0], [1, 2]]
  e.output_heads.tiny_gemma3 = [[5, 1]]
  # Wang et al.'s path patching: the sender's change reaches the
  # receivers directly and through the MLPs between (other heads frozen).
  e.path_through_mlps = True
  # The group rule (experiments/ioi_task/groups.py), on the negative side:
  # a sender joins where its selection-half interval lies below 0 and its
  # mean is at least this share of the strongest member's.
  e.relative_floor = 0.25
  e.max_group = 5  # at most this many heads in a class
  e.random_groups = 50  # random sets of equal size per class
  # A class is confirmed where its held-out interval lies below 0 and at
  # most this share of the random sets reach its effect, (1 + k) / (1 + G).
  e.max_p = 0.05
  e.top = 10  # senders listed per round, by selection-half effect
  e.resamples = 1000  # bootstrap resamples over prompts and templates
  e.seed = 0  # names drawn, split, random sets, bootstrap
  if smoke:
    e.models = ("tiny_llama", "tiny_gemma3")
    e.output_heads_results = ""
    e.per_template_order = 2
    e.random_groups, e.resamples, e.max_group = 8, 50, 2
  return c
