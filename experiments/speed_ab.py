r"""A/B speed of this checkout against another one, case by case.

    git worktree add ../mha_before <commit>      # the code to compare with
    python -m experiments.speed_ab --baseline=../mha_before

Each case runs in a fresh subprocess whose `import mha_jax` resolves to one
checkout (PYTHONPATH), compiled ahead of time, `--warmup` untimed calls,
then `--repeats` timed calls (each ended by `block_until_ready`); the
figure of one run is the median. The two checkouts alternate, A B B A ...,
for `--rounds` rounds, so slow drifts of a shared machine hit both alike.
Reported per case, for the median and for the fastest call of each run:
the median over rounds of each side, and the median of the per-round
ratios (this / baseline) with their range over rounds.

Cases (only APIs both checkouts have, so a refactor can be compared with
the code before it):
  * attention_fwd / attention_fwdbwd: `multi_head_attention` on the
    benchmark's standard shape (B=8, n=512, D=256, h=8, float32), default
    path;
  * lm_fwdbwd: loss and gradient of the default `DecoderLM`
    (configs/default.py) on one training batch;
  * lm_weights: the default model's forward returning every layer's
    attention weights (`return_weights=True`); with `--capture_case`, this
    checkout instead captures every `blocks.l.attn.pattern` hook site;
  * window_fwd / window_fwdbwd, documents_fwd / documents_fwdbwd: the
    blockwise kernel with a user `mask_mod` and its block mask (a 512-key
    window, or 8 equal documents), causal, q, k, v [1, 8192, 2, 64],
    blocks of 512 (docs/score_rules.md); fwdbwd: the gradient of
    sum(out * w) by q, k and v.
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys

from absl import app
from absl import flags

from experiments import cli

_BASELINE = flags.DEFINE_string("baseline", None, "Root of the checkout to "
                                "compare with (e.g. a git worktree).")
_CASES = flags.DEFINE_list("cases", ["attention_fwd", "attention_fwdbwd",
                                     "lm_fwdbwd", "lm_weights"],
                           "Cases to time.")
_ROUNDS = flags.DEFINE_integer("rounds", 7, "A/B rounds per case.")
_REPEATS = flags.DEFINE_integer("repeats", 20, "Timed calls per run.")
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed calls after compiling.")
_CAPTURE = flags.DEFINE_bool("capture_case", True, "lm_weights of THIS "
                             "checkout captures the pattern hook sites "
                             "instead of return_weights.")
_OUT = flags.DEFINE_string("out", "runs/speed_ab/results.json", "JSON out.")
_WORKER = flags.DEFINE_string("worker", "", "Internal: run one case.")


def _case(name, capture):
  """`(fn, args)` of one case, built with the mha_jax on sys.path."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import mha_jax  # pylint: disable=g-import-not-at-top

  if name.startswith("attention"):
    params = mha_jax.init_mha_params(jax.random.PRNGKey(0), 256, 8)
    x = jax.random.normal(jax.random.PRNGKey(1), (8, 512, 256))
    fwd = lambda p, x: mha_jax.multi_head_attention(p, x)
    if name == "attention_fwd":
      return jax.jit(fwd), (params, x)
    return jax.jit(jax.grad(lambda p, x: jnp.sum(fwd(p, x)),
                            argnums=(0, 1))), (params, x)

  if name.startswith(("window", "documents")):
    return _masked_case(name)

  # pylint: disable=g-import-not-at-top
  from configs import default
  try:
    from mha_jax.training import config as config_lib
    from mha_jax.training import train
  except ImportError:  # a baseline from before the library's layer folders
    from mha_jax import config as config_lib
    from mha_jax import train
  # pylint: enable=g-import-not-at-top
  config = default.get_config()
  model = config_lib.build_model(config, nnx.Rngs(params=0))
  graphdef, state = nnx.split(model)
  batch = train.batch_fn(config)(jax.random.PRNGKey(0))
  if name == "lm_fwdbwd":
    loss = lambda s: train.compute_loss(nnx.merge(graphdef, s), batch,
                                        "xent")[0]
    return jax.jit(jax.value_and_grad(loss)), (state,)
  if name == "lm_weights":
    if capture:
      sites = tuple(f"blocks.{l}.attn.pattern"
                    for l in range(config.model.num_layers))
      fn = lambda s, x: nnx.merge(graphdef, s)(x, capture=sites)
    else:
      fn = lambda s, x: nnx.merge(graphdef, s)(x, return_weights=True)
    return jax.jit(fn), (state, batch["inputs"])
  raise ValueError(f"unknown case {name!r}")


def _masked_case(name, n=8192, block=512):
  """`(fn, args)` of a block-masked kernel case (module docstring)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  # pylint: disable=g-import-not-at-top
  from mha_jax.core import block_mask
  from mha_jax.core import masks
  from mha_jax.core import score_rules
  from mha_jax.core.kernels import flash
  # pylint: enable=g-import-not-at-top
  if name.startswith("window"):
    mod = masks.window_mod(512)
  else:
    mod = masks.documents_mod(np.repeat(np.arange(8), n // 8)[None])
  rules = score_rules.ScoreRules(
      mask_mod=mod,
      block_mask=block_mask.create(mod, None, None, n, n, block, block))
  q, k, v, w = (jax.random.normal(key, (1, n, 2, 64))
                for key in jax.random.split(jax.random.key(n), 4))
  fwd = lambda q, k, v: flash.flash_attention(
      q, k, v, is_causal=True, rules=rules, block_q=block, block_k=block)
  if name.endswith("_fwd"):
    return jax.jit(fwd), (q, k, v)
  return jax.jit(jax.grad(lambda q, k, v: jnp.sum(fwd(q, k, v) * w),
                          argnums=(0, 1, 2))), (q, k, v)


def _worker(spec):
  # Imported here, in the worker process, like jax: the parent process
  # only starts workers.
  from mha_jax.measure import timing  # pylint: disable=g-import-not-at-top
  fn, args = _case(spec["case"], spec["capture"])
  compiled = fn.lower(*args).compile()
  times, _ = timing.wall_times(compiled, args, warmup=spec["warmup"],
                               repeats=spec["repeats"])
  print("RESULT " + json.dumps({"median_s": statistics.median(times),
                                "min_s": min(times)}))


def _run(root, spec):
  env = dict(os.environ, PYTHONPATH=str(root))
  out = subprocess.run(
      [sys.executable, str(pathlib.Path(__file__).resolve()),
       f"--worker={json.dumps(spec)}"],
      cwd=root, env=env, capture_output=True, text=True, check=False)
  lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
  if out.returncode or not lines:
    raise RuntimeError(f"case {spec} in {root} failed:\n{out.stderr[-3000:]}")
  return json.loads(lines[-1][len("RESULT "):])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _WORKER.value:
    _worker(json.loads(_WORKER.value))
    return
  if not _BASELINE.value:
    raise app.UsageError("--baseline=PATH (another checkout) is required")
  here = pathlib.Path(__file__).resolve().parent.parent
  there = pathlib.Path(_BASELINE.value).resolve()
  results = {"this": str(here), "baseline": str(there), "cases": {},
             "loadavg_start": os.getloadavg()[0]}
  for case in _CASES.value:
    base = dict(case=case, warmup=_WARMUP.value, repeats=_REPEATS.value)
    a, b = [], []
    for r in range(_ROUNDS.value):
      # Alternate which side goes first, so an order effect cancels.
      runs = [(a, here, _CAPTURE.value), (b, there, False)]
      for out, root, capture in (runs if r % 2 == 0 else runs[::-1]):
        out.append(_run(root, dict(base, capture=capture)))
    row = {"this": a, "baseline": b}
    for stat in ("median_s", "min_s"):
      # A shared machine only ever adds time, so the fastest call of a run
      # is its steadiest figure; the median is kept beside it.
      ratios = sorted(x[stat] / y[stat] for x, y in zip(a, b))
      row[stat] = {"this": statistics.median(x[stat] for x in a),
                   "baseline": statistics.median(y[stat] for y in b),
                   "ratio_median": statistics.median(ratios),
                   "ratio_range": [ratios[0], ratios[-1]]}
      r = row[stat]
      print(f"{case:18s} {stat:8s} this {r['this'] * 1e3:8.2f} ms  baseline "
            f"{r['baseline'] * 1e3:8.2f} ms  ratio {r['ratio_median']:.3f} "
            f"[{ratios[0]:.3f}, {ratios[-1]:.3f}]", flush=True)
    results["cases"][case] = row
  results["loadavg_end"] = os.getloadavg()[0]
  out = pathlib.Path(_OUT.value)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps(results, indent=1) + "\n")
  print(f"Wrote {out}")


if __name__ == "__main__":
  cli.run_app(main)
