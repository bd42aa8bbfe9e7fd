"""The group rule: which heads are name movers, S suppressors and
negative heads, from the selection half alone; random groups of equal
size to compare each group with; and whether the held-out half confirms
a group.

Shape letters: M heads (flat, layer * H + head), R resamples, G random
groups.

Wang et al.'s name movers are several similar heads, each carrying a
small share; a rule that separates one head from the next (the IOI
experiment's `stats.separated`) cannot admit a group below one dominant
head. Here a head of the kind joins its group where (1) its direct
effect's interval over the selection prompts excludes 0 on the kind's
side and (2) its mean is at least `relative_floor` of the group's
strongest member's, the largest `max_group` such heads. The group is
then tested as a whole, on prompts it was not chosen on.

The kinds (selection-half intervals; `floor` is what uniform attention
puts on one name, so a smaller difference is no preference):

  name mover     positive; attends from END to IO more than to S1 + S2
                 (interval above `floor`) and copies (its value at IO
                 read out raises IO over the other names: copy score's
                 interval above 0)
  S suppressor   positive; attends to S more than to IO (interval below
                 -`floor`) and writes -logit(S) (its effect on S's logit,
                 minus its mean effect on the names not in the prompt:
                 interval below 0)
  negative       the most negative heads, whatever they attend to
"""

from __future__ import annotations

import numpy as np

KINDS = ("name_movers", "s_suppressors", "negative")
SIGN = {"name_movers": 1, "s_suppressors": 1, "negative": -1}


def candidates(means: dict, ci: dict, *, floor: float) -> dict:
  """`{kind: [M] bool}`: the heads each kind's attention and OV criteria
  admit (module docstring). `means`, `ci`: `{"effect", "attention",
  "copy", "s_specific"}` over heads, `[M]` and `[M, 2]`; `attention` is
  END -> IO minus END -> S1 + S2."""
  att, cp, s_sp = ci["attention"], ci["copy"], ci["s_specific"]
  positive = means["effect"] > 0
  return {"name_movers": positive & (att[:, 0] > floor) & (cp[:, 0] > 0),
          "s_suppressors": positive & (att[:, 1] < -floor)
                           & (s_sp[:, 1] < 0),
          "negative": means["effect"] < 0}


def grow(mean, ci, admitted, *, sign: int, relative_floor: float,
         max_group: int) -> list:
  """The group's heads (flat indices, strongest first): among `admitted
  [M]` heads, those whose effect interval `ci [M, 2]` excludes 0 on the
  side `sign` (+1 positive, -1 negative) and whose mean `mean [M]` is at
  least `relative_floor` times the strongest such head's, at most
  `max_group` of them."""
  if sign not in (1, -1):
    raise ValueError(f"groups.grow: `sign` must be 1 or -1, got {sign!r}")
  if not 0 <= relative_floor <= 1:
    raise ValueError(f"groups.grow: `relative_floor` must lie in [0, 1], "
                     f"got {relative_floor!r}")
  m = sign * np.asarray(mean, np.float64)
  lo = np.where(sign > 0, ci[:, 0], -ci[:, 1])  # the kind's side
  ok = np.asarray(admitted, bool) & (lo > 0)
  order = [int(i) for i in np.argsort(-m) if ok[i]]
  if not order:
    return []
  top = m[order[0]]
  return [i for i in order if m[i] >= relative_floor * top][:max_group]


def random_groups(pool, size: int, count: int, seed: int) -> np.ndarray:
  """`[G, size]`: `count` groups of `size` distinct heads drawn from
  `pool` (flat indices), each draw independent."""
  pool = np.asarray(pool)
  if size > len(pool):
    raise ValueError(f"groups.random_groups: `size`={size} heads cannot be "
                     f"drawn from a pool of {len(pool)}")
  rng = np.random.default_rng(seed)
  return np.stack([rng.choice(pool, size, replace=False)
                   for _ in range(count)]) if count else np.zeros(
                       (0, size), int)


def as_far(group: float, random, sign: int) -> dict:
  """How many random groups' effects `random [G]` reach the group's
  `group` on the side `sign`, and the one-sided permutation share
  (1 + k) / (1 + G)."""
  k = int(np.sum(sign * np.asarray(random) >= sign * group))
  return {"as_far": k, "p": (1 + k) / (1 + len(random))}
