"""A/B: the blockwise kernel now against its version at a git revision.

    .venv/bin/python -m experiments.score_rules_bench.kernel_ab \
        [--base 7b6eab9] [--n 8192] [--rounds 9] [--modes fwd,fwdbwd]

On q, k, v `[1, n, 2, 64]` float32 with is_causal, blocks of 512 and a
block mask of `--case`: `window` (masks.window_mod(512)) or `documents`
(masks.documents_mod of 8 equal documents). `base` is
mha_jax/core/kernels/flash.py as of `--base` (read with `git show`, loaded
as a module beside the current one; both take the current block mask).
Both are compiled first, checked for bit-identical outputs (and gradients
with `fwdbwd`: of sum(out * w) by q, k, v), then timed in interleaved
rounds (base, now / now, base ...; each sample the best of `--repeat`
calls). Prints one JSON line per case and mode: medians and the median of
the per-round ratios now / base, with the load average.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from mha_jax.core import block_mask
from mha_jax.core import masks
from mha_jax.core import score_rules
from mha_jax.core.kernels import flash

FLASH = "mha_jax/core/kernels/flash.py"


def base_kernel(rev: str):
  """flash.py at git revision `rev`, as a module."""
  text = subprocess.run(["git", "show", f"{rev}:{FLASH}"], check=True,
                        capture_output=True, text=True).stdout
  path = os.path.join(tempfile.mkdtemp(), "flash_base.py")
  with open(path, "w") as f:
    f.write(text)
  spec = importlib.util.spec_from_file_location("flash_base", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def rule(case: str, n: int):
  if case == "window":
    return masks.window_mod(512)
  return masks.documents_mod(np.repeat(np.arange(8), -(-n // 8))[:n][None])


def compiled(kernel, rules, mode, args):
  q, k, v, w = args
  f = lambda q, k, v: kernel.flash_attention(q, k, v, is_causal=True,
                                             rules=rules)
  if mode == "fwdbwd":
    fn = jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * w), argnums=(0, 1, 2))
  else:
    fn = f
  return jax.jit(fn).lower(q, k, v).compile()


def run(case, mode, n, rounds, repeat, base) -> dict:
  args = tuple(jax.random.normal(kk, (1, n, 2, 64))
               for kk in jax.random.split(jax.random.key(n), 4))
  mod = rule(case, n)
  bm = block_mask.create(mod, None, None, n, n, 512, 512)
  rules = score_rules.ScoreRules(mask_mod=mod, block_mask=bm)
  fns = {"base": compiled(base, rules, mode, args),
         "now": compiled(flash, rules, mode, args)}
  outs = {k: jax.tree.leaves(f(*args[:3])) for k, f in fns.items()}
  same = all(np.array_equal(a, b) for a, b in zip(outs["base"], outs["now"]))
  times = {k: [] for k in fns}
  for r in range(rounds):
    for name in (("base", "now") if r % 2 == 0 else ("now", "base")):
      best = float("inf")
      for _ in range(repeat):
        start = time.perf_counter()
        jax.block_until_ready(fns[name](*args[:3]))
        best = min(best, time.perf_counter() - start)
      times[name].append(best)
  ratios = np.array(times["now"]) / np.array(times["base"])
  return {"case": case, "mode": mode, "n": n, "bit_identical": same,
          "base_median_s": float(np.median(times["base"])),
          "now_median_s": float(np.median(times["now"])),
          "ratio_median": float(np.median(ratios)),
          "ratios": [round(float(x), 3) for x in ratios],
          "load_average": list(os.getloadavg())}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--base", default="7b6eab9")
  parser.add_argument("--n", type=int, default=8192)
  parser.add_argument("--rounds", type=int, default=9)
  parser.add_argument("--repeat", type=int, default=2)
  parser.add_argument("--cases", default="window,documents")
  parser.add_argument("--modes", default="fwd,fwdbwd")
  args = parser.parse_args()
  base = base_kernel(args.base)
  for case in args.cases.split(","):
    for mode in args.modes.split(","):
      print(json.dumps(run(case, mode, args.n, args.rounds, args.repeat,
                           base)), flush=True)


if __name__ == "__main__":
  main()
