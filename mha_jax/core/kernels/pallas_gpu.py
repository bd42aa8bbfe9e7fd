"""Attention with the user's rules traced into a Pallas GPU kernel
("pallas_gpu"): FlexAttention's two functions, block skipping included.

Shape letters: B batch, Tq / Tk query / key length, H query heads, K
key/value heads, G = H // K, Dh query/key width, Dv value width, Bq / Bk
block lengths, Nq / Nk block counts, Tq' / Tk' lengths padded to whole
blocks.

A FlashAttention-2 kernel written for Pallas' Triton lowering; its bodies
are `pallas_gpu_kernels.py`, what it can take and which blocks it visits
`pallas_gpu_plan.py`. This module lays the inputs out (head-major,
padded to whole blocks), turns the block mask into the kernel's lists
(`plan`), hoists the arrays a rule closes over into kernel inputs (the
blockwise kernel's `flash_rules.user_rules`, so that float ones get
gradients), and wires the forward, dq and dk/dv kernels into a custom VJP.

Semantics are the reference path's: every `ScoreRules` option (causal
bottom-right, window, segments, soft cap, sinks, ALiBi, scale, query
positions, score_mod, mask_mod, block_mask), GQA by reading kv head
h // G, a row with no allowed key gives output 0 (lse -inf, finite
gradients), float32 scores and accumulators. It takes no dense `mask` or
`bias` (close over them in a rule instead) and no dropout.

Where it runs. On a GPU the kernel is compiled by Pallas' Triton lowering;
elsewhere it runs in Pallas' interpret mode, which is how the tests check
it on CPU (slowly: a correctness path there, never chosen by `auto`).
THE TRITON LOWERING HAS NOT YET RUN ON A GPU: the kernels are written in
the subset it takes (`pl.ds` slices of refs, `lax.fori_loop` with traced
bounds, `lax.broadcasted_iota`, float32 dots), and the tests lower the
forward and backward to Triton IR for CUDA from a CPU, but no GPU has
compiled or run them; the benchmark (experiments/gpu_bench/flex.py) is
ready and its timings are still to come. On a GPU a rule must use only
primitives the Triton lowering has (`untraceable` names the first it
lacks): elementwise arithmetic, comparisons, `jnp.where`, tanh/exp/log
and the like on the indices and the score, and reads of the arrays a
mask_mod closes over or of integer arrays a score_mod closes over
(`doc_ids[b, q_idx]`), which the kernel loads per element from memory
(`pallas_gpu_tables`). A score_mod indexing a float array (`table[h,
q - k]`, a learned bias) is refused on a GPU: its gradient
would be a scatter-add, which the Triton lowering (jax 0.10) lacks too;
such rules run in interpret mode only, and `auto` sends them to "flash".
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from mha_jax.core import attention_path
from mha_jax.core import score_rules
from mha_jax.core.kernels import pallas_gpu_kernels as kernels
from mha_jax.core.kernels.flash_rules import user_rules
from mha_jax.core.kernels.pallas_gpu_plan import default_block
from mha_jax.core.kernels.pallas_gpu_plan import plan
from mha_jax.core.kernels.pallas_gpu_plan import rules_problem
from mha_jax.core.kernels.pallas_gpu_plan import unsupported
from mha_jax.core.kernels.pallas_gpu_plan import untraceable  # noqa: F401

# Block lengths without a block mask (a block mask brings its own).
BLOCK_Q = 64
BLOCK_K = 64
# Triton's launch parameters (JAX's own Pallas GPU attention uses 4 and 2
# at these blocks); to be tuned on a GPU.
NUM_WARPS = 4
NUM_STAGES = 2


def _whole(x):
  """A BlockSpec giving every program all of `x`."""
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  return pl.BlockSpec(x.shape, lambda *_: (0,) * x.ndim)


def _call(body, grid, arrays, specs, outs, static):
  """`pl.pallas_call` of `body(refs, *out_refs)` over `grid`."""
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  spec, interpret, rows, heads = static
  shapes, out_specs = zip(*outs)
  in_specs = {k: (tuple(_whole(c) for c in arrays[k]) if k == "consts"
                  else specs.get(k) or _whole(arrays[k])) for k in arrays}

  def kernel(refs, *out_refs):
    body(refs, *out_refs, spec=spec, rows=rows, heads=heads)
  params = None
  if not interpret:  # Triton, not Mosaic GPU (JAX's default on Hopper)
    from jax.experimental.pallas import triton as pl_triton  # pylint: disable=g-import-not-at-top
    params = pl_triton.CompilerParams(num_warps=NUM_WARPS,
                                      num_stages=NUM_STAGES)
  return pl.pallas_call(kernel, grid=grid, in_specs=[in_specs],
                        out_specs=list(out_specs), out_shape=list(shapes),
                        interpret=interpret, compiler_params=params)(arrays)


def _block(shape, index):
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  return pl.BlockSpec(shape, index)


def kv_head(h, groups):
  """GQA: query head h reads kv head h // G, never a repeated copy."""
  return h // groups


def _inputs(q, k, v, ex):
  """The kernels' common inputs: q, k, v and the per-call arrays, the
  hoisted ones made at least 1-d (Triton has no 0-d blocks)."""
  arrays = {"q": q, "k": k, "v": v}
  arrays.update({n: ex[n] for n in ("q_pos", "q_seg", "k_seg", "slopes",
                                    "sinks") if ex.get(n) is not None})
  arrays.update(ex["lists"])
  arrays["consts"] = tuple(jnp.reshape(c, (-1,))
                           for c in ex["floats"] + ex["fixed"])
  return arrays


def _query_grid_specs(bq, dh, dv, tq_pad, tk_pad, g) -> dict:
  """The blocks a program of the (query block i, batch b, head h) grid
  reads, shared by the forward and dq kernels: its q block, the whole of
  its kv head's k and v (kv head h // G), and the position and segment
  rows."""
  kv = lambda i, b, h: (b, kv_head(h, g), 0, 0)
  return {
      "q": _block((None, None, bq, dh), lambda i, b, h: (b, h, i, 0)),
      "k": _block((None, None, tk_pad, dh), kv),
      "v": _block((None, None, tk_pad, dv), kv),
      "q_pos": _block((None, tq_pad), lambda i, b, h: (b, 0)),
      "q_seg": _block((None, tq_pad), lambda i, b, h: (b, 0)),
      "k_seg": _block((None, tk_pad), lambda i, b, h: (b, 0)),
  }


def _forward(static, q, k, v, ex):
  """q `[B,H,Tq',Dh]`, k `[B,K,Tk',Dh]`, v `[B,K,Tk',Dv]` -> out
  `[B,H,Tq',Dv]`, lse `[B,H,Tq']` float32."""
  spec = static[0]
  b, h, tq_pad, dh = q.shape
  tk_pad, dv = k.shape[2], v.shape[3]
  g, bq = spec.groups, spec.bq
  specs = _query_grid_specs(bq, dh, dv, tq_pad, tk_pad, g)
  outs = [(jax.ShapeDtypeStruct((b, h, tq_pad, dv), v.dtype),
           _block((None, None, bq, dv), lambda i, b, h: (b, h, i, 0))),
          (jax.ShapeDtypeStruct((b, h, tq_pad), jnp.float32),
           _block((None, None, bq), lambda i, b, h: (b, h, i)))]
  return _call(kernels.forward_kernel, (tq_pad // bq, b, h),
               _inputs(q, k, v, ex), specs, outs, static)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attend(static, q, k, v, ex):
  return _forward(static, q, k, v, ex)[0]


def _attend_fwd(static, q, k, v, ex):
  out, lse = _forward(static, q, k, v, ex)
  # Residuals: the inputs and O(T) statistics, never a [Tq, Tk] array.
  return out, (q, k, v, ex, out, lse)


def _attend_bwd(static, res, d_out):
  """The cotangents of (q, k, v, ex): the dq kernel (with the slopes' and
  the score_mod arrays' shares per program, summed here) and the dk/dv
  kernel; the sinks' from lse outside any kernel."""
  q, k, v, ex, out, lse = res
  spec = static[0]
  b, h, tq_pad, dh = q.shape
  kh, tk_pad, dv = k.shape[1], k.shape[2], v.shape[3]
  g, bq, bk = spec.groups, spec.bq, spec.bk
  nq, nk = tq_pad // bq, tk_pad // bk
  # delta = dO . O, the softmax Jacobian's row term; empty rows' lse
  # made finite (any finite shift keeps their exp(-inf) = 0).
  delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), -1)
  lse = jnp.where(jnp.isfinite(lse), lse, 0.0)
  arrays = _inputs(q, k, v, ex)
  arrays.update(do=d_out, lse=lse, delta=delta)
  row = lambda i, b, h: (b, h, i)
  specs = {
      **_query_grid_specs(bq, dh, dv, tq_pad, tk_pad, g),
      "do": _block((None, None, bq, dv), lambda i, b, h: (b, h, i, 0)),
      "lse": _block((None, None, bq), row),
      "delta": _block((None, None, bq), row),
  }
  share = lambda n: (
      jax.ShapeDtypeStruct((nq, b, h, n), jnp.float32),
      _block((None, None, None, n), lambda i, b, h: (i, b, h, 0)))
  slopes = ex.get("slopes") is not None
  floats = [jnp.reshape(c, (-1,)) for c in ex["floats"]]
  outs = [(jax.ShapeDtypeStruct(q.shape, q.dtype),
           _block((None, None, bq, dh), lambda i, b, h: (b, h, i, 0)))]
  outs += [share(1)] * slopes + [share(c.size) for c in floats]

  def dq_body(refs, dq_ref, *rest, **kw):
    kernels.dq_kernel(refs, dq_ref, rest[0] if slopes else None,
                      rest[slopes:], **kw)
  dq, *shares = _call(dq_body, (nq, b, h), arrays, specs, outs, static)

  specs = {
      "q": _block((None, g, tq_pad, dh), lambda j, b, kh: (b, kh, 0, 0)),
      "do": _block((None, g, tq_pad, dv), lambda j, b, kh: (b, kh, 0, 0)),
      "lse": _block((None, g, tq_pad), lambda j, b, kh: (b, kh, 0)),
      "delta": _block((None, g, tq_pad), lambda j, b, kh: (b, kh, 0)),
      "k": _block((None, None, bk, dh), lambda j, b, kh: (b, kh, j, 0)),
      "v": _block((None, None, bk, dv), lambda j, b, kh: (b, kh, j, 0)),
      "q_pos": _block((None, tq_pad), lambda j, b, kh: (b, 0)),
      "q_seg": _block((None, tq_pad), lambda j, b, kh: (b, 0)),
      "k_seg": _block((None, tk_pad), lambda j, b, kh: (b, 0)),
  }
  outs = [(jax.ShapeDtypeStruct(k.shape, k.dtype),
           _block((None, None, bk, dh), lambda j, b, kh: (b, kh, j, 0))),
          (jax.ShapeDtypeStruct(v.shape, v.dtype),
           _block((None, None, bk, dv), lambda j, b, kh: (b, kh, j, 0)))]
  dk, dv_ = _call(kernels.dkv_kernel, (nk, b, kh), arrays, specs, outs,
                  static)

  d_ex = {n: None for n in ex}
  d_ex["lists"] = {n: None for n in ex["lists"]}
  d_ex["fixed"] = tuple(None for _ in ex["fixed"])
  if slopes:
    d_ex["slopes"] = jnp.sum(shares.pop(0), (0, 1, 3)).astype(
        ex["slopes"].dtype)
  d_ex["floats"] = tuple(jnp.sum(s, (0, 1, 2)).reshape(c.shape).astype(
      c.dtype) for s, c in zip(shares, ex["floats"]))
  if ex.get("sinks") is not None:
    # The sink column's probability is exp(sink - lse) and its dP is 0
    # (it has no value): d sink = -sum over rows of P_sink * delta.
    p_sink = jnp.exp(ex["sinks"][None, :, None] - lse)  # [B, H, Tq']
    d_ex["sinks"] = -jnp.sum(p_sink * delta, (0, 2)).astype(
        ex["sinks"].dtype)
  return dq, dk, dv_, d_ex


_attend.defvjp(_attend_fwd, _attend_bwd)


def pallas_gpu_attention(q, k, v, *, is_causal=False,
                         rules=score_rules.NO_RULES, block_q=None,
                         block_k=None, interpret=None):
  """The kernel on q `[B, Tq, H, Dh]`, k `[B, Tk, K, Dh]`, v `[B, Tk, K,
  Dv]` (validate with `attention.check_attend_inputs`, or call `attend(...,
  implementation="pallas_gpu")`); returns out `[B, Tq, H, Dv]` in v's
  dtype.

  `rules.block_mask` (block_mask.create) drives the walk, on its own block
  lengths: its empty blocks are never visited, its full ones skip
  mask_mod. Without one, `block_q` / `block_k` (None: `default_block`;
  a given one is clipped to the length) and the blocks the causal rule and the window
  hide are skipped. `interpret` (None: off GPU) runs Pallas' interpreter.
  """
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
  bm = rules.block_mask
  if bm is not None:
    for name, val, want, length in (("block_q", block_q, bm.q_block,
                                     q.shape[1]),
                                    ("block_k", block_k, bm.kv_block,
                                     k.shape[1])):
      if val is not None and min(val, length) != want:
        raise ValueError(f"pallas_gpu_attention: `{name}`={val} differs "
                         f"from the block mask's {want}")
    block_q, block_k = bm.q_block, bm.kv_block
  b, tq, h, dh = q.shape
  tk, kh, dv = k.shape[1], k.shape[2], v.shape[3]
  # Default blocks are powers of two >= 16 (Triton's), padded over a
  # short length rather than clipped to it (decoding: Tq = 1).
  bq = (default_block(tq, BLOCK_Q) if block_q is None
        else min(block_q, tq))
  bk = (default_block(tk, BLOCK_K) if block_k is None
        else min(block_k, tk))
  why = unsupported(head_dim=dh, value_dim=dv, block_q=bq, block_k=bk,
                    dtypes=tuple(jnp.dtype(x.dtype).name for x in (q, k, v)),
                    mask=False, bias=False, interpret=interpret)
  if why is None and not interpret:
    why = rules_problem(rules)
  if why:
    raise ValueError(f"attend(implementation='pallas_gpu'): {why}")
  tq_pad, tk_pad = -(-tq // bq) * bq, -(-tk // bk) * bk
  score_fn, mask_fn, floats, (score_fixed, mask_fixed) = user_rules(rules)
  fixed = score_fixed + mask_fixed
  spec = kernels.Spec(
      tq=tq, tk=tk, bq=bq, bk=bk, groups=h // kh, is_causal=bool(is_causal),
      rules=score_rules.builtin_static(rules),
      scale=score_rules.scale_of(rules, dh),
      default_q_pos=rules.q_positions is None, padded_keys=tk_pad != tk,
      score_mod=score_fn, mask_mod=mask_fn, n_float=len(floats),
      n_mask=len(mask_fixed),
      const_shapes=tuple(jnp.shape(c) for c in floats + fixed))
  lists = plan(spec, bm, tq_pad // bq, tk_pad // bk, kh)
  pad = lambda x, axis, size: jnp.pad(
      x, [(0, size - x.shape[axis]) if a == axis else (0, 0)
          for a in range(x.ndim)])
  # Padded query rows repeat the last real row's position and segment
  # (their output is dropped); padded keys are masked by position.
  edge = lambda x, size: None if x is None else jnp.pad(
      jnp.asarray(x, jnp.int32), ((0, 0), (0, size - x.shape[1])),
      mode="edge")
  f32 = lambda x: None if x is None else jnp.asarray(x, jnp.float32)
  ex = {"q_pos": edge(rules.q_positions, tq_pad),
        "q_seg": edge(rules.q_segment_ids, tq_pad),
        "k_seg": edge(rules.kv_segment_ids, tk_pad),
        "slopes": f32(rules.alibi_slopes), "sinks": f32(rules.sinks),
        "lists": lists, "floats": tuple(floats), "fixed": tuple(fixed)}
  qt = pad(q.transpose(0, 2, 1, 3), 2, tq_pad)  # [B, H, Tq', Dh]
  kt = pad(k.transpose(0, 2, 1, 3), 2, tk_pad)  # [B, K, Tk', Dh]
  vt = pad(v.transpose(0, 2, 1, 3), 2, tk_pad)  # [B, K, Tk', Dv]
  rows, heads = lists["part_num"].shape[:2]
  out = _attend((spec, bool(interpret), rows, heads), qt, kt, vt, ex)
  return out[:, :, :tq].transpose(0, 2, 1, 3)  # [B, Tq, H, Dv]


def limits(call, device) -> str | None:
  """Why the kernel cannot take `call` (a `call.Call`) on `device` (None
  when it can): one dtype, no dense mask or bias, and on a GPU the Triton
  lowering's widths (`pallas_gpu_plan.unsupported`; its default blocks
  always suit Triton, a block mask's own and the rules' primitives are
  `pallas_gpu_plan.rules_problem`'s). Off GPU it runs interpreted, where
  any width goes."""
  return unsupported(head_dim=call.head_dim, value_dim=call.value_width,
                     block_q=BLOCK_Q, block_k=BLOCK_K, dtypes=call.dtypes,
                     mask=call.mask_dims is not None,
                     bias=call.bias_dims is not None,
                     interpret=device.backend != "gpu")


def attend_pallas_gpu(q, k, v, mask, bias, keep, *, is_causal, dropout_rate,
                      rules=score_rules.NO_RULES):
  """The path "pallas_gpu": the kernel's output, weights None (its
  `limits` were checked by `attend`)."""
  del dropout_rate, keep, mask, bias  # None: the record refuses them
  return pallas_gpu_attention(q, k, v, is_causal=is_causal,
                              rules=rules), None


PALLAS_GPU = attention_path.AttentionPath(
    name="pallas_gpu", fn=attend_pallas_gpu, limits=limits,
    computes="a Pallas GPU kernel (Triton) with the user's score_mod and "
    "mask_mod traced in and the block mask's empty blocks skipped; "
    "interpret mode off GPU")
