"""Context parallelism: the sequence split over a mesh axis, checked once.

Shape letters: B batch, Tq / Tk query / key length, H query heads, K kv
heads, G = H // K, Dh / Dv widths, N the size of the "sequence" axis,
C = T / N the tokens one device holds.

Two ways to attend over a sequence that is split over devices share the
checks and the layout of this module: the ring (`ring.py`, Liu et al.
2023) keeps each device's queries and passes key/value slices around the
devices; all-to-all (`all_to_all.py`, DeepSpeed-Ulysses, Jacobs et al.
2023) trades the sequence split for a head split around attention.

Where the mesh has them, the batch stays split over "data" and the heads
over "model" (`sharding.py`), so a ("data", "sequence", "model") mesh runs
all three at once.

Layouts: which tokens device r holds, as positions.
  * "contiguous": tokens r C .. (r + 1) C - 1.
  * "zigzag": the sequence cut into 2N chunks of C / 2; device r holds
    chunks r and 2N - 1 - r. Under a causal mask the early chunk has
    little to attend to and the late one much, so every device does the
    same work (with "contiguous" the last device does N times the first's
    and the others wait for it). The caller puts the tokens in this order
    once (`to_layout`, and `from_layout` back); attention takes each
    token's true position from the layout.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from mha_jax.core import attention
from mha_jax.core import attention_path
from mha_jax.core import score_rules
from mha_jax.parallel import sharding

SEQUENCE = sharding.SEQUENCE
LAYOUTS = ("contiguous", "zigzag")


def _pieces(layout: str) -> int:
  """How many runs of consecutive positions one device's slice holds."""
  return 2 if layout == "zigzag" else 1


def layout_order(length: int, n: int, layout: str) -> np.ndarray:
  """`[T]`: the position of the token at each place of the laid-out
  sequence (device r holds places r C .. (r + 1) C - 1)."""
  if layout == "contiguous":
    return np.arange(length)
  c = length // (2 * n)
  chunks = np.arange(length).reshape(2 * n, c)
  return np.concatenate([np.concatenate([chunks[r], chunks[2 * n - 1 - r]])
                         for r in range(n)])


def to_layout(x, n: int, layout: str, axis: int = 1):
  """Reorder the sequence axis of `x` (natural order) into `layout`."""
  check_layout(x.shape[axis], n, layout, "to_layout")
  if layout == "contiguous":
    return x
  return jnp.take(x, layout_order(x.shape[axis], n, layout), axis=axis)


def from_layout(x, n: int, layout: str, axis: int = 1):
  """The inverse of `to_layout`: back to natural order."""
  check_layout(x.shape[axis], n, layout, "from_layout")
  if layout == "contiguous":
    return x
  order = np.argsort(layout_order(x.shape[axis], n, layout))
  return jnp.take(x, order, axis=axis)


def check_layout(length: int, n: int, layout: str, fn: str) -> None:
  if layout not in LAYOUTS:
    raise ValueError(f"{fn}: `layout` must be one of {LAYOUTS}, got "
                     f"{layout!r}")
  parts = n * _pieces(layout)
  if length % parts:
    raise ValueError(f"{fn}: the sequence axis ({n} devices) does not divide"
                     f" the length {length} into {parts} equal chunks "
                     f"(layout={layout!r}); pad the sequence to a multiple "
                     f"of {parts}")


def piece_start(r, piece: int, local_len: int, n: int, layout: str):
  """Position of the first token of run `piece` of device r's slice
  (`r` may be traced)."""
  if layout == "contiguous":
    return r * local_len
  c = local_len // 2
  return r * c if piece == 0 else (2 * n - 1 - r) * c


def local_positions(r, local_len: int, n: int, layout: str):
  """`[C]` int32: the positions of the tokens device r holds."""
  runs = _pieces(layout)
  c = local_len // runs
  return jnp.concatenate([piece_start(r, p, local_len, n, layout)
                          + jnp.arange(c, dtype=jnp.int32)
                          for p in range(runs)]).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class Plan:
  """Static facts of one context-parallel call (hashable)."""
  mesh: object  # Mesh or AbstractMesh
  axis: str  # the sequence axis
  n: int  # its size
  layout: str
  batch_axis: str | None  # "data" when the mesh splits the batch
  head_axis: str | None  # "model" when the mesh splits the heads
  heads: int  # H (global)
  kv_heads: int  # K (global)
  # "split": kv heads split over `head_axis` like the query heads;
  # "pick": K < model size, kv heads replicated and each device picks the
  # one its query heads read.
  kv_mode: str

  @property
  def reduce_axes(self) -> tuple[str, ...]:
    """Axes over which rows vary but head parameters (sinks, ALiBi
    slopes) are shared: their gradients are summed over these."""
    return (self.axis,) + ((self.batch_axis,) if self.batch_axis else ())

  def spec(self, *names):
    """PartitionSpec from axis roles: "b", "t", "h" or None per array axis."""
    role = {"b": self.batch_axis, "t": self.axis, "h": self.head_axis,
            None: None}
    return P(*[role[x] for x in names])

  @property
  def kv_spec(self):
    """k, v `[B, Tk, K, D]`: kv heads split only in "split" mode."""
    return self.spec("b", "t", "h" if self.kv_mode == "split" else None,
                     None)


def current_mesh(mesh, fn):
  """`mesh`, or the one set by `jax.set_mesh`; errors name the way out."""
  if mesh is None:
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or not mesh.axis_names:
      raise ValueError(f"{fn}: no mesh: pass `mesh=` or call inside "
                       "`jax.set_mesh(mesh)` with a mesh that has a "
                       f"{SEQUENCE!r} axis (sharding.make_mesh(sequence=N))")
  return mesh


def plan(mesh, q, k, *, fn, axis=SEQUENCE, layout="contiguous") -> Plan:
  """Check the mesh against q `[B,Tq,H,Dh]`, k `[B,Tk,K,Dh]`; a `Plan`."""
  mesh = current_mesh(mesh, fn)
  shape = dict(mesh.shape)
  if axis not in shape:
    raise ValueError(f"{fn}: the mesh has no {axis!r} axis (its axes: "
                     f"{tuple(mesh.axis_names)}); make one with "
                     f"sharding.make_mesh(sequence=N)")
  n = shape[axis]
  b, tq, h, _ = q.shape
  tk, kh = k.shape[1], k.shape[2]
  check_layout(tq, n, layout, fn)
  if tk != tq:
    check_layout(tk, n, layout, fn)
  batch_axis = sharding.DATA if shape.get(sharding.DATA, 1) > 1 else None
  if batch_axis and b % shape[batch_axis]:
    raise ValueError(f"{fn}: batch B={b} does not split over the "
                     f"{shape[batch_axis]} devices of the {batch_axis!r} axis")
  head_axis = sharding.MODEL if shape.get(sharding.MODEL, 1) > 1 else None
  kv_mode = "split"
  if head_axis:
    m = shape[head_axis]
    if h % m:
      raise ValueError(f"{fn}: H={h} query heads do not split over the {m} "
                       f"devices of the {head_axis!r} axis")
    if kh % m:
      # Each device's H / m query heads must then read one kv head.
      if (h // kh) % (h // m):
        raise ValueError(f"{fn}: K={kh} kv heads neither split over the {m} "
                         f"devices of {head_axis!r} nor serve each device's "
                         f"{h // m} query heads with one kv head")
      kv_mode = "pick"
  return Plan(mesh=mesh, axis=axis, n=n, layout=layout,
              batch_axis=batch_axis, head_axis=head_axis, heads=h,
              kv_heads=kh, kv_mode=kv_mode)


def local_kv(plan_, k):
  """Inside shard_map: in "pick" mode the one kv head `[B, C, 1, D]` this
  device's query heads read; otherwise k unchanged."""
  if plan_.kv_mode != "pick":
    return k
  m = plan_.mesh.shape[plan_.head_axis]
  first_head = jax.lax.axis_index(plan_.head_axis) * (plan_.heads // m)
  group = plan_.heads // plan_.kv_heads
  return jax.lax.dynamic_slice_in_dim(k, first_head // group, 1, axis=2)


def key_mask(mask, batch: int, kv_len: int, fn: str):
  """A mask that depends on the key only (`[B?, 1?, 1?, Tk]`, e.g.
  `masks.padding_mask`) as `[B, Tk]` bool, or None. Any other mask is an
  O(Tq Tk) array, which context parallelism exists to avoid: refused."""
  if mask is None:
    return None
  shape = (1,) * (4 - jnp.ndim(mask)) + tuple(jnp.shape(mask))
  if shape[1] != 1 or shape[2] != 1 or shape[3] != kv_len:
    raise ValueError(f"{fn}: `mask` of shape {tuple(jnp.shape(mask))} "
                     "varies over queries or heads (a [Tq, Tk] array); only "
                     "key masks [B, 1, 1, Tk] travel with the keys. Use "
                     "is_causal, rules.local_window or segment ids, which "
                     "are applied per block from positions")
  return jnp.broadcast_to(jnp.reshape(mask, (shape[0], kv_len)),
                          (batch, kv_len))


def refuse_bias(bias, fn):
  """The one option the context-parallel paths refuse that is not a rule
  option (their records refuse those, and dropout)."""
  if bias is not None:
    raise ValueError(f"{fn}: `bias` is a [Tq, Tk] array, which context "
                     "parallelism exists to avoid; express it as a rule "
                     "(ALiBi: rules.alibi_slopes) or use implementation="
                     "'flash' on one device")


# The rule options of the context-parallel paths: the blockwise kernel's,
# less query positions (positions come from the sequence layout; decoding
# with a cache runs on one device's path) and the user rules (a rule of
# (q_idx, kv_idx) would need the global indices of each device's block).
RULES = attention_path.EVERY_RULE - {"q_positions", *score_rules.USER_FIELDS}


def check_common(q, k, v, mask, rules, path, fn):
  """`attend`'s shape, dtype and rule checks for the registered path
  `path` ("ring", "all_to_all"): its record refuses what it cannot take."""
  attention.check_attend_inputs(q, k, v, mask, None, path, fn=fn,
                                rules=rules)
