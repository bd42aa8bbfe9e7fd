r"""Timing attention paths against the libraries, one process per case.

The timing of `experiments.benchmark` (whose run.py calls `sweep` and
whose report.py renders the table): a case is one path (mha_jax's
`multi_head_attention` implementations, or an anchor: flax.linen,
flax.nnx, jax.nn around the same projections, torch) on one shape. Every
case runs in its own interpreter (`python -m experiments.benchmark.bench
CASE_JSON`), so that its peak resident memory (`ru_maxrss`: the whole
process, runtime included) is its own. Within it the forward and
forward+backward programs are compiled ahead of time, run `warmup` times
untimed, then `repeats` times, each call ended by `block_until_ready`; the
figure is the median. GFLOP/s use the dense closed form of FORMULAS.md
(8BnD^2 + 4Bn^2D forward, x3 for forward+backward) for every path, causal
or not, so they compare speed, not work; "% mm" divides by a plain matmul's
GFLOP/s measured in the same run. XLA's `memory_analysis` temp bytes are
recorded too. Ratios are to the fastest JAX anchor of the same shape, and
to torch when it was timed (`ratios`).

Every worker imports the same modules (JAX, Flax, mha_jax), so the
runtime's share of the peak RSS is the same for every path; torch, an
optional anchor, runs in the parent process. One process per path is
also what a training loop sees: timing the paths in turn inside one
process (tried on 2026-12-01) raised flash's forward+backward ratio to
flax.linen from 0.72-0.83x to 0.84-0.96x at the standard shape, for a
reason not found (docs/performance.md).
"""

from __future__ import annotations

import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys

import jax
import jax.numpy as jnp

from mha_jax.core.kernels import auto
from mha_jax.core import flops
from mha_jax.core import multi_head
from mha_jax.core import params as params_lib
from mha_jax.core import score_rules
from mha_jax.measure import timing
from mha_jax.training import host_memory

ANCHORS = ["flax.linen", "flax.nnx", "jax.nn", "jax.nn.cudnn", "torch"]
OURS = ["default", "vmap", "einsum", "flash", "xla", "cudnn", "auto"]
# Paths that run only on one backend (skipped elsewhere, saying why).
_BACKEND_ONLY = {"cudnn": "gpu", "jax.nn.cudnn": "gpu"}
_GIB = 2 ** 30
_ROOT = pathlib.Path(__file__).resolve().parents[2]  # holds mha_jax/


def names(text: str) -> list[str]:
  """Comma-separated names of a config field ("" -> none)."""
  return [t.strip() for t in text.split(",") if t.strip()]


def shape_sets(config) -> dict:
  """name -> list of shapes (dicts); modes list what to time."""
  both = ["fwd", "fwdbwd"]
  std, long = config.shape, config.long_shape
  sets = {
      "standard": [dict(B=std.B, n=std.n, D=std.D, h=std.h, dtype="float32",
                        causal=False, modes=both)],
      "bf16": [dict(B=std.B, n=std.n, D=std.D, h=std.h, dtype="bfloat16",
                    causal=False, modes=both)],
      "long": [dict(B=long.B, n=int(n), D=long.D, h=long.h, dtype=dtype,
                    causal=c, modes=both)
               for dtype in names(config.long_dtypes)
               for n in config.long_n for c in (True, False)]
              + [dict(B=long.B, n=int(n), D=long.D, h=long.h,
                      dtype="float32", causal=True, modes=["fwd"])
                 for n in config.long_fwd_n],
      # Causal sliding-window attention: the blockwise path visits only
      # the key blocks inside the window, so its time should grow like n.
      "window": [dict(B=long.B, n=int(n), D=long.D, h=long.h,
                      dtype="float32", causal=True, window=config.window,
                      modes=both) for n in config.window_n],
  }
  return sets


# Anchors with no sliding window: a window shape skips them.
_NO_WINDOW = ("flax.linen", "flax.nnx", "torch")


def _build(path, shape):
  """(fn(state, x) -> y, state, x) for one path on one shape."""
  b, n, d, h = shape["B"], shape["n"], shape["D"], shape["h"]
  dtype, causal = jnp.dtype(shape["dtype"]), shape["causal"]
  window = shape.get("window")  # keys at most this far back, or None
  x = jax.random.normal(jax.random.PRNGKey(1), (b, n, d), jnp.float32)
  x = x.astype(dtype)
  if path in OURS or path.startswith("jax.nn"):
    params = params_lib.init_mha_params(jax.random.PRNGKey(0), d, h,
                                        dtype=dtype)
    if path.startswith("jax.nn"):  # the same projections around jax.nn
      kernel = "cudnn" if path == "jax.nn.cudnn" else None
      def fn(p, x):
        q, k, v = multi_head.project_qkv(p, x)
        o = jax.nn.dot_product_attention(
            q, k, v, is_causal=causal, implementation=kernel,
            local_window_size=None if window is None else (window, 0))
        return multi_head.project_out(multi_head.merge_heads(o), p["w_o"])
      return fn, params, x
    kw = {} if path == "default" else {"implementation": path}
    if window is not None:
      kw["rules"] = score_rules.ScoreRules(local_window=(window, 0))
    return (lambda p, x: multi_head.multi_head_attention(
        p, x, is_causal=causal, **kw)), params, x
  if path == "flax.linen":
    import flax.linen as nn  # pylint: disable=g-import-not-at-top
    m = nn.MultiHeadDotProductAttention(num_heads=h, qkv_features=d,
                                        use_bias=False, dtype=dtype,
                                        param_dtype=dtype)
    mask = nn.make_causal_mask(jnp.ones((b, n))) if causal else None
    variables = m.init(jax.random.PRNGKey(0), x[:, :8])
    return (lambda v, x: m.apply(v, x, mask=mask)), variables, x
  if path == "flax.nnx":
    from flax import nnx  # pylint: disable=g-import-not-at-top
    m = nnx.MultiHeadAttention(num_heads=h, in_features=d, qkv_features=d,
                               use_bias=False, decode=False, dtype=dtype,
                               param_dtype=dtype, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(m)
    return (lambda s, x: nnx.merge(graphdef, s)(x, is_causal=causal)), state, x
  raise ValueError(f"unknown path {path!r}")


def _peak_rss():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # bytes


def _time(compiled, args, warmup, repeats):
  return timing.wall_times(compiled, args, warmup=warmup,
                           repeats=repeats)[0]


def run_case(case):
  """Worker body: compile, time and measure one (path, shape)."""
  shape = case["shape"]
  fn, state, x = _build(case["path"], shape)
  programs = {
      "fwd": fn,
      "fwdbwd": jax.grad(lambda s, x: jnp.sum(fn(s, x).astype(jnp.float32)),
                         argnums=(0, 1)),
  }
  result = {"rss_start": _peak_rss()}
  for mode in shape["modes"]:
    compiled = jax.jit(programs[mode]).lower(state, x).compile()
    mem = compiled.memory_analysis()
    result[f"{mode}_xla_temp"] = getattr(mem, "temp_size_in_bytes", None)
    result[f"{mode}_s"] = _time(compiled, (state, x), case["warmup"],
                                case["repeats"])
    result[f"{mode}_rss"] = _peak_rss()  # peak so far, this mode included
  return result


def _torch_case(shape, warmup, repeats):
  """torch.nn.MultiheadAttention on CPU, if torch is importable."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return {"skipped": "torch is not importable here (not a dependency)"}
  b, n, d, h = shape["B"], shape["n"], shape["D"], shape["h"]
  dtype = getattr(torch, shape["dtype"])
  m = torch.nn.MultiheadAttention(d, h, bias=False, batch_first=True,
                                  dtype=dtype)
  x = torch.randn(b, n, d, dtype=dtype, requires_grad=True)
  mask = (torch.nn.Transformer.generate_square_subsequent_mask(n)
          if shape["causal"] else None)
  fwd = lambda: m(x, x, x, attn_mask=mask, need_weights=False,
                  is_causal=shape["causal"])[0]
  out = {}
  for mode, call in (("fwd", lambda: fwd().detach()),
                     ("fwdbwd", lambda: fwd().float().sum().backward())):
    if mode not in shape["modes"]:
      continue
    out[f"{mode}_s"] = timing.wall_times(call, (), warmup=warmup,
                                         repeats=repeats)[0]
    out[f"{mode}_rss"] = _peak_rss()
  return out


def _materialises_scores(path, shape):
  """Whether `path` forms the [B, H, n, n] scores on `shape` ("auto":
  whether the implementation it picks here does)."""
  if path == "auto":
    path = auto.select(jax.default_backend(), auto.Call(
        q_dtype=shape["dtype"], head_dim=shape["D"] // shape["h"],
        q_len=shape["n"], kv_len=shape["n"], batch=shape["B"],
        num_heads=shape["h"], is_causal=shape["causal"],
        rules=("local_window",) if shape.get("window") else ())
    ).implementation
  return path not in ("flash", "pallas_tpu", "torch")


def _spawn(case, timeout_s):
  """Run one case in a fresh interpreter; returns its result dict."""
  cmd = [sys.executable, "-m", "experiments.benchmark.bench", json.dumps(case)]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      p for p in (str(_ROOT), os.environ.get("PYTHONPATH")) if p))
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=_ROOT,
                          env=env, timeout=timeout_s, check=False)
  except subprocess.TimeoutExpired:
    return {"skipped": f"timed out after {timeout_s} s"}
  lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  if proc.returncode or not lines:
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
    return {"skipped": f"failed (rc={proc.returncode}): {' '.join(tail)}"}
  return json.loads(lines[-1][len("RESULT "):])


def matmul_gflops(dtype_name, n=2048, repeats=5):
  """GFLOP/s of one jitted n x n x n matmul (the same-run yardstick)."""
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n)).astype(dtype_name)
  mm = jax.jit(lambda a: a @ a).lower(a).compile()
  return 2 * n ** 3 / statistics.median(_time(mm, (a,), 1, repeats)) / 1e9


def _flops(shape, mode):
  fwd = flops.analytic_mha_flops(shape["B"], shape["n"], shape["D"])
  return fwd if mode == "fwd" else 3 * fwd  # backward ~ twice the forward


def measure(config, set_name, shape, paths, mm_gflops):
  """One row per path for one shape, ratios to the fastest anchor."""
  rows = []
  for path in paths:
    row = {"set": set_name, "path": path, **shape,
           "kind": "anchor" if path in ANCHORS else "ours"}
    score_gib = 4 * shape["B"] * shape["h"] * shape["n"] ** 2 / _GIB
    if _BACKEND_ONLY.get(path, jax.default_backend()) != (
        jax.default_backend()):
      row["skipped"] = (f"needs a {_BACKEND_ONLY[path].upper()} (backend "
                        f"here: {jax.default_backend()})")
    elif shape.get("window") is not None and path in _NO_WINDOW:
      row["skipped"] = f"{path} has no sliding-window attention"
    elif (_materialises_scores(path, shape) and
          score_gib > config.max_score_gib):
      row["skipped"] = (f"would materialise [B,H,n,n] float32 scores of "
                        f"{score_gib:.1f} GiB > config.max_score_gib="
                        f"{config.max_score_gib}")
    elif path == "torch":
      row.update(_torch_case(shape, config.warmup, config.repeats))
    else:
      row.update(_spawn({"path": path, "shape": shape,
                         "warmup": config.warmup,
                         "repeats": config.repeats,
                         "keep_freed_memory": config.keep_freed_memory},
                        config.timeout_s))
    for mode in shape["modes"]:
      if f"{mode}_s" in row:
        ms = 1e3 * statistics.median(row[f"{mode}_s"])
        gflops = _flops(shape, mode) / ms / 1e6
        row.update({f"{mode}_ms": ms, f"{mode}_gflops": gflops,
                    f"{mode}_pct_mm": 100 * gflops / mm_gflops})
    print(f"[{set_name}] n={shape['n']} causal={shape['causal']} {path}: "
          + (row.get("skipped") or " ".join(
              f"{m}={row.get(m + '_ms', float('nan')):.1f}ms"
              for m in shape["modes"])), flush=True)
    rows.append(row)
  return ratios(rows, shape["modes"])


def ratios(rows, modes):
  """Add each row's time ratios for one shape, in place; returns `rows`.

  `{mode}_x_anchor` divides by the fastest JAX anchor (flax.linen,
  flax.nnx, jax.nn, jax.nn.cudnn) named in `{mode}_anchor`; torch is kept
  out of that minimum, so that the ratio means the same whether or not
  torch is installed, and gets its own `{mode}_x_torch` when it was timed.
  `{mode}_rss_x_anchor` compares peak RSS with that anchor's worker (torch
  runs in the parent process, so its RSS is not comparable and has no
  ratio).
  """
  for mode in modes:
    key = f"{mode}_ms"
    jax_anchors = [r for r in rows if r["kind"] == "anchor" and key in r
                   and r["path"] != "torch"]
    torch_row = next((r for r in rows if r["path"] == "torch" and key in r),
                     None)
    best = min(jax_anchors, key=lambda r: r[key]) if jax_anchors else None
    for r in rows:
      if key not in r:
        continue
      if best is not None:
        r[f"{mode}_anchor"] = best["path"]
        r[f"{mode}_x_anchor"] = r[key] / best[key]
        if r["path"] != "torch":
          r[f"{mode}_rss_x_anchor"] = r[f"{mode}_rss"] / best[f"{mode}_rss"]
      if torch_row is not None:
        r[f"{mode}_x_torch"] = r[key] / torch_row[key]
  return rows


def sweep(config) -> tuple[list[dict], dict]:
  """Every (shape set, shape, path) of `config`: `(rows, matmul_gflops)`.

  `config` is configs/benchmark.py's: comma-separated `sets` and `paths`
  ("" = every path), shapes, warmup, repeats, per-case timeout. Raises
  ValueError naming the field for an unknown set or path.
  """
  paths = names(config.paths) or OURS + ANCHORS
  unknown = sorted(set(paths) - set(OURS + ANCHORS))
  if unknown:
    raise ValueError(f"config.paths: unknown {unknown}; expected names "
                     f"from {OURS + ANCHORS}")
  sets = shape_sets(config)
  # "train_step" times whole training steps (train_step.py), not a shape.
  chosen = [s for s in names(config.sets) if s != "train_step"]
  for name in chosen:
    if name not in sets:
      raise ValueError(f"config.sets: unknown set {name!r}; expected names "
                       f"from {sorted(sets) + ['train_step']}")
  mm = {d: matmul_gflops(d, n=config.matmul_n)
        for d in ("float32", "bfloat16")}
  rows = []
  for name in chosen:
    for shape in sets[name]:
      rows += measure(config, name, shape, paths, mm[shape["dtype"]])
  return rows, mm


def _main(argv):
  if len(argv) != 2:
    raise SystemExit("usage: python -m experiments.benchmark.bench CASE_JSON")
  case = json.loads(argv[1])
  if case.get("keep_freed_memory"):  # config.keep_freed_memory
    host_memory.keep_freed_memory()
  print("RESULT " + json.dumps(run_case(case)))


if __name__ == "__main__":
  _main(sys.argv)
