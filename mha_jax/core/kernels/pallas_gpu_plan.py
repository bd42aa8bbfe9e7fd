"""What the Pallas GPU kernel can take, and which blocks it visits.

Shape letters: Nq / Nk query / key block counts, B' / K' the block
mask's batch and kv heads (1: shared).

`unsupported`, `untraceable` and `rules_problem` are the kernel's
refusals in words (the shapes and dtypes the Triton lowering needs, the
primitives a rule may use, a block mask's blocks); `default_block` the
block it takes when none is given; `plan` turns a block mask, or the built-in causal rule and window,
into the lists the kernel's loops walk (`pallas_gpu_kernels._walk`).
Nothing here is traced into a kernel: it runs once per call, in NumPy.
"""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np

from mha_jax.core.kernels.flash_visit import visited_blocks

DTYPES = ("float16", "bfloat16", "float32")


def _power_of_two(n):
  return n >= 1 and n & (n - 1) == 0


def unsupported(*, head_dim, value_dim, block_q, block_k, dtypes, mask,
                bias, interpret) -> str | None:
  """Why the kernel cannot take a call of these shapes (None: it can).
  The Triton limits (power-of-two widths and blocks of at least 16, as
  `tl.dot` and `tl.arange` need) hold only where it is compiled for a
  GPU; interpret mode takes any (the CPU tests use tiny blocks)."""
  if len(set(dtypes)) != 1 or dtypes[0] not in DTYPES:
    return (f"q, k, v must share one dtype of {', '.join(DTYPES)}, got "
            f"{', '.join(dtypes)}")
  if mask:
    return ("it takes no dense `mask`: write it as a `mask_mod` (or pass "
            "segment ids, a window or is_causal)")
  if bias:
    return "it takes no dense `bias`: write it as a `score_mod`"
  if interpret:
    return None
  for name, val in (("head width Dh", head_dim), ("value width Dv",
                                                   value_dim)):
    if not _power_of_two(val) or not 16 <= val <= 256:
      return (f"{name}={val} must be a power of two in [16, 256] for the "
              "Triton lowering")
  for name, val in (("block_q", block_q), ("block_k", block_k)):
    if not _power_of_two(val) or val < 16:
      return (f"`{name}`={val} must be a power of two >= 16 for the Triton "
              "lowering (a block mask brings its own blocks)")
  return None


_READS = ("gather", "dynamic_slice")


def _primitives(jaxpr, tables=frozenset()):
  """Every primitive name of a jaxpr, sub-jaxprs included, but for the
  point reads of `tables` (vars of integer arrays the rule closes over),
  which the kernel turns into loads (`pallas_gpu_tables`)."""
  for eqn in jaxpr.eqns:
    first = eqn.invars[0] if eqn.invars else None
    if eqn.primitive.name in _READS and any(first is t for t in tables):
      continue
    yield eqn.primitive.name
    sub = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
    if sub is not None and hasattr(sub, "jaxpr"):  # a call: tables go in
      inner = {v for v, outer in zip(sub.jaxpr.invars, eqn.invars)
               if any(outer is t for t in tables)}
      yield from _primitives(sub.jaxpr, frozenset(inner))
      continue
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      yield from _primitives(sub)


def untraceable(rules) -> str | None:
  """Why a user rule of `rules` cannot be lowered by Pallas' Triton
  lowering (None: both can): the first primitive it has no rule for. A
  point read of an array mask_mod closes over, or of an integer array
  score_mod closes over, is no such primitive: the kernel loads those
  elements from memory (`pallas_gpu_tables`)."""
  from jax._src.pallas.triton import lowering  # pylint: disable=g-import-not-at-top
  known = {str(p) for p in lowering.triton_lowering_rules}
  i32, f32 = jnp.zeros((), jnp.int32), jnp.zeros((), jnp.float32)
  for name, args in (("score_mod", (f32, i32, i32, i32, i32)),
                     ("mask_mod", (i32, i32, i32, i32))):
    rule = getattr(rules, name)
    if rule is None:
      continue
    closed = jax.make_jaxpr(rule)(*args)
    # mask_mod's arrays are never differentiated: all are read per
    # element; score_mod's float ones would need a scatter-add gradient.
    tables = frozenset(
        v for v, c in zip(closed.jaxpr.constvars, closed.consts)
        if name == "mask_mod"
        or not jnp.issubdtype(jnp.result_type(c), jnp.inexact))
    for prim in _primitives(closed.jaxpr, tables):
      if prim not in known:
        hint = (" (indexing a float array the rule closes over: its "
                "gradient would be a scatter-add, which the Triton "
                "lowering lacks too; integer arrays such as document ids "
                "are read per element)" if prim in _READS else "")
        return (f"`{name}` uses `{prim}`{hint}, which Pallas' Triton "
                "lowering cannot compile")
  return None


def default_block(length: int, block: int) -> int:
  """The block for a length when none is given: a power of two of at
  least 16 (Triton's smallest dot) and at most `block`, padding a short
  length (a decoding step's Tq = 1) rather than clipping to it."""
  return min(block, max(16, 1 << (max(length, 1) - 1).bit_length()))


def rules_problem(rules) -> str | None:
  """Why the kernel compiled for a GPU cannot take these `rules` (None:
  it can): a user rule Triton cannot lower (`untraceable`), or a block
  mask on blocks Triton cannot tile."""
  why = untraceable(rules)
  bm = rules.block_mask
  if why is None and bm is not None and not all(
      _power_of_two(x) and x >= 16 for x in (bm.q_block, bm.kv_block)):
    why = (f"`block_mask` was built on blocks of {bm.q_block} x "
           f"{bm.kv_block} (clipped to the lengths); the Triton lowering "
           "needs powers of two >= 16 (block_mask.create(..., q_block=64, "
           "kv_block=64) on lengths of at least 64)")
  return why


def _lists(m):
  """bool `[.., N, M]` -> (num `[.., N]`, idx `[.., N, M]`) int32: row n
  visits idx[.., n, :num] (in order)."""
  order = np.argsort(~m, axis=-1, kind="stable")
  return m.sum(-1).astype(np.int32), order.astype(np.int32)


def plan(spec, bm, nq, nk, kh):
  """The kernel's block lists (NumPy, static), by name: for each query
  block its partial and full key blocks (`part_*`, `full_*`, `[B', K',
  Nq(, Nk)]`), and for each key block the query blocks (`t_*`, `[B', K',
  Nk(, Nq)]`) that visit it. Without a block mask every block the
  built-in causal rule and window leave visible is partial (all of them
  with `q_positions`, whose positions are known only when traced)."""
  if bm is None:
    visit = (visited_blocks(spec, nq, nk) if spec.default_q_pos
             else np.ones((nq, nk), bool))[None, None]
    full = np.zeros_like(visit)
  else:
    num, idx, full_l = bm.kernel_lists(
        kh, per_head=True, visible=lambda p: visited_blocks(
            spec._replace(bq=spec.bq // p, bk=spec.bk // p), nq * p,
            nk * p))
    listed = np.arange(nk) < num[..., None]
    visit = np.zeros(idx.shape, bool)
    full = np.zeros(idx.shape, bool)
    np.put_along_axis(visit, idx, listed, axis=-1)
    np.put_along_axis(full, idx, listed & full_l, axis=-1)
  out = {}
  for prefix, part, whole in (("", visit & ~full, visit & full),
                              ("t_", np.swapaxes(visit & ~full, -1, -2),
                               np.swapaxes(visit & full, -1, -2))):
    for kind, m in (("part", part), ("full", whole)):
      out[f"{prefix}{kind}_num"], out[f"{prefix}{kind}_idx"] = _lists(m)
  return {k: jnp.asarray(v) for k, v in out.items()}
