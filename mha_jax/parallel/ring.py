"""Ring attention (Liu et al. 2023): keys and values travel, queries stay.

Shape letters: B batch, Tq / Tk query / key length, H query heads, K kv
heads, G = H // K, Dh / Dv widths, N devices on the sequence axis, C the
tokens one device holds, P the runs of consecutive positions in its slice
(1 "contiguous", 2 "zigzag"; `context.py`), Tq' / C' padded to whole
blocks.

Each device keeps its C queries and the blockwise kernel's online-softmax
state `(m, l, acc)` for them (`flash_kernel.initial_state`). N times it
visits the key/value slice it holds with `flash_kernel.forward_blocks`,
the kernel's own merge, and passes that slice (with its key mask and
segment ids) to the next device with `ppermute`: after N steps every query
has seen every key and no device ever held more than its own and one
neighbour's slice. The slice in hand at step t came from device (r - t)
mod N, so its positions are known without sending them. Blocks that the
causal rule or a window hides entirely are skipped by the kernel's block
range, and so is a whole slice (with "contiguous" and a causal mask, the
slices from later devices); the "zigzag" layout gives every device the
same work.

The backward (`jax.custom_vjp`) does the same walk:
`flash_kernel.backward_blocks` adds each slice's share of dq locally and
of dk, dv to accumulators that travel with the slice and reach home after
the N-th step. Only the rows' out and lse (O(C) per device) are saved.

Per layer and device, forward: N - 1 sends of one k and v slice, 2 B C K Dh
values (plus C ints of mask/segments); backward: N - 1 such sends and N of
the dk, dv slice (float32). docs/multi_device.md has the bytes.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from mha_jax.core import attention_path
from mha_jax.core import score_rules
from mha_jax.core.kernels import flash
from mha_jax.core.kernels import flash_config
from mha_jax.core.kernels import flash_kernel
from mha_jax.core.kernels import flash_schedule
from mha_jax.parallel import context


@dataclasses.dataclass(frozen=True)
class _Ring:
  """Static facts of one ring call (the custom_vjp's nondiff argument)."""
  plan: context.Plan
  cfg: flash_config.BlockConfig
  offset: int  # Tk - Tq: the bottom-right alignment of query positions
  kv_local: int  # keys per device, Tk / N


def _head_major(x, kh, tq_pad):
  """`[B, C, H, D]` -> `[B, K, G, C', D]`, zero-padded along C."""
  b, c, h, d = x.shape
  x = x.reshape(b, c, kh, h // kh, d).transpose(0, 2, 3, 1, 4)
  return flash.pad_axis(x, 3, tq_pad, 0)


def _token_major(x, c):
  """`[B, K, G, C', D?]` -> `[B, C, H, D?]` (the padding dropped)."""
  x = x[:, :, :, :c]
  b, kh, g = x.shape[:3]
  x = jnp.moveaxis(x, 3, 1)  # [B, C, K, G, D?]
  return x.reshape(b, c, kh * g, *x.shape[4:])


def _slices(x, runs, c_pad):
  """k or v `[B, C, K, D]` -> `[P, B, K, C', D]`: the runs of consecutive
  positions, each head-major and zero-padded to whole key blocks."""
  b, c, kh, d = x.shape
  x = x.reshape(b, runs, c // runs, kh, d).transpose(1, 0, 3, 2, 4)
  return flash.pad_axis(x, 3, c_pad, 0)


def _unslice(x, c):
  """The inverse of `_slices`: `[P, B, K, C', D]` -> `[B, C, K, D]`."""
  runs, b, kh, _, d = x.shape
  x = x[:, :, :, :c // runs].transpose(1, 0, 3, 2, 4)
  return x.reshape(b, c, kh, d)


def _row_slices(x, runs, c_pad):
  """`[B, C]` ints or bools -> `[P, B, C']`, padded with the last value
  (padded keys are excluded by position; None stays None)."""
  if x is None:
    return None
  b, c = x.shape
  x = x.reshape(b, runs, c // runs).transpose(1, 0, 2)
  return jnp.pad(x, ((0, 0), (0, 0), (0, c_pad - c // runs)), mode="edge")


def _runs(ring):
  return 2 if ring.plan.layout == "zigzag" else 1


def _prepare(ring, q, k, v, kmask, q_seg, k_seg, sinks, slopes):
  """One device's inputs in the kernel's layout: head-major q `[B, K, G,
  Tq', Dh]`, the travelling bundle `(k, v, mask, segment ids)` of `[P,
  ...]` slices, and the queries' `flash_config.Extras` (positions from
  the layout)."""
  plan, cfg = ring.plan, ring.cfg
  k, v = context.local_kv(plan, k), context.local_kv(plan, v)
  b, c, h, _ = q.shape
  kh = k.shape[2]
  tq_pad = -(-c // cfg.bq) * cfg.bq
  c_pad = -(-ring.kv_local // _runs(ring) // cfg.bk) * cfg.bk
  r = lax.axis_index(plan.axis)
  q_pos = context.local_positions(r, c, plan.n, plan.layout) + ring.offset
  # Padded query rows repeat the last real row's position and segment, as
  # in `flash_attention` (their output is dropped).
  edge = lambda x: jnp.pad(x, ((0, 0), (0, tq_pad - c)), mode="edge")
  per_head = lambda x, tail: None if x is None else x.astype(
      jnp.float32).reshape((1, kh, h // kh) + tail)
  ex = flash_config.Extras(q_pos=edge(q_pos[None]),
                           q_seg=None if q_seg is None else edge(q_seg),
                           k_seg=None, slopes=per_head(slopes, (1, 1)),
                           sinks=per_head(sinks, (1,)))
  bundle = (_slices(k, _runs(ring), c_pad), _slices(v, _runs(ring), c_pad),
            _row_slices(kmask, _runs(ring), c_pad),
            _row_slices(k_seg, _runs(ring), c_pad))
  return _head_major(q, kh, tq_pad), bundle, ex


def _for_run(ring, ex, bundle, src, run):
  """`(ex, mask)` for run `run` of the slice that came from device `src`:
  its key positions start where the layout puts them."""
  start = context.piece_start(src, run, ring.kv_local, ring.plan.n,
                              ring.plan.layout)
  _, _, kmask, k_seg = bundle
  mask = None if kmask is None else kmask[run][:, None, None, None]
  return ex._replace(k_seg=None if k_seg is None else k_seg[run],
                     k_start=jnp.reshape(start, (1,))), mask


def _source(ring, t):
  """The device whose slice is in hand at step t (sends go r -> r + 1)."""
  return (lax.axis_index(ring.plan.axis) - t) % ring.plan.n


def _send(ring, tree):
  """Every array of `tree` to the next device on the ring."""
  n = ring.plan.n
  perm = [(i, (i + 1) % n) for i in range(n)]
  return jax.tree.map(lambda x: lax.ppermute(x, ring.plan.axis, perm), tree)


def _walk(ring, step, carry, bundle):
  """`carry, bundle = step(t, carry, bundle)` for t = 0 .. N-1, the bundle
  passed on to the next device between steps (not after the last)."""
  def body(t, state):
    carry, bundle = step(t, *state)
    return carry, _send(ring, bundle)

  state = lax.fori_loop(0, ring.plan.n - 1, body, (carry, bundle))
  return step(ring.plan.n - 1, *state)


def _local_forward(ring, q, k, v, kmask, q_seg, k_seg, sinks, slopes):
  """One device: out `[B, C, H, Dv]` and lse `[B, C', H]`."""
  qt, bundle, ex = _prepare(ring, q, k, v, kmask, q_seg, k_seg, sinks,
                            slopes)

  def step(t, state, bundle):
    kt, vt = bundle[:2]
    for run in range(_runs(ring)):
      ex_r, mask = _for_run(ring, ex, bundle, _source(ring, t), run)
      state = flash_kernel.forward_blocks(qt, kt[run], vt[run], mask, None,
                                          ex_r, ring.cfg, state)
    return state, bundle

  state = flash_kernel.initial_state(ex, ring.cfg, qt.shape, v.shape[-1])
  state, _ = _walk(ring, step, state, bundle)
  out, lse = flash_kernel.finish(state, v.dtype)  # [B,K,G,C',Dv], [B,K,G,C']
  return _token_major(out, q.shape[1]), _token_major(lse, lse.shape[3])


def _kv_home(plan, k, dk):
  """dk of this device's kv heads -> dk shaped like its k input. In
  "pick" mode the device used one of the K replicated heads: its gradient
  goes to that head and the devices sharing it are summed."""
  if plan.kv_mode != "pick":
    return dk.astype(k.dtype)
  m = plan.mesh.shape[plan.head_axis]
  head = (lax.axis_index(plan.head_axis) * (plan.heads // m)
          // (plan.heads // plan.kv_heads))
  full = jnp.zeros(k.shape, jnp.float32)
  full = lax.dynamic_update_slice_in_dim(full, dk, head, axis=2)
  return lax.psum(full, plan.head_axis).astype(k.dtype)


def _local_backward(ring, q, k, v, kmask, q_seg, k_seg, sinks, slopes, out,
                    lse, d_out):
  """One device: dq, dk, dv, and d sinks, d slopes summed over the rows of
  every device (None without them)."""
  plan = ring.plan
  cfg = flash_config.backward_cfg(ring.cfg)
  qt, bundle, ex = _prepare(ring, q, k, v, kmask, q_seg, k_seg, sinks,
                            slopes)
  kh, tq_pad = qt.shape[1], qt.shape[3]
  dot = _head_major(d_out, kh, tq_pad)
  b, c_pad, h = lse.shape
  lse_t = lse.reshape(b, c_pad, kh, h // kh).transpose(0, 2, 3, 1)
  delta, lse_t = flash_kernel.row_terms(_head_major(out, kh, tq_pad), lse_t,
                                        dot)
  dq, dk, dv, _, dslopes = flash_kernel.zero_grads(qt, bundle[0], bundle[1],
                                                   None, ex)

  def step(t, carry, bundle):
    dq, dslopes = carry
    kt, vt, kmask, k_seg, dk, dv = bundle
    for run in range(_runs(ring)):
      ex_r, mask = _for_run(ring, ex, bundle[:4], _source(ring, t), run)
      dq, dk_r, dv_r, _, dslopes = flash_kernel.backward_blocks(
          cfg, qt, kt[run], vt[run], mask, None, ex_r, lse_t, delta, dot,
          (dq, dk[run], dv[run], None, dslopes))
      dk, dv = dk.at[run].set(dk_r), dv.at[run].set(dv_r)
    return (dq, dslopes), (kt, vt, kmask, k_seg, dk, dv)

  (dq, dslopes), bundle = _walk(ring, step, (dq, dslopes), bundle + (dk, dv))
  # dk and dv travel with their slice, which the walk leaves one device
  # short of home: one more send.
  dk, dv = _send(ring, bundle[4:])
  dq = _token_major(dq, q.shape[1]).astype(q.dtype)
  dk = _kv_home(plan, k, _unslice(dk, ring.kv_local))
  dv = _kv_home(plan, v, _unslice(dv, ring.kv_local))
  dsinks = None
  if ex.sinks is not None:
    dsinks = lax.psum(
        flash_kernel.sink_grad(ex.sinks, lse_t, delta).reshape(h),
        plan.reduce_axes)
  if dslopes is not None:
    dslopes = lax.psum(dslopes.reshape(h), plan.reduce_axes)
  return dq, dk, dv, dsinks, dslopes


def _specs(ring):
  """PartitionSpecs of `(q, k, v, kmask, q_seg, k_seg, sinks, slopes)`."""
  plan = ring.plan
  rows, heads = plan.spec("b", "t"), plan.spec("h")
  return (plan.spec("b", "t", "h", None), plan.kv_spec, plan.kv_spec, rows,
          rows, rows, heads, heads)


def _shard(ring, fn, in_specs, out_specs):
  return jax.shard_map(functools.partial(fn, ring), mesh=ring.plan.mesh,
                       in_specs=in_specs, out_specs=out_specs,
                       check_vma=False)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8,))
def _ring(q, k, v, kmask, q_seg, k_seg, sinks, slopes, ring):
  return _ring_fwd(q, k, v, kmask, q_seg, k_seg, sinks, slopes, ring)[0]


def _ring_fwd(q, k, v, kmask, q_seg, k_seg, sinks, slopes, ring):
  args = (q, k, v, kmask, q_seg, k_seg, sinks, slopes)
  qspec = _specs(ring)[0]
  out, lse = _shard(ring, _local_forward, _specs(ring),
                    (qspec, P(*qspec[:3])))(*args)
  # Residuals: the inputs and O(T) row statistics, never a [Tq, Tk] array.
  return out, args + (out, lse)


def _ring_bwd(ring, residuals, d_out):
  specs = _specs(ring)
  qspec = specs[0]
  present = lambda x, spec: None if x is None else spec
  sinks, slopes = residuals[6], residuals[7]
  out_specs = (qspec, specs[1], specs[2], present(sinks, specs[6]),
               present(slopes, specs[7]))
  dq, dk, dv, dsinks, dslopes = _shard(
      ring, _local_backward, specs + (qspec, P(*qspec[:3]), qspec),
      out_specs)(*residuals, d_out)
  return dq, dk, dv, None, None, None, dsinks, dslopes


_ring.defvjp(_ring_fwd, _ring_bwd)


def ring_attention(q, k, v, *, mask=None, is_causal=False,
                   rules=score_rules.NO_RULES, mesh=None, axis=None,
                   layout="contiguous", block_q=None, block_k=None):
  """Attention with the sequence split over a mesh axis, by a ring.

  Args:
    q: `[B, Tq, H, Dh]`; k: `[B, Tk, K, Dh]`; v: `[B, Tk, K, Dv]`, the
      sequence axis in `layout` order (`context.to_layout`), split over
      the mesh's sequence axis (the batch over "data", heads over "model"
      where the mesh has them; inputs placed otherwise are moved there).
    mask: a key mask broadcastable to `[B, 1, 1, Tk]` (it travels with the
      keys); any mask over queries is refused.
    is_causal, rules: as `attend` (bottom-right causal rule, windows,
      segment ids, soft cap, sinks, ALiBi, scale, GQA/MQA); `q_positions`
      and `bias` are refused (positions come from the layout).
    mesh: a mesh with a "sequence" axis (`sharding.make_mesh(sequence=N)`);
      None: the one set by `jax.set_mesh`.
    axis: the sequence axis's name (None: "sequence").
    layout: "contiguous" or "zigzag" (`context.py`; balances causal work).
    block_q, block_k: the kernel's blocks, forward and backward (None:
      `flash_schedule.DEFAULT_BLOCK_Q`, `DEFAULT_BLOCK_K` forward and
      `flash_schedule.BACKWARD_BLOCK` backward, the batched kernel's
      choice).

  Returns:
    out `[B, Tq, H, Dv]`, in layout order and split like q.
  """
  fn = "ring_attention"
  context.check_common(q, k, v, mask, rules, "ring", fn)
  plan = context.plan(mesh, q, k, fn=fn, axis=axis or context.SEQUENCE,
                      layout=layout)
  runs = 2 if layout == "zigzag" else 1
  cfg = flash_schedule.block_config(
      q.dtype, q.shape[-1], rules, is_causal, q.shape[1] // plan.n,
      k.shape[1] // plan.n // runs,
      flash_schedule.DEFAULT_BLOCK_Q if block_q is None else block_q,
      flash_schedule.DEFAULT_BLOCK_K if block_k is None else block_k,
      # Blocks given by the caller are used as given in both passes.
      halve_backward=block_q is None and block_k is None)
  ring = _Ring(plan=plan, cfg=cfg, offset=k.shape[1] - q.shape[1],
               kv_local=k.shape[1] // plan.n)
  kmask = context.key_mask(mask, q.shape[0], k.shape[1], fn)
  # The scale is folded into q once outside the ring (the kernel's choice
  # in float32), so autodiff carries it to dq.
  if flash_schedule.prescaled(q.dtype):
    q = q * score_rules.scale_of(rules, q.shape[-1])
  int_or_none = lambda x: None if x is None else jnp.asarray(x, jnp.int32)
  return _ring(q, k, v, kmask, int_or_none(rules.q_segment_ids),
               int_or_none(rules.kv_segment_ids), rules.sinks,
               rules.alibi_slopes, ring)


def attend_ring(q, k, v, mask, bias, keep, *, is_causal, dropout_rate,
                rules=score_rules.NO_RULES):
  """The `attend` path "ring" (registered by `mha_jax/__init__.py`): on the
  mesh of `jax.set_mesh`, with the contiguous layout (a model's tokens
  arrive in natural order)."""
  del dropout_rate, keep  # keep is None: the record refuses dropout
  context.refuse_bias(bias, "attend(implementation='ring')")
  return ring_attention(q, k, v, mask=mask, is_causal=is_causal,
                        rules=rules), None


RING = attention_path.AttentionPath(
    name="ring", fn=attend_ring, rules=context.RULES,
    computes="ring context parallelism: the blockwise kernel on each "
    "device's queries while the key/value blocks travel the mesh's "
    "sequence axis")
