r"""The source's worked example, "The cat sat", traced through the five stages.

    python -m experiments.toy_example      # no flags; `make run` runs it too

Prints the projection, the split into heads, each head's scores, weights and
outputs for all three query rows (the row of "cat" is marked, its numbers
are the ones FORMULAS.md derives), the concatenation and the output
projection. Inputs are one-hot tokens and W^O is the 4x4 identity (see
`mha_jax.core.worked_example`), so the final output equals the concatenation.
Every number comes from the library's stage functions; at the end the
one-call `multi_head_attention` is checked against the stage-by-stage trace.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import mha_jax
from experiments import cli
from mha_jax.core import worked_example as wx

HIGHLIGHT = "cat"


def _rows(name: str, m, labels=wx.TOKENS) -> None:
  """Print a matrix row by row, with token labels and the "cat" marker."""
  print(f"  {name}")
  for label, row in zip(labels, np.asarray(m)):
    mark = "  <- cat" if label == HIGHLIGHT else ""
    cells = " ".join(f"{v:7.3f}" for v in row)
    print(f"    {label:>4} [{cells} ]{mark}")


def main(argv) -> None:
  del argv
  params, x = wx.params(), wx.inputs()[None]  # x [B=1, T=3, D=4]
  h = params["w_q"].shape[1]
  print('Multi-head attention on "The cat sat": d_model=4, h=2, '
        "d_k=d_v=2, W^O = identity\n")
  _rows("X (one-hot tokens) [T, D]", x[0])

  print("\nStage 1. Project: one fused matrix per Q, K, V  [T, D] -> [T, H*Dh]")
  full = {n: mha_jax.project(x, params[f"w_{n.lower()}"])
          for n in ("Q", "K", "V")}
  for n, y in full.items():
    _rows(f"{n}_full = X W^{n}", y[0])

  print("\nStage 2. Split heads: disjoint column slices  [T, H*Dh] -> "
        "[T, H, Dh]")
  q, k, v = (mha_jax.split_heads(full[n], h) for n in ("Q", "K", "V"))
  print("(The equations number heads from 1, the arrays and the API from 0: "
        "head_1 is q[..., 0, :], weights[:, 0], heads=0.)")
  for i in range(h):
    for n, arr in (("Q", q), ("K", k), ("V", v)):
      _rows(f"head {i + 1}: {n}_{i + 1}", arr[0, :, i])

  print("\nStage 3. Attend, each head on its own (vmap over heads)")
  out, weights = mha_jax.attend(q, k, v)  # [1, T, H, Dv], [1, H, T, T]
  for i in range(h):
    print(f" head {i + 1}")
    scores = (q[0, :, i] @ k[0, :, i].T) / np.sqrt(q.shape[-1])
    _rows(f"scores = Q_{i + 1} K_{i + 1}^T / sqrt(d_k)   columns: "
          + " ".join(wx.TOKENS), scores)
    _rows("weights = softmax(scores)   (rows sum to 1)", weights[0, i])
    _rows(f"head_{i + 1} = weights V_{i + 1}", out[0, :, i])

  print("\nStage 4. Concatenate heads  [T, H, Dv] -> [T, H*Dv]")
  concat = mha_jax.merge_heads(out)
  _rows("Concat(head_1, head_2)", concat[0])

  print("\nStage 5. Output projection with W^O = I (any 4x4 matrix is "
        "allowed by the source)")
  y = mha_jax.project_out(concat, params["w_o"])
  _rows("MultiHead = Concat W^O", y[0])

  one_call = mha_jax.multi_head_attention(params, x)
  print("\nmulti_head_attention(params, X) equals the staged trace:",
        bool(jnp.allclose(one_call, y, rtol=0, atol=1e-6)))
  print('FORMULAS.md for "cat": head 1 [1.000, 1.203], head 2 '
        "[0.822, 0.266], concatenated [1.00, 1.20, 0.82, 0.27]")


if __name__ == "__main__":
  cli.run_app(main)
