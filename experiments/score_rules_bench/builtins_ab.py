"""A/B: a built-in argument against the rule it is written as, forward only.

    .venv/bin/python -m experiments.score_rules_bench.builtins_ab

On q, k, v `[1, n, 2, 64]` float32 (n = 8192 by default), the blockwise
kernel (`flash.flash_attention`, blocks of 512, one head at a time for
every variant: by default a rule whose block mask is shared by every head
runs the heads batched, `flash.runs_head_loop`, which would make this a
comparison of two kernels) with causal attention:

  window_builtin  is_causal, local_window=(512, 0): blocks from closed-form
                  ranges, no block mask
  window_rule     is_causal, mask_mod=masks.window_mod(512) with its block
                  mask
  causal_builtin  is_causal
  causal_rule     mask_mod=masks.causal_mod() with its block mask

Every variant is compiled first, then timed in `--rounds` interleaved
rounds (one call of each per round, the order rotating), so a change of
the machine's load falls on all of them alike. The block masks' build
time is measured twice (the first build compiles the rule's evaluation).
Each rule's output is compared with its built-in's (the numbers must be
equal). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from mha_jax.core import attention
from mha_jax.core import block_mask
from mha_jax.core import masks
from mha_jax.core import score_rules
from mha_jax.core.kernels import flash
from mha_jax.measure import stats
from mha_jax.measure import timing

R = score_rules.ScoreRules


def _built(mask_mod, n, block):
  """`(BlockMask, [seconds of each build])`: built twice."""
  times, bm = timing.wall_times(block_mask.create,
                                (mask_mod, None, None, n, n, block, block),
                                warmup=0, repeats=2)
  return bm, times


def variants(n: int, window: int, block: int):
  """`{name: (is_causal, ScoreRules)}` and the block masks' build times."""
  win_bm, win_s = _built(masks.window_mod(window), n, block)
  causal_bm, causal_s = _built(masks.causal_mod(), n, block)
  return {
      "window_builtin": (True, R(local_window=(window, 0))),
      "window_rule": (True, R(mask_mod=masks.window_mod(window),
                              block_mask=win_bm)),
      "causal_builtin": (True, R()),
      "causal_rule": (False, R(mask_mod=masks.causal_mod(),
                               block_mask=causal_bm)),
  }, {"window_rule": win_s, "causal_rule": causal_s}


def run(n=8192, heads=2, head_dim=64, window=512, block=512, rounds=7,
        seed=0) -> dict:
  ks = jax.random.split(jax.random.key(seed), 3)
  q, k, v = (jax.random.normal(kk, (1, n, heads, head_dim)) for kk in ks)
  cases, build_s = variants(n, window, block)
  compiled, outs = {}, {}
  for name, (causal, rules) in cases.items():
    attention.check_attend_inputs(q, k, v, None, None, "flash",
                                  rules=rules)
    fn = jax.jit(lambda q, k, v, causal=causal, rules=rules:
                 flash.flash_attention(q, k, v, is_causal=causal,
                                       rules=rules, block_q=block,
                                       block_k=block, head_loop=True))
    compiled[name] = fn.lower(q, k, v).compile()
    outs[name] = np.asarray(compiled[name](q, k, v))  # also the warm-up
  times = timing.interleaved_times(
      {name: lambda f=f: f(q, k, v) for name, f in compiled.items()},
      rounds)
  result = {"n": n, "heads": heads, "head_dim": head_dim, "window": window,
            "block": block, "rounds": rounds,
            "load_average": list(os.getloadavg()),
            "block_mask_build_s": build_s, "variants": {}}
  for name, ts in times.items():
    mean, std = stats.mean_std(ts)
    result["variants"][name] = {"median_s": float(np.median(ts)),
                                "mean_s": mean, "std_s": std,
                                "times_s": ts}
  for kind in ("window", "causal"):
    result[f"{kind}_max_abs_diff"] = float(np.max(np.abs(
        outs[f"{kind}_rule"] - outs[f"{kind}_builtin"])))
  return result


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--n", type=int, default=8192)
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--block", type=int, default=512)
  parser.add_argument("--window", type=int, default=512)
  args = parser.parse_args()
  print(json.dumps(run(n=args.n, window=args.window, block=args.block,
                       rounds=args.rounds), indent=1))


if __name__ == "__main__":
  main()
