"""Measuring: one causal rule at one length on every path, forward only.

For each length n of `config.sizes` and each rule (8 packed documents,
causal inside each; a causal window of `config.window` keys), on q, k, v
`[B, n, H, Dh]` float32 drawn once per length:

  flash_skip     attend(implementation="flash") with the rule's block mask:
                 only non-empty blocks visited, mask_mod only on partial
                 ones. The block mask is built on blocks of
                 `config.span_block` where the kernel walks it as spans
                 there (`flash_schedule.span_plan`: the window), else on
                 blocks of `config.block` (the block walk)
  flash_blocks   where flash_skip took spans: the block walk with the
                 block mask on blocks of `config.block`
  flash_all      the block walk on blocks of `config.block` without a block
                 mask: every block visited and mask_mod evaluated on each
                 (the kernel the block mask selects: on CPU the batched
                 one, for a mask shared by every row and head,
                 `flash.runs_head_loop`)
  einsum_dense   the dense path (the whole [B, H, n, n] scores), while the
                 float32 scores fit in `config.dense_max_bytes`
  torch_flex     torch.compile(flex_attention) with create_block_mask on the
                 same arrays, `config.torch_threads` threads

Each JAX path is compiled first (its compile time kept apart) and called
once untimed, as torch's compiling call is, then called
`config.repeats` times, or once when that call took over `config.slow_s`.
A path's calls run back to back. Interleaving the paths in rounds was
tried: a call of one library right after the other's ran slow (up to 5x
for FlexAttention at n = 8192, after the dense path), with or without an
untimed call first, so the spread between runs is reported instead
(docs/score_rules.md). FlexAttention runs after every JAX path of every
case, before which torch is not imported: with torch loaded and run
earlier in the process, the JAX paths ran up to 1.8x slower (the window
at n = 8192: 28 ms against 15.5 ms in a run without torch).
Every path's output is compared with flash_skip's (largest absolute
difference), so a ratio is never between two different answers. The block
mask's build time is measured too (the cost docs/score_rules.md names).

The roofline: right before each path's timed calls, a plain float32
`[matmul_n, matmul_n]` product (`roofline.matmul_yardstick`) is timed
`yardstick_repeats` times after an untimed pause of `yardstick_pause_s`,
and the path's share is the rule's own work per second over that
product's rate. The rule's work is what any path must compute for it:
`4 B H Dh` FLOPs (q k^T and p v) for each (query, key) pair the rule
allows (`allowed_pairs`, in closed form), the same numerator for every
path, so work a path spends on masked pairs (whole blocks for
flash_all, the whole `[n, n]` for einsum_dense) lowers its share.
"""

from __future__ import annotations

import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments import cli
from mha_jax.core import attention
from mha_jax.core import block_mask
from mha_jax.core import masks
from mha_jax.core import score_rules
from mha_jax.core.kernels import flash
from mha_jax.measure import machine
from mha_jax.measure import roofline
from mha_jax.measure import stats
from mha_jax.measure import timing

RULES = ("documents", "window")


def rule_of(name: str, n: int, config):
  """`(mask_mod, document ids [n] or None)` of the rule `name` at length n."""
  causal = masks.causal_mod()
  if name == "documents":
    ids = np.repeat(np.arange(config.documents), -(-n // config.documents))[
        :n]
    return masks.and_mods(causal, masks.documents_mod(ids[None])), ids
  return masks.and_mods(causal, masks.window_mod(config.window - 1)), None


def allowed_pairs(name: str, n: int, config) -> int:
  """The (query, key) pairs rule `name` allows at length n, in closed
  form: documents of `rule_of`'s lengths (ceil(n / documents), the last
  one shorter), causal inside each; or the causal window of
  `config.window` keys."""
  if name == "documents":
    size = -(-n // config.documents)
    lengths = [min(size, n - start) for start in range(0, n, size)]
    return sum(m * (m + 1) // 2 for m in lengths)
  w = min(config.window, n)
  return w * (w + 1) // 2 + (n - w) * w


def _yardstick_rate(yard, config) -> float:
  """FLOP/s of the plain matmul `yard = (call, flops)`, timed now: the
  median of `yardstick_repeats` calls after an untimed pause."""
  call, flop = yard
  time.sleep(config.yardstick_pause_s)
  times, _ = timing.wall_times(call, (), warmup=1,
                               repeats=config.yardstick_repeats)
  return flop / float(np.median(times))


def _timed(call, config) -> dict:
  """Wall seconds of `call()` (blocking): `repeats` calls, or one when the
  first took longer than `slow_s`."""
  times, out = timing.wall_times(call, (), warmup=0,
                                 repeats=config.repeats,
                                 slow_s=config.slow_s)
  return {"times_s": times, "out": out}


def _jax_path(path, q, k, v, rules, head_loop, skip_mask, yard,
              config) -> dict:
  """`rules` carry the block mask of the block walk (blocks of
  `config.block`); flash_skip runs `skip_mask`."""
  if path == "flash_all":
    # The kernel the block walk runs by default (`head_loop`, which
    # `flash.runs_head_loop` picked for it) on its blocks, without the mask.
    bm = rules.block_mask
    fn = jax.jit(lambda q, k, v: flash.flash_attention(
        q, k, v, rules=rules.replace(block_mask=None), head_loop=head_loop,
        block_q=bm.q_block, block_k=bm.kv_block))
  elif path == "flash_blocks":
    fn = jax.jit(lambda q, k, v: flash.flash_attention(
        q, k, v, rules=rules, head_loop=head_loop, spans=False))
  else:
    if path == "flash_skip":
      rules = rules.replace(block_mask=skip_mask)
    impl = "einsum" if path == "einsum_dense" else "flash"
    fn = jax.jit(lambda q, k, v: attention.attend(
        q, k, v, implementation=impl, rules=rules)[0])
  start = time.perf_counter()
  compiled = fn.lower(q, k, v).compile()
  compile_s = time.perf_counter() - start
  # One untimed call, as FlexAttention's compiling call is: the first
  # call of a compiled program ran up to 2x slower than the next.
  jax.block_until_ready(compiled(q, k, v))
  rate = _yardstick_rate(yard, config)
  got = _timed(lambda: jax.block_until_ready(compiled(q, k, v)), config)
  return {**got, "compile_s": compile_s, "yardstick_flops_per_s": rate}


def _torch_path(name, q, k, v, ids, yard, config) -> dict:
  """FlexAttention on the same arrays, or {"error": text} where it fails."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
    from torch.nn.attention import flex_attention as flex  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    return {"error": f"{type(e).__name__}: {e}"}
  torch.set_num_threads(config.torch_threads)
  n = q.shape[1]
  as_torch = lambda x: torch.from_numpy(np.array(x)).transpose(1, 2) \
      .contiguous()  # [B, H, n, Dh]
  qt, kt, vt = as_torch(q), as_torch(k), as_torch(v)
  if name == "documents":
    doc = torch.from_numpy(ids)
    mask_mod = lambda b, h, qi, ki: (ki <= qi) & (doc[qi] == doc[ki])
  else:
    w = config.window
    mask_mod = lambda b, h, qi, ki: (ki <= qi) & (qi - ki < w)
  try:
    start = time.perf_counter()
    bm = flex.create_block_mask(mask_mod, None, None, n, n, device="cpu")
    block_mask_s = time.perf_counter() - start
    # Static shapes: compiled again for each length, as JAX compiles each
    # shape. With torch's default, the second length is compiled with a
    # symbolic n, whose C++ failed to build (g++ error) at n = 32768 with 8
    # documents in the first run of this benchmark.
    run = torch.compile(flex.flex_attention, dynamic=False)
    start = time.perf_counter()
    with torch.no_grad():
      run(qt, kt, vt, block_mask=bm)
    compile_s = time.perf_counter() - start
    rate = _yardstick_rate(yard, config)
    with torch.no_grad():
      got = _timed(lambda: run(qt, kt, vt, block_mask=bm), config)
  except Exception as e:  # recorded, not hidden: the report prints it
    text = str(e)  # its start names the error, its end says why
    return {"error": f"{type(e).__name__}: {text[:300]} ... {text[-900:]}"}
  out = got.pop("out").transpose(1, 2).numpy()  # [B, n, H, Dh]
  return {**got, "compile_s": compile_s, "block_mask_s": block_mask_s,
          "block_size": list(bm.BLOCK_SIZE), "out": out,
          "yardstick_flops_per_s": rate, "torch": torch.__version__}


def _arrays(n: int, config):
  """q, k, v `[B, n, H, Dh]` float32 of length n (the same for each rule)."""
  ks = jax.random.split(jax.random.key(config.seed + n), 3)
  shape = (config.batch, n, config.heads, config.head_dim)
  return tuple(jax.random.normal(kk, shape) for kk in ks)


def one_case(name: str, n: int, yard, config) -> dict:
  """Every JAX path for rule `name` at length n (outputs kept in the
  paths' "out" until `finish`)."""
  q, k, v = _arrays(n, config)
  mask_mod, _ = rule_of(name, n, config)
  start = time.perf_counter()
  bm = block_mask.create(mask_mod, None, None, n, n, config.block,
                         config.block)
  build_s = time.perf_counter() - start
  rules = score_rules.ScoreRules(mask_mod=mask_mod, block_mask=bm)
  batch_heads = config.batch * config.heads
  # The kernel the block walk's default picks (and flash_all runs).
  head_loop = flash.runs_head_loop(jax.default_backend(), bm, batch_heads)
  fine = block_mask.create(mask_mod, None, None, n, n, config.span_block,
                           config.span_block)
  spans = flash.span_walk(jax.default_backend(), fine, batch_heads)
  case = {"rule": name, "n": n, "block_mask_s": build_s,
          "work_flops": 4 * batch_heads * config.head_dim * allowed_pairs(
              name, n, config),
          "blocks": {**bm.counts(), "total": int(bm.state.size),
                     "computed": bm.computed()}, "paths": {},
          "heads_batched": not head_loop, "skipped": {},
          "spans": None if spans is None else {
              "block": config.span_block, "length": spans.length,
              "computed": int(spans.first.size * spans.length),
              "listed": int(spans.listed.sum()),
              "blocks": int(fine.state.size)}}
  paths = ["flash_skip", "flash_all"]
  if spans is not None:
    paths.insert(1, "flash_blocks")
  else:
    case["skipped"]["flash_blocks"] = "flash_skip is the block walk"
  score_bytes = 4 * config.batch * config.heads * n * n
  if score_bytes <= config.dense_max_bytes:
    paths.append("einsum_dense")
  else:
    case["skipped"]["einsum_dense"] = (
        f"float32 scores of {score_bytes / 2**30:.0f} "
        f"GiB > {config.dense_max_bytes / 2**30:.0f} GiB")
  for path in paths:
    case["paths"][path] = _jax_path(path, q, k, v, rules, head_loop,
                                    bm if spans is None else fine, yard,
                                    config)
    print(f"{name} n={n} {path}: {case['paths'][path]['times_s']}",
          flush=True)
  return case


def torch_case(case: dict, yard, config) -> None:
  """FlexAttention on the case's arrays, into its paths."""
  name, n = case["rule"], case["n"]
  q, k, v = _arrays(n, config)
  case["paths"]["torch_flex"] = _torch_path(
      name, q, k, v, rule_of(name, n, config)[1], yard, config)
  print(f"{name} n={n} torch_flex: "
        f"{case['paths']['torch_flex'].get('times_s')}", flush=True)


def finish(case: dict) -> None:
  """Each path's output against flash_skip's, then `summarise`."""
  ref = np.asarray(case["paths"]["flash_skip"]["out"])
  for res in case["paths"].values():
    if "out" in res:
      res["max_abs_diff"] = float(np.max(np.abs(np.asarray(res.pop("out"))
                                                - ref)))
  summarise(case)


def _ratio(t, ref) -> dict:
  """The times `t` as a multiple of `ref`: the ratio of medians, and the
  widest ratio the single calls allow (slowest over fastest and back) as
  its range."""
  return {"median": float(np.median(t) / np.median(ref)),
          "low": float(min(t) / max(ref)), "high": float(max(t) / min(ref))}


def summarise(case: dict) -> None:
  """Add each path's median, mean, sample std and its time as a multiple
  of flash_skip's (`_ratio`); where the block walk ran with the block
  mask (flash_blocks), flash_all's time as a multiple of that too: what
  skipping blocks gains on the same walk."""
  paths = case["paths"]
  skip = paths["flash_skip"]["times_s"]
  for res in paths.values():
    t = res.get("times_s")
    if not t:
      continue
    res["median_s"] = float(np.median(t))
    res["mean_s"], res["std_s"] = stats.mean_std(t)
    res["x_skip"] = _ratio(t, skip)
    # The rule's work per second over the yardstick's rate, at the
    # median call and the slowest and fastest.
    rate = res["yardstick_flops_per_s"]
    res["share"] = {"median": case["work_flops"] / res["median_s"] / rate,
                    "min": case["work_flops"] / max(t) / rate,
                    "max": case["work_flops"] / min(t) / rate}
  if paths.get("flash_blocks", {}).get("times_s"):
    paths["flash_all"]["x_blocks"] = _ratio(paths["flash_all"]["times_s"],
                                            paths["flash_blocks"]["times_s"])
  blocks = case["blocks"]
  # If time went with the blocks computed, flash_all / flash_skip would be
  # this (every block against the non-empty ones).
  case["blocks"]["all_over_computed"] = blocks["total"] / blocks["computed"]


def measure(config) -> dict:
  """Every (length, rule) case; what results.json holds (less config)."""
  kept = cli.keep_freed_memory_if_asked(config)
  start = time.perf_counter()
  load = os.getloadavg()
  yard = roofline.matmul_yardstick(config.matmul_n)
  cases = [one_case(name, n, yard, config) for n in config.sizes
           for name in RULES]
  if config.torch:  # after every JAX path: see the module docstring
    for case in cases:
      torch_case(case, yard, config)
  for case in cases:
    finish(case)
  return {"cases": cases, "took_s": time.perf_counter() - start,
          "load_before": list(load), "load_after": list(os.getloadavg()),
          "jax": jax.__version__, "backend": jax.default_backend(),
          "keep_freed_memory": kept,
          "cpus": os.cpu_count(), "machine": platform.machine(),
          "cpu": machine.instruction_sets()}
