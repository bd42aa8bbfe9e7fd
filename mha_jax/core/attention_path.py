"""One record per `attend` path: what it computes and what it can take.

Every reader asks the record: `attend`'s dispatch (`fn`), its validation
and refusals (`refusal`), `auto`'s candidates and reasons
(`kernels/auto.py`), the hook sites (`forms_weights`), the memory check
(`dense_scores`) and the pages. A new path is its function and one
`AttentionPath` beside it; the core lists its own in
`attention.PATHS` and `attention.register` adds the others (the
package's `__init__` registers the context-parallel ones).

A path's function has one signature:

    fn(q, k, v, mask, bias, keep, *, is_causal, dropout_rate, rules
       [, hooks]) -> (out [B, Tq, H, Dv], pattern [B, H, Tq, Tk] or None)

with `hooks` passed, and a pattern returned, only where `forms_weights`.
`keep` is the dropout keep mask (None without dropout); `rules` a
`score_rules.ScoreRules`. Limits that depend on shapes, dtypes or the
device (Dv == Dh, block multiples, cuDNN's head widths) are the record's
`limits`, a function beside the path's own code that states them in
words: `attend` refuses a call it names by them, `auto` passes over it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from mha_jax.core import score_rules

# Every option of `score_rules.ScoreRules`: what the paths that implement
# the whole rule (vmap, einsum, flash) take.
EVERY_RULE = frozenset(score_rules.OPTIONS)


@dataclasses.dataclass(frozen=True)
class AttentionPath:
  """An `attend` implementation and what it can do.

  Attributes:
    name: the `implementation=` string.
    fn: the function, with the signature in the module docstring.
    computes: what it computes, in words (for `auto`'s reasons and the
      pages): "blockwise online softmax: O(T) memory, ...".
    forms_weights: it forms the float32 weights, returns them as the
      pattern and takes the `scores` / `pattern` hook sites.
    rules: the `ScoreRules` options (`score_rules.OPTIONS`) it applies;
      any other is refused by name.
    auto_rules: the options `auto` sends to it (None: `rules`). Narrower
      where an option passes through but was never run on the hardware.
    dropout: it applies attention dropout.
    dense_scores: "float32" or "input" when asking for it by name forms
      the scores `[B, H, Tq, Tk]` in that dtype (the memory check refuses
      a call whose one copy cannot fit); None for O(T) memory.
    backends: the JAX backends it runs on (None: every one).
    limits: `limits(call, device) -> str | None`, why it cannot take a
      call of these shapes and dtypes (`kernels.call.Call`) on this device
      (`kernels.call.Device`), in words; None: it takes every call.
    why_no_dropout: the reason in words, where `dropout` is False.
  """
  name: str
  fn: Callable
  computes: str
  forms_weights: bool = False
  rules: frozenset[str] = EVERY_RULE
  auto_rules: frozenset[str] | None = None
  dropout: bool = False
  dense_scores: str | None = None
  backends: frozenset[str] | None = None
  limits: Callable | None = None
  why_no_dropout: str = "it never forms the weights to drop"

  def __post_init__(self):
    unknown = (set(self.rules) | set(self.auto_rules or ())) - EVERY_RULE
    if unknown:
      raise ValueError(f"AttentionPath {self.name!r}: unknown rule options "
                       f"{sorted(unknown)}; expected names from "
                       f"{list(score_rules.OPTIONS)}")
    if self.dense_scores not in (None, "float32", "input"):
      raise ValueError(f"AttentionPath {self.name!r}: `dense_scores` must be "
                       f"None, 'float32' or 'input', got "
                       f"{self.dense_scores!r}")
    object.__setattr__(self, "rules", frozenset(self.rules))
    if self.auto_rules is not None:
      object.__setattr__(self, "auto_rules", frozenset(self.auto_rules))

  @property
  def rules_for_auto(self) -> frozenset[str]:
    return self.rules if self.auto_rules is None else self.auto_rules

  def score_itemsize(self, dtype_itemsize: int) -> int | None:
    """Bytes per score entry it forms for inputs of that itemsize (None:
    it forms none)."""
    if self.dense_scores is None:
      return None
    return 4 if self.dense_scores == "float32" else dtype_itemsize


def refusal(path: AttentionPath, paths, *, rules=(), dropout=False,
            backend=None) -> str | None:
  """Why `path` cannot take a call, or None: the first rule option in
  `rules` (names, `ScoreRules.active()`) it does not apply, dropout it
  lacks, a backend it does not run on. `paths` (name -> record) names
  the ways out. The text follows "fn: "."""
  for option in rules:
    if option not in path.rules:
      takers = sorted(n for n, p in paths.items() if option in p.rules)
      return (f"implementation={path.name!r} does not apply `{option}` "
              f"({score_rules.OPTION_WORDS[option]}); use one of {takers}")
  if dropout and not path.dropout:
    takers = sorted(n for n, p in paths.items() if p.dropout)
    return (f"implementation={path.name!r} has no attention dropout "
            f"({path.why_no_dropout}); use dropout_rate=0 or one of "
            f"{takers}")
  if (backend is not None and path.backends is not None
      and backend not in path.backends):
    return (f"implementation={path.name!r} runs on "
            f"{' or '.join(sorted(path.backends))} only, but the JAX backend "
            f"is {backend!r}")
  return None
