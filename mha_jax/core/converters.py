"""Converters from Flax's attention layers to mha_jax's params dict.

Shape letters: D d_model, H query heads, K key/value heads, Dh head width.

Both Flax layers store the same four projections we do, with the same axis
order, so the conversion is a renaming, not a reshape:

    flax name          flax shape    mha_jax name
    query.kernel       [D, H, Dh]    w_q          (query.bias [H, Dh] -> b_q)
    key.kernel         [D, K, Dh]    w_k          (key.bias   [K, Dh] -> b_k)
    value.kernel       [D, K, Dh]    w_v          (value.bias [K, Dh] -> b_v)
    out.kernel         [H, Dh, D]    w_o          (out.bias   [D]     -> b_o)

    query_ln.scale     [Dh]          q_norm       (normalize_qk=True)
    key_ln.scale       [Dh]          k_norm

`flax.linen.MultiHeadDotProductAttention` has no key/value heads (K = H);
`flax.nnx.MultiHeadAttention` has `num_kv_heads`. Flax's QK-norm is a
LayerNorm without bias (eps 1e-6): run converted params with
`qk_norm="layer"`. Features that mha_jax does not model (an output width
different from the input width, key/value inputs of another width) are
refused with an error, so a converted layer computes exactly what the
Flax layer computed.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp
from flax import nnx

from mha_jax.core import params as params_lib

_NAMES = (("query", "q"), ("key", "k"), ("value", "v"), ("out", "o"))
_NORMS = (("query_ln", "q_norm"), ("key_ln", "k_norm"))
_NON_PARAMS = ("rngs", "cached_key", "cached_value", "cache_index")


def _leaf(x):
  """An array from a raw array or an nnx Variable (Param)."""
  if isinstance(x, nnx.Variable):
    return jnp.asarray(x.get_value())
  return jnp.asarray(x)


def _from_tree(tree: Mapping[str, Any], source: str) -> dict[str, Any]:
  """Rename {query,key,value,out}.{kernel,bias} to w_*/b_* and check shapes."""
  for name, _ in _NAMES:
    if name not in tree or "kernel" not in tree[name]:
      raise ValueError(f"{source}: expected a `{name}` entry with a `kernel`; "
                       f"got keys {sorted(tree)}")
  extra = sorted(set(tree) - {n for n, _ in _NAMES + _NORMS})
  if extra:
    raise ValueError(f"{source}: unsupported sub-layers {extra}; mha_jax has"
                     " no equivalent")
  params = {}
  for name, short in _NAMES:
    params[f"w_{short}"] = _leaf(tree[name]["kernel"])
    if "bias" in tree[name]:
      params[f"b_{short}"] = _leaf(tree[name]["bias"])
  for name, short in _NORMS:
    if name in tree:
      if set(tree[name]) != {"scale"}:
        raise ValueError(f"{source}: `{name}` must hold only a `scale` (a "
                         f"LayerNorm without bias), got {sorted(tree[name])}")
      params[short] = _leaf(tree[name]["scale"])
  # w_o must map back to the input width D: mha_jax's output is [B, T, D].
  d_in, d_out = params["w_q"].shape[0], params["w_o"].shape[-1]
  if params["w_k"].shape[0] != d_in or d_out != d_in:
    raise ValueError(f"{source}: input, key/value and output widths must all "
                     f"equal d_model; got query kernel {params['w_q'].shape}, "
                     f"key kernel {params['w_k'].shape}, out kernel "
                     f"{params['w_o'].shape}")
  params_lib.mha_dims(params)  # raises on any other inconsistency
  return params


def from_linen_mha(variables: Mapping[str, Any]) -> dict[str, Any]:
  """Params of `flax.linen.MultiHeadDotProductAttention` -> mha_jax params.

  Accepts the full `variables` from `module.init(...)` or its `"params"`
  collection.
  """
  tree = variables.get("params", variables)
  return _from_tree(tree, "from_linen_mha")


def from_nnx_mha(module_or_state: Any) -> dict[str, Any]:
  """`flax.nnx.MultiHeadAttention` (module, its nnx.State, or pure dict).

  A layer built with `normalize_qk=True` gives `q_norm`/`k_norm`; run it
  with `qk_norm="layer"`.
  """
  source = "from_nnx_mha"
  if isinstance(module_or_state, nnx.Module):
    module = module_or_state
    tree = {name: {"kernel": getattr(module, name).kernel}
            for name, _ in _NAMES}
    if getattr(module, "normalize_qk", False):
      tree.update({name: {"scale": getattr(module, name).scale}
                   for name, _ in _NORMS})
    for name, _ in _NAMES:
      bias = getattr(getattr(module, name), "bias", None)
      if bias is not None:
        tree[name]["bias"] = bias
    return _from_tree(tree, source)
  tree = module_or_state
  if isinstance(tree, nnx.State):
    tree = nnx.to_pure_dict(tree)
  # Non-parameter state that a layer may carry (rng streams, decode cache)
  # and LayerNorm slots left empty when normalize_qk=False.
  tree = {k: v for k, v in tree.items()
          if k not in _NON_PARAMS and not (k.endswith("_ln") and not v)}
  return _from_tree(tree, source)
