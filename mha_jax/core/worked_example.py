"""The source's worked example, "The cat sat", as arrays the core can run.

Shape letters: T = 3 tokens, D = 4 (d_model), H = 2 heads, Dh = 2.

FORMULAS.md gives each head's Q, K, V directly. To push them through the
whole five-stage pipeline we need an input X and projections W such that
X W gives those matrices. With X = the first three rows of the 4x4 identity
(token t is the one-hot vector e_t), X W is simply the first three rows of
W, so W's rows 0-2 hold the per-head Q/K/V and row 3 is zero. W^O is the
4x4 identity, so the final output equals the concatenation of the heads;
FORMULAS.md allows any W^O and identity keeps the numbers readable.
"""

from __future__ import annotations

import jax.numpy as jnp

TOKENS = ("The", "cat", "sat")

# Per-head matrices from FORMULAS.md, rows = The, cat, sat.  [H, T, Dh]
Q = jnp.array([[[1., 0.], [0., 1.], [1., 1.]],
               [[0., 1.], [1., -1.], [1., 0.]]])
K = jnp.array([[[1., 0.], [0., 1.], [1., 1.]],
               [[1., 1.], [1., -1.], [0., 1.]]])
V = jnp.array([[[1., 0.], [0., 1.], [2., 2.]],
               [[0., 1.], [1., 0.], [1., 1.]]])


def inputs() -> jnp.ndarray:
  """X `[T, D]`: token t is the one-hot vector e_t in R^4."""
  return jnp.eye(4)[:3]  # [T, D]


def _weights_from_heads(m: jnp.ndarray) -> jnp.ndarray:
  """[H, T, Dh] per-head matrices -> projection W `[D, H, Dh]` with X W = m."""
  w = jnp.transpose(m, (1, 0, 2))  # [T, H, Dh]: row t is token t's output
  return jnp.concatenate([w, jnp.zeros((1, 2, 2))], axis=0)  # [D, H, Dh]


def params() -> dict[str, jnp.ndarray]:
  """mha_jax params whose projections of `inputs()` give Q, K, V; W^O = I."""
  return {
      "w_q": _weights_from_heads(Q),
      "w_k": _weights_from_heads(K),
      "w_v": _weights_from_heads(V),
      "w_o": jnp.eye(4).reshape(2, 2, 4),  # [H, Dv, D]: identity W^O
  }
