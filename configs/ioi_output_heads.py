r"""The IOI output heads of SmolLM2-135M and Gemma 3 270M, chosen on one
half of the prompts and confirmed on the other.

  python -m experiments.ioi_output_heads --workdir=runs/ioi_output_heads

128 prompts per model (the IOI experiment's eight templates, ABBA and
BABA, 8 each), split by a seeded draw inside each template and order
into 64 selection and 64 held-out prompts. On the selection half each
head's direct effect on logit(IO) - logit(S) at END ranks the heads and
the group rule names name movers, S suppressors and negative heads; on
the held-out half each group's joint direct effect and its joint mean
ablation are set against 50 random groups of equal size drawn from the
heads in no group, and the group members are tested for copy
suppression (McDougall et al. 2023). The committed run: 24.9 min wall on
2 shared cores (11.7 CPU-minutes); every named group holds on the
held-out half (SmolLM2's name movers L23H0, L23H2, L23H7 on the direct
path, not under ablation), and no tested head passes both copy-
suppression tests.
`--config=configs/ioi_output_heads.py:smoke`: tiny random Llama and
Gemma 3 models through the same code (seconds).
"""

import ml_collections

from configs import default


def get_config(arg=None):
  """The experiment's settings; nothing is trained."""
  smoke = default.is_smoke(arg, "configs/ioi_output_heads.py")
  c = ml_collections.ConfigDict()
  c.smoke = smoke  # a smoke report draws no conclusion
  c.experiment = e = ml_collections.ConfigDict()
  e.models = ("smollm2", "gemma3")  # experiments.ioi_task.models names
  e.per_template_order = 8  # 8 templates x 2 orders x 8 = 128 prompts
  e.selection_share = 0.5  # of each template and order, for selection
  # The group rule (experiments/ioi_task/groups.py): a head of
  # the kind joins where its selection-half direct effect's interval
  # excludes 0 and its mean is at least this share of the group's
  # strongest member's ("similar heads", not one head and its tail).
  e.relative_floor = 0.25
  e.max_group = 5  # at most this many heads in a group
  e.random_groups = 50  # random groups of equal size per named group
  # A group is confirmed where at most this share of the random groups
  # reach its held-out effect, (1 + k) / (1 + random_groups).
  e.max_p = 0.05
  # Copy suppression passes where the in-context agreement's interval
  # lies above this share of prompts ...
  e.cs_context_floor = 0.5
  # ... and at least this share of the names have their own logit among
  # the `cs_top_k` most suppressed tokens of the whole vocabulary through
  # the head's OV circuit (McDougall et al.'s top-10 test).
  e.cs_ov_share = 0.5
  e.cs_top_k = 10
  e.ablate = True  # also mean-ablate each group (ABC means per template)
  e.resamples = 1000  # bootstrap resamples over prompts and templates
  e.chunk = 64  # prompts per forward pass
  e.seed = 0  # names drawn, split, random groups, bootstrap
  if smoke:
    e.models = ("tiny_llama", "tiny_gemma3")
    e.per_template_order = 2
    e.random_groups, e.resamples, e.max_group = 8, 50, 2
  return c
