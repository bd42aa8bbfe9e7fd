"""Part d: what the exact float32 policy costs at the attend benchmark's
standard shape.

`multi_head_attention` (projections and attend; not causal) at
`config.policy.shape`, forward and forward + backward, timed by the
attend benchmark's own worker body (`experiments.benchmark.bench.
run_case`: compiled ahead of time, `warmup` untimed calls, the median of
`repeats`) in this process, once per precision of
`config.policy.precisions` (devices.PRECISIONS). Beside each time,
the forward output's error against float64 NumPy on the same inputs
(the same parameters and x as the timed program: the benchmark's keys),
which shows what each precision computed: a TF32 or bf16 matmul where
exact float32 was asked for would show as an error far above float32
rounding. The training step's costs come from part a (train_steps.py).
"""

from __future__ import annotations

import statistics

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmark import bench
from experiments.gpu_bench import devices
from mha_jax.core import multi_head
from mha_jax.core import params as params_lib


def reference(params, x) -> np.ndarray:
  """Multi-head attention in float64 NumPy (no mask, no bias): the
  `[B, n, D]` output `multi_head_attention` computes."""
  f = lambda a: np.asarray(jnp.asarray(a, jnp.float32), np.float64)
  x = f(x)
  q, k, v = (np.einsum("bnd,dhe->bnhe", x, f(params[w]))
             for w in ("w_q", "w_k", "w_v"))
  s = np.einsum("bqhe,bkhe->bhqk", q, k) / np.sqrt(q.shape[-1])
  s = np.exp(s - s.max(-1, keepdims=True))
  w = s / s.sum(-1, keepdims=True)
  o = np.einsum("bhqk,bkhe->bqhe", w, v)
  return np.einsum("bqhe,hed->bqd", o, f(params["w_o"]))


def _inputs(shape: dict, dtype):
  """The parameters and x of the attend benchmark's worker (its keys)."""
  params = params_lib.init_mha_params(jax.random.PRNGKey(0), shape["D"],
                                      shape["h"], dtype=dtype)
  x = jax.random.normal(jax.random.PRNGKey(1),
                        (shape["B"], shape["n"], shape["D"]), jnp.float32)
  return params, x.astype(dtype)


def error(path: str, shape: dict, p) -> dict:
  """The forward output's error against `reference` at precision `p`."""
  params, x = _inputs(shape, jnp.dtype(p.dtype))
  with devices.jax_context(p):
    out = jax.jit(lambda prm, x: multi_head.multi_head_attention(
        prm, x, implementation=path))(params, x)
  out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
  ref = reference(params, x)
  return {"max_abs": float(np.abs(out - ref).max()),
          "rel": float(np.linalg.norm(out - ref) / np.linalg.norm(ref))}


def measure(config, budget) -> dict:
  """Times and errors per path and precision."""
  po = config.policy
  shape = {k: int(po.shape[k]) for k in ("B", "n", "D", "h")}
  rows = []
  for path in devices.names(po.paths):
    for p in devices.precisions(po.precisions):
      row = {"path": path, "precision": p.name}
      why = budget.reason()
      if why:
        rows.append(dict(row, skipped=why))
        continue
      case = {"path": path, "warmup": po.warmup, "repeats": po.repeats,
              "shape": dict(shape, dtype=p.dtype, causal=False,
                            modes=["fwd", "fwdbwd"])}
      with devices.jax_context(p):  # traced inside run_case
        timed = bench.run_case(case)
      for mode in ("fwd", "fwdbwd"):
        row[f"{mode}_s"] = timed[f"{mode}_s"]
        row[f"{mode}_ms"] = 1e3 * statistics.median(timed[f"{mode}_s"])
      row["error"] = error(path, shape, p)
      print(f"[policy] {path} {p.name}: fwd {row['fwd_ms']:.3f} ms, "
            f"fwd+bwd {row['fwdbwd_ms']:.3f} ms, rel error "
            f"{row['error']['rel']:.2e}", flush=True)
      rows.append(row)
  return {"shape": shape, "rows": rows}
