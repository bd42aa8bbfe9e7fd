"""Part e: attention rules on the GPU, the Pallas GPU kernel against
cuDNN, FlexAttention and the blockwise path (issue 60's benchmark).

For each head width Dh and length n of `config.flex`, each rule and
each mode (forward; forward + backward, the gradient of the summed
output to q, k and v) at B, H of the config, in bf16, the contestants
are timed: `attend(implementation="pallas_gpu")` (the kernel with the
rule traced in and a block mask built once per rule and length),
`attend(implementation="cudnn")` (causal only, the rule cuDNN has),
PyTorch's FlexAttention under `torch.compile` (where torch sees a CUDA
device) with the same mask_mod / score_mod and its own block mask, and
`attend(implementation="flash")` (the blockwise path, the only other
one that takes user rules). Each: compiled, `warmup` untimed calls,
the median of `repeats`.

The rules (queries at the same positions as keys, Tq = Tk = n):

  causal      is_causal (FlexAttention: its causal mask_mod)
  documents   8 equal documents, causal inside each: a mask_mod of
              arithmetic on the indices ((q // m == k // m) & (k <= q))
  window      a causal window of 512 keys, as a mask_mod
  prefix_lm   the first n / 4 keys seen by all, causal after
  alibi       causal with ALiBi's slopes (ours: the built-in
              `alibi_slopes`, since indexing a slope table is a gather
              the Triton lowering lacks; FlexAttention: a score_mod)

Beside each time: the fraction of blocks the block mask leaves to visit
(where the contestant walks the config's blocks or its own mask's),
and TFLOP/s counted over the allowed (query, key) pairs only (4 Dh
FLOPs per pair forward, 2.5 times that backward, FlashAttention-2's
count), so a skipped block is not counted as work done. Cases run in
the order of the config's lists; once the part's share of the budget is
spent the rest are recorded as skipped. On a CPU only the smoke config
is sensible: the kernel then runs in Pallas' interpret mode.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

from experiments.gpu_bench import devices
from mha_jax.core import attention
from mha_jax.core import block_mask
from mha_jax.core import score_rules
from mha_jax.measure import timing

RULES = ("causal", "documents", "window", "prefix_lm", "alibi")
WINDOW = 512
DOCUMENTS = 8


def mask_mod(rule: str, n: int):
  """The rule's mask_mod, written with operators only, so that the same
  function runs on jax arrays and torch tensors (None: is_causal)."""
  if rule == "documents":
    m = n // DOCUMENTS
    return lambda b, h, q, k: (q // m == k // m) & (k <= q)
  if rule == "window":
    return lambda b, h, q, k: (k <= q) & (q - k < WINDOW)
  if rule == "prefix_lm":
    p = n // 4
    return lambda b, h, q, k: (k <= q) | (k < p)
  return None


def allowed_pairs(rule: str, n: int) -> int:
  """How many (query, key) pairs the rule allows, in closed form."""
  causal = n * (n + 1) // 2
  if rule == "documents":  # 8 of length m, and the remainder's own
    m = n // DOCUMENTS
    rest = n - DOCUMENTS * m
    return DOCUMENTS * m * (m + 1) // 2 + rest * (rest + 1) // 2
  if rule == "window":
    w = min(WINDOW, n)
    return w * (w + 1) // 2 + (n - w) * w
  if rule == "prefix_lm":
    p = n // 4
    return p * p + causal - p * (p + 1) // 2
  return causal


def tflops(rule: str, n: int, cfg, dh: int, mode: str, seconds: float):
  fwd = 4 * cfg.B * cfg.H * allowed_pairs(rule, n) * dh
  return (fwd if mode == "fwd" else 3.5 * fwd) / seconds / 1e12


def _ours(rule, n, cfg, block):
  """`(is_causal, ScoreRules, blocks visited fraction)` for mha_jax."""
  mod = mask_mod(rule, n)
  if mod is None:  # causal, alibi: the kernel's causal range
    nb = -(-n // block)
    rules = score_rules.ScoreRules(alibi_slopes=(
        score_rules.alibi_slopes(cfg.H) if rule == "alibi" else None))
    return True, rules, (nb * (nb + 1) / 2) / nb ** 2
  bm = block_mask.create(mod, None, None, n, n, block, block)
  frac = bm.computed() / bm.state.size
  return False, score_rules.ScoreRules(mask_mod=mod, block_mask=bm), frac


def _jax_fn(path, causal, rules, mode):
  def fwd(q, k, v):
    return attention.attend(q, k, v, is_causal=causal, rules=rules,
                            implementation=path)[0]
  if mode == "fwd":
    return jax.jit(fwd)
  return jax.jit(jax.grad(lambda q, k, v: jnp.sum(
      fwd(q, k, v).astype(jnp.float32)), (0, 1, 2)))


def _flex_fn(torch, rule, n, cfg, dh, mode):
  """FlexAttention's call for the case, compiled, and its block mask's
  visited fraction; raises where torch has no CUDA device."""
  from torch.nn.attention import flex_attention as fa  # pylint: disable=import-outside-toplevel
  mod = mask_mod(rule, n) or (lambda b, h, q, k: k <= q)
  score = None
  if rule == "alibi":
    slopes = torch.tensor(jax.device_get(score_rules.alibi_slopes(cfg.H)),
                          device="cuda")
    score = lambda s, b, h, q, k: s - slopes[h] * torch.abs(q - k)
  bm = fa.create_block_mask(mod, None, None, n, n, device="cuda")
  flex = torch.compile(fa.flex_attention)
  g = torch.Generator(device="cuda").manual_seed(0)
  q, k, v = (torch.randn(cfg.B, cfg.H, n, dh, device="cuda", generator=g,
                         dtype=torch.bfloat16, requires_grad=mode != "fwd")
             for _ in range(3))

  def call():
    out = flex(q, k, v, score_mod=score, block_mask=bm)
    if mode != "fwd":
      out.float().sum().backward()
    torch.cuda.synchronize()
    return None
  return call, 1.0 - float(bm.sparsity()) / 100.0  # sparsity: % skipped


def measure(config, budget) -> dict:
  """Rows of (Dh, n, rule, mode, contestant) with times or the reason
  a contestant did not run."""
  cfg = config.flex
  torch, torch_why = devices.torch_or_reason()
  cuda = torch is not None and devices.torch_device(torch) == "cuda"
  on_gpu = jax.default_backend() == "gpu"
  rows = []
  for dh in [int(x) for x in devices.names(cfg.head_dims)]:
    for n in [int(x) for x in devices.names(cfg.lengths)]:
      keys = jax.random.split(jax.random.PRNGKey(0), 3)
      q, k, v = (jax.random.normal(key, (cfg.B, n, cfg.H, dh), jnp.bfloat16)
                 for key in keys)
      for rule in devices.names(cfg.rules):
        built = None
        for mode in devices.names(cfg.modes):
          for who in devices.names(cfg.contestants):
            row = {"Dh": dh, "n": n, "rule": rule, "mode": mode,
                   "contestant": who}
            why = budget.reason()
            if why is None and who == "cudnn" and (rule != "causal"
                                                   or not on_gpu):
              why = ("not run: cuDNN has no user rules" if rule != "causal"
                     else "not run: needs a CUDA GPU")
            if why is None and who == "flash" and n > cfg.flash_max_n:
              why = (f"not run: the blockwise path above n = "
                     f"{cfg.flash_max_n} would take the part's whole share")
            if why is None and who == "flex" and not cuda:
              why = ("not run: needs torch with CUDA ("
                     f"{torch_why or 'torch sees no CUDA device here'})")
            if why:
              rows.append(dict(row, skipped=why))
              continue
            try:
              if who == "flex":
                call, frac = _flex_fn(torch, rule, n, cfg, dh, mode)
                times, _ = timing.wall_times(call, (), warmup=1 + cfg.warmup,
                                               repeats=cfg.repeats)
              else:
                if built is None:
                  start = time.perf_counter()
                  built = _ours(rule, n, cfg, cfg.block)
                  row["block_mask_s"] = time.perf_counter() - start
                causal, rules, frac = built
                if who != "pallas_gpu" and rules.block_mask is None:
                  frac = None  # its own causal blocks, not the config's
                fn = _jax_fn(who, causal, rules, mode)
                times, _ = timing.wall_times(fn, (q, k, v),
                                             warmup=1 + cfg.warmup,
                                             repeats=cfg.repeats)
            except Exception as e:  # pylint: disable=broad-except
              rows.append(dict(row, error=f"{type(e).__name__}: "
                               f"{str(e)[:500]}"))
              print(f"[flex] {dh} {n} {rule} {mode} {who}: "
                    f"{rows[-1]['error'][:200]}", flush=True)
              continue
            ms = 1e3 * statistics.median(times)
            rows.append(dict(row, times_s=times, ms=ms, visited=frac,
                             tflops=tflops(rule, n, cfg, dh, mode,
                                           ms / 1e3)))
            print(f"[flex] Dh={dh} n={n} {rule} {mode} {who}: {ms:.3f} ms, "
                  f"{rows[-1]['tflops']:.1f} TFLOP/s", flush=True)
  return {"B": cfg.B, "H": cfg.H, "block": cfg.block, "rows": rows}
