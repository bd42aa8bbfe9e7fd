"""Part c: the longest causal bf16 sequence whose attend trains, per path.

For `implementation="auto"` and each named path, `attend`'s forward and
backward (the gradient of the summed output with respect to q, k and v)
at B, H, Dh of `config.long_context`, causal, in bf16, is compiled and
run at n = n_start, 2 n_start, ... until it fails (an out-of-memory error
is told apart from others, and so is mha_jax's own refusal of a dense
path whose scores alone cannot fit), n passes n_max, or one step took over
max_step_s (the next length would take about four times as long), or
the part's time budget is spent. Each length is compiled and run once,
timed (the figure is that one call's, after compiling: what the search
needs to know is whether it ran).

The search runs in a child process (`python -m
experiments.gpu_bench.long_context CASE_JSON`) with
XLA_PYTHON_CLIENT_PREALLOCATE=false and the configured memory fraction,
so that it has the device to itself and an error that ends the process
(an allocator abort) ends only the search: the child writes one JSON line
per event to a file, and the parent starts a fresh child for the paths
not yet searched. `mha_jax.explain_auto` gives auto's choice at each
length (a pure function of the shapes and the backend).
"""

from __future__ import annotations

import gc
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

import mha_jax
from experiments.gpu_bench import devices
from mha_jax.core import attention
from mha_jax.measure import timing

_ROOT = pathlib.Path(__file__).resolve().parents[2]
# Paths that run on one backend only: searched elsewhere they would fail
# at once (cudnn) or run interpreted, far too slowly (pallas_tpu).
BACKEND_ONLY = {"cudnn": "gpu", "pallas_tpu": "tpu"}


def is_oom(error: BaseException | str) -> bool:
  """Whether an error is XLA's (or the allocator's) out-of-memory one."""
  text = str(error)
  return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def is_refused(error: BaseException | str) -> bool:
  """Whether an error is mha_jax's refusal of a dense path whose scores
  alone exceed the devices' memory (mha_jax.core.device_memory), raised
  while tracing, before anything is allocated."""
  text = str(error)
  return "forms the scores [B, H, Tq, Tk]" in text and "holds" in text


def lengths(n_start: int, n_max: int) -> list[int]:
  """n_start, 2 n_start, ... up to n_max."""
  out, n = [], int(n_start)
  while n <= n_max:
    out.append(n)
    n *= 2
  return out


def attempt(path: str, n: int, case: dict) -> dict:
  """Compile attend's forward + backward at length n and run it once,
  timed; raises what JAX raises."""
  b, h, dh = case["B"], case["H"], case["Dh"]
  dtype = jnp.dtype(case["dtype"])
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  q, k, v = (jax.random.normal(key, (b, n, h, dh), dtype) for key in keys)

  def loss(q, k, v):
    out, _ = attention.attend(q, k, v, is_causal=True, implementation=path)
    return jnp.sum(out.astype(jnp.float32))

  compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(
      q, k, v).compile()
  mem = compiled.memory_analysis()
  (seconds,), _ = timing.wall_times(compiled, (q, k, v), warmup=0,
                                    repeats=1)
  return {"step_s": seconds,
          "temp_bytes": getattr(mem, "temp_size_in_bytes", None)}


def search(paths, case: dict, emit) -> None:
  """Every path's doubling search; `emit(record)` for each event: "start"
  (path, n) before an attempt, "result" after it, "done" (path, status)
  when a path's search ends."""
  deadline = case["deadline"]  # time.time() seconds
  for path in paths:
    status = f"reached config.long_context.n_max={case['n_max']}"
    for n in lengths(case["n_start"], case["n_max"]):
      if time.time() > deadline:
        status = f"time budget spent before n={n}"
        break
      emit({"event": "start", "path": path, "n": n})
      try:
        result = attempt(path, n, case)
      except Exception as e:  # pylint: disable=broad-except
        first = str(e).strip().splitlines()[0][:300] if str(e) else ""
        oom, refused = is_oom(e), is_refused(e)
        emit({"event": "result", "path": path, "n": n, "ok": False,
              "oom": oom, "refused": refused,
              "error": f"{type(e).__name__}: {first}"})
        status = (f"out of memory at n={n}" if oom else
                  f"refused at n={n}: one float32 copy of its scores is "
                  "more than the device holds (mha_jax checks before "
                  "tracing)" if refused else
                  f"failed at n={n}: {type(e).__name__}: {first[:200]}")
        break
      finally:
        gc.collect()
      emit({"event": "result", "path": path, "n": n, "ok": True, **result})
      if result["step_s"] > case["max_step_s"]:
        status = (f"stopped: one step took {result['step_s']:.2f} s at "
                  f"n={n}, over max_step_s={case['max_step_s']}")
        break
    emit({"event": "done", "path": path, "status": status})


def _read(path: pathlib.Path) -> list[dict]:
  if not path.exists():
    return []
  return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def _spawn(paths, case, lc, timeout_s) -> tuple[list[dict], str | None]:
  """Run `search` in a child; its records, and why it ended early (None:
  it finished)."""
  with tempfile.TemporaryDirectory() as d:
    out = pathlib.Path(d) / "records.jsonl"
    case = dict(case, paths=list(paths), out=str(out))
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false",
               XLA_PYTHON_CLIENT_MEM_FRACTION=str(lc.mem_fraction),
               PYTHONPATH=os.pathsep.join(
                   p for p in (str(_ROOT), os.environ.get("PYTHONPATH"))
                   if p))
    cmd = [sys.executable, "-m", "experiments.gpu_bench.long_context",
           json.dumps(case)]
    try:
      proc = subprocess.run(cmd, cwd=_ROOT, env=env, capture_output=True,
                            text=True, timeout=timeout_s, check=False)
      ended = None if proc.returncode == 0 else (
          f"the process ended with exit status {proc.returncode}: "
          + " ".join((proc.stderr or "").strip().splitlines()[-1:])[:300])
    except subprocess.TimeoutExpired:
      ended = f"the process was stopped after {timeout_s:.0f} s"
    return _read(out), ended


def _collect(records, summary: dict) -> list[str]:
  """Fold `records` into `summary` (path -> attempts and status); returns
  the paths whose search ended ("done")."""
  done = []
  for r in records:
    s = summary.setdefault(r["path"], {"attempts": [], "status": None})
    if r["event"] == "result":
      s["attempts"].append({k: v for k, v in r.items()
                            if k not in ("event", "path")})
    elif r["event"] == "done":
      s["status"] = r["status"]
      done.append(r["path"])
    s["last_start"] = r["n"] if r["event"] == "start" else s.get(
        "last_start")
  return done


def measure(config, budget) -> dict:
  """Every path of `config.long_context.paths`: its attempts, its
  longest n that ran, why the search stopped; auto's choice per n."""
  lc = config.long_context
  backend = jax.default_backend()
  paths = devices.names(lc.paths)
  bad = [p for p in paths if not attention.known_implementation(p)]
  if bad:
    raise ValueError(f"config.long_context.paths: unknown {bad}")
  summary = {}
  todo = []
  for p in paths:
    if BACKEND_ONLY.get(p, backend) != backend:
      summary[p] = {"attempts": [], "status": (
          f"not run: needs a {BACKEND_ONLY[p].upper()} (backend here: "
          f"{backend})")}
    else:
      todo.append(p)
  shape = {"B": lc.B, "H": lc.H, "Dh": lc.Dh, "dtype": lc.dtype,
           "n_start": lc.n_start, "n_max": lc.n_max,
           "max_step_s": lc.max_step_s}
  while todo:
    why = budget.reason()
    if why:
      for p in todo:
        summary[p] = {"attempts": [], "status": why}
      break
    case = dict(shape, deadline=time.time() + budget.left())
    if lc.subprocess:
      records, ended = _spawn(todo, case, lc, budget.left() + 120.0)
    else:
      records, ended = [], None
      search(todo, case, records.append)
    done = _collect(records, summary)
    todo = [p for p in todo if p not in done]
    if todo and ended:  # the child died inside the first unfinished path
      p = todo.pop(0)
      s = summary.setdefault(p, {"attempts": [], "status": None})
      n = s.get("last_start")
      if n is not None:
        s["attempts"].append({"n": n, "ok": False, "oom": is_oom(ended),
                              "error": ended})
      s["status"] = (f"{ended} at n={n}" if n is not None else ended)
  for s in summary.values():
    s.pop("last_start", None)
    ok = [a["n"] for a in s["attempts"] if a["ok"]]
    s["longest_n"] = max(ok) if ok else None
  tried = sorted({a["n"] for s in summary.values() for a in s["attempts"]}
                 | set(lengths(lc.n_start, min(lc.n_max, 2 * lc.n_start))))
  auto = {}
  for n in tried:
    q = jax.ShapeDtypeStruct((lc.B, n, lc.H, lc.Dh), jnp.dtype(lc.dtype))
    choice = mha_jax.explain_auto(q, q, is_causal=True)
    auto[str(n)] = {"implementation": choice.implementation,
                    "explanation": str(choice)}
  for p, s in summary.items():
    print(f"[long_context] {p}: longest n {s['longest_n']}; {s['status']}",
          flush=True)
  return {"backend": backend, "paths": {p: summary[p] for p in paths},
          "auto": auto, "shape": shape}


def _main(argv):
  if len(argv) != 2:
    raise SystemExit("usage: python -m experiments.gpu_bench.long_context "
                     "CASE_JSON")
  case = json.loads(argv[1])
  out = pathlib.Path(case["out"])

  def emit(record):
    with out.open("a") as f:
      f.write(json.dumps(record) + "\n")
  search(case["paths"], case, emit)


if __name__ == "__main__":
  _main(sys.argv)
