"""Parameters of one multi-head attention layer, as a plain dict pytree.

Shape letters: D d_model, H query heads, K key/value heads, Dh per-head
query/key width (d_k), Dv per-head value width (d_v; equal to Dh here).

Each projection is ONE matrix whose output axis is split into heads:
`w_q [D, H, Dh]` is the source's `W^Q [D, H*Dh]` with its columns grouped by
head, so head i owns the disjoint column slice `i*Dh:(i+1)*Dh` (a genuine
partition of the feature dimension, seed step 2).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class MHADims:
  """Sizes read off a params dict (see `mha_dims`)."""
  d_model: int  # D
  num_heads: int  # H
  num_kv_heads: int  # K
  head_dim: int  # Dh
  value_dim: int  # Dv
  use_bias: bool

  @property
  def group_size(self) -> int:  # G = H // K query heads per kv head
    return self.num_heads // self.num_kv_heads


def init_mha_params(key: jax.Array, d_model: int, num_heads: int, *,
                    num_kv_heads: int | None = None,
                    head_dim: int | None = None, use_bias: bool = False,
                    dtype=jnp.float32) -> dict[str, jax.Array]:
  """Initialise `w_q [D,H,Dh]`, `w_k [D,K,Dh]`, `w_v [D,K,Dh]`, `w_o [H,Dh,D]`.

  Weights are normal with variance 1/fan_in (LeCun), the fan-in being the
  input width of the whole fused projection (D for Q/K/V, H*Dh for W^O).
  Biases (`b_q [H,Dh]`, `b_k [K,Dh]`, `b_v [K,Dh]`, `b_o [D]`) start at zero.
  `num_kv_heads` K < H gives grouped-query attention (K = 1: multi-query).
  """
  for name, val in (("d_model", d_model), ("num_heads", num_heads)):
    if not isinstance(val, int) or val < 1:
      raise ValueError(f"init_mha_params: `{name}` must be a positive int, "
                       f"got {val!r}")
  num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
  if not isinstance(num_kv_heads, int) or num_kv_heads < 1:
    raise ValueError(f"init_mha_params: `num_kv_heads` must be a positive int,"
                     f" got {num_kv_heads!r}")
  if num_heads % num_kv_heads:
    raise ValueError(f"init_mha_params: `num_kv_heads`={num_kv_heads} must "
                     f"divide `num_heads`={num_heads}")
  if head_dim is None:
    if d_model % num_heads:
      raise ValueError(f"init_mha_params: `d_model`={d_model} is not divisible"
                       f" by `num_heads`={num_heads}; pass `head_dim` to "
                       "choose the per-head width explicitly")
    head_dim = d_model // num_heads
  if not isinstance(head_dim, int) or head_dim < 1:
    raise ValueError(f"init_mha_params: `head_dim` must be a positive int, "
                     f"got {head_dim!r}")
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"init_mha_params: `dtype` must be floating, got {dtype}")

  kq, kk, kv, ko = jax.random.split(key, 4)

  def normal(k, shape, fan_in):
    return (jax.random.normal(k, shape, jnp.float32)
            * fan_in ** -0.5).astype(dtype)

  h, kh, dh = num_heads, num_kv_heads, head_dim
  params = {
      "w_q": normal(kq, (d_model, h, dh), d_model),
      "w_k": normal(kk, (d_model, kh, dh), d_model),
      "w_v": normal(kv, (d_model, kh, dh), d_model),
      "w_o": normal(ko, (h, dh, d_model), h * dh),
  }
  if use_bias:
    params.update(
        b_q=jnp.zeros((h, dh), dtype), b_k=jnp.zeros((kh, dh), dtype),
        b_v=jnp.zeros((kh, dh), dtype), b_o=jnp.zeros((d_model,), dtype))
  return params


_RANKS = {"w_q": 3, "w_k": 3, "w_v": 3, "w_o": 3,
          "b_q": 2, "b_k": 2, "b_v": 2, "b_o": 1,
          # Optional variants: QK-norm scales (shared by the heads, as in
          # Flax's normalize_qk) and each head's sink logit.
          "q_norm": 1, "k_norm": 1, "sinks": 1}


def mha_dims(params) -> MHADims:
  """Read and cross-check the sizes of a params dict; raise on any mismatch."""
  if not hasattr(params, "keys"):
    raise TypeError(f"`params` must be a dict from init_mha_params, got "
                    f"{type(params).__name__}")
  missing = [k for k in ("w_q", "w_k", "w_v", "w_o") if k not in params]
  if missing:
    raise ValueError(f"`params` is missing {missing}; expected keys w_q, w_k, "
                     "w_v, w_o (and b_q, b_k, b_v, b_o with biases)")
  for name, arr in params.items():
    if name not in _RANKS:
      raise ValueError(f"`params` has unknown key {name!r}")
    if jnp.ndim(arr) != _RANKS[name]:
      raise ValueError(f"`params[{name!r}]` must have rank {_RANKS[name]}, got "
                       f"shape {jnp.shape(arr)}")
    if not jnp.issubdtype(jnp.result_type(arr), jnp.floating):
      raise TypeError(f"`params[{name!r}]` must be floating, got "
                      f"{jnp.result_type(arr)}")
  d, h, dh = params["w_q"].shape
  kh = params["w_k"].shape[1]
  dv = params["w_v"].shape[2]
  expected = {"w_k": (d, kh, dh), "w_v": (d, kh, dv), "w_o": (h, dv, d),
              "b_q": (h, dh), "b_k": (kh, dh), "b_v": (kh, dv), "b_o": (d,),
              "q_norm": (dh,), "k_norm": (dh,), "sinks": (h,)}
  for name, shape in expected.items():
    if name in params and tuple(params[name].shape) != shape:
      raise ValueError(f"`params[{name!r}]` must have shape {shape} to match "
                       f"w_q {params['w_q'].shape} and w_k "
                       f"{params['w_k'].shape}, got {params[name].shape}")
  if h % kh:
    raise ValueError(f"`params`: key/value heads K={kh} (w_k.shape[1]) must "
                     f"divide query heads H={h} (w_q.shape[1])")
  biases = [k for k in ("b_q", "b_k", "b_v", "b_o") if k in params]
  # q, k and v without o is Qwen2's layout; any other subset is a mistake.
  if biases and len(biases) != 4 and biases != ["b_q", "b_k", "b_v"]:
    raise ValueError(f"`params` has biases {biases}; give all of b_q, b_k, b_v,"
                     " b_o, or b_q, b_k, b_v, or none")
  if ("q_norm" in params) != ("k_norm" in params):
    raise ValueError("`params` must have both q_norm and k_norm (QK-norm) "
                     "or neither")
  return MHADims(d, h, kh, dh, dv, bool(biases))
