"""All-to-all context parallelism (DeepSpeed-Ulysses, Jacobs et al. 2023).

Shape letters: B batch, T length, H query heads, K kv heads, Dh / Dv
widths, N devices on the sequence axis, C = T / N, Hl the query heads one
device holds (H, or H / model with a "model" axis).

Around attention the sequence split is traded for a head split: one
`all_to_all` turns each device's q `[B, C, Hl, Dh]` into `[B, T, Hl / N,
Dh]` (all tokens, a 1/N share of the heads), the blockwise kernel runs
on one device's heads exactly as on one device, and one more all-to-all
turns the output back. Every rule of the kernel then holds unchanged; the
segment ids and a key mask (O(T) ints per device) are gathered whole.
Needs Hl divisible by N. With fewer kv heads than that (K / model not
divisible by N, GQA or MQA) the kv heads are repeated up to Hl before the
swap, which costs their communication at H heads instead of K.

Per layer and device, forward: 4 all-to-alls (q, k, v, out), each sending
(N - 1) / N of the array it swaps; the backward runs their transposes
(all-to-alls again) on the gradients. JAX differentiates it through
`shard_map`. docs/multi_device.md compares it with the ring.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from mha_jax.core import attention_path
from mha_jax.core import score_rules
from mha_jax.core.kernels import flash
from mha_jax.parallel import context


def _local(plan, q, k, v, kmask, q_seg, k_seg, sinks, slopes, *, is_causal,
           rules, block_q, block_k):
  """One device: the swap, the kernel on its heads, the swap back."""
  n, axis = plan.n, plan.axis
  k, v = context.local_kv(plan, k), context.local_kv(plan, v)
  if k.shape[2] % n:
    # Too few kv heads to split: give each query head its own copy.
    group = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
  # [B, C, heads, D] -> [B, T, heads / N, D]: split heads, gather tokens.
  swap = lambda x: lax.all_to_all(x, axis, 2, 1, tiled=True)
  gather = lambda x: None if x is None else lax.all_gather(
      x, axis, axis=1, tiled=True)  # [B, C] -> [B, T]
  local_rules = rules.replace(q_segment_ids=gather(q_seg),
                              kv_segment_ids=gather(k_seg), sinks=sinks,
                              alibi_slopes=slopes)
  kmask = gather(kmask)
  out = flash.flash_attention(
      swap(q), swap(k), swap(v),
      mask=None if kmask is None else kmask[:, None, None, :],
      is_causal=is_causal, rules=local_rules, block_q=block_q,
      block_k=block_k)  # [B, T, Hl / N, Dv]
  return lax.all_to_all(out, axis, 1, 2, tiled=True)  # [B, C, Hl, Dv]


def all_to_all_attention(q, k, v, *, mask=None, is_causal=False,
                         rules=score_rules.NO_RULES, mesh=None, axis=None,
                         block_q=None, block_k=None):
  """Attention with the sequence split over a mesh axis, by all-to-all.

  Args:
    q: `[B, Tq, H, Dh]`; k: `[B, Tk, K, Dh]`; v: `[B, Tk, K, Dv]`, in
      natural order, split over the mesh's sequence axis (batch over
      "data", heads over "model" where the mesh has them). The query heads
      per device must divide by the sequence axis's size.
    mask, is_causal, rules, mesh, axis: as `ring.ring_attention` (a key
      mask only; `bias` and `q_positions` refused).
    block_q, block_k: the kernel's blocks, as `flash.flash_attention`.

  Returns:
    out `[B, Tq, H, Dv]`, split like q.
  """
  fn = "all_to_all_attention"
  context.check_common(q, k, v, mask, rules, "all_to_all", fn)
  plan = context.plan(mesh, q, k, fn=fn, axis=axis or context.SEQUENCE)
  heads = q.shape[2]
  if plan.head_axis:
    heads //= plan.mesh.shape[plan.head_axis]
  if heads % plan.n:
    raise ValueError(f"{fn}: the {heads} query heads per device (H="
                     f"{q.shape[2]}) do not split over the {plan.n} devices "
                     f"of the {plan.axis!r} axis; use ring_attention")
  kmask = context.key_mask(mask, q.shape[0], k.shape[1], fn)
  rows = plan.spec("b", "t")
  # After the swap device (model j, sequence i) holds head block j N + i.
  head_parts = ((plan.head_axis, plan.axis) if plan.head_axis
                else plan.axis)
  static = score_rules.builtin_static(rules)
  local = functools.partial(_local, plan, is_causal=is_causal, rules=static,
                            block_q=block_q, block_k=block_k)
  qspec = plan.spec("b", "t", "h", None)
  int_or_none = lambda x: None if x is None else jnp.asarray(x, jnp.int32)
  return jax.shard_map(
      local, mesh=plan.mesh,
      in_specs=(qspec, plan.kv_spec, plan.kv_spec, rows, rows, rows,
                P(head_parts), P(head_parts)),
      out_specs=qspec, check_vma=False)(
          q, k, v, kmask, int_or_none(rules.q_segment_ids),
          int_or_none(rules.kv_segment_ids), rules.sinks, rules.alibi_slopes)


def attend_all_to_all(q, k, v, mask, bias, keep, *, is_causal, dropout_rate,
                      rules=score_rules.NO_RULES):
  """The `attend` path "all_to_all" (registered by `mha_jax/__init__.py`),
  on the mesh of `jax.set_mesh`."""
  del dropout_rate, keep  # keep is None: the record refuses dropout
  context.refuse_bias(bias, "attend(implementation='all_to_all')")
  return all_to_all_attention(q, k, v, mask=mask, is_causal=is_causal,
                              rules=rules), None


ALL_TO_ALL = attention_path.AttentionPath(
    name="all_to_all", fn=attend_all_to_all, rules=context.RULES,
    computes="all-to-all context parallelism (DeepSpeed-Ulysses): the "
    "sequence split traded for a head split around the blockwise kernel")
