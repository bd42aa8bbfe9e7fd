"""TransformerLens's names for hook sites, in this project's spelling.

TransformerLens writes `blocks.0.attn.hook_pattern` and indexes its
cache by `("pattern", 0)`; `ActivationCache` takes both, through the
short names and the one spelling rule below.
"""

from __future__ import annotations

# TransformerLens's short names -> this project's site, relative to
# "blocks.{l}.". "attn" and "attn_scores" are TransformerLens's aliases.
SHORT_NAMES = {
    "q": "attn.q", "k": "attn.k", "v": "attn.v", "z": "attn.z",
    "scores": "attn.scores", "attn_scores": "attn.scores",
    "pattern": "attn.pattern", "attn": "attn.pattern",
    "result": "attn.result",
    "resid_pre": "resid_pre", "resid_mid": "resid_mid",
    "resid_post": "resid_post", "attn_out": "attn_out",
    "mlp_out": "mlp_out",
}
# TransformerLens's leaf names that differ from ours by more than "hook_".
_TL_LEAVES = {"hook_attn_scores": "scores"}


def tl_name(name: str) -> str:
  """A TransformerLens full name (`blocks.0.attn.hook_pattern`) in this
  project's spelling (`blocks.0.attn.pattern`); others unchanged."""
  parent, _, leaf = name.rpartition(".")
  if not leaf.startswith("hook_"):
    return name
  leaf = _TL_LEAVES.get(leaf, leaf[len("hook_"):])
  return f"{parent}.{leaf}" if parent else leaf
