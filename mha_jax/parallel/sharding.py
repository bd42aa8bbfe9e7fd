"""Scale out on JAX's own SPMD machinery: a ("data", "model") device mesh.

Shape letters: B batch, T length, D d_model, H query heads, K kv heads,
Dh per-head width, F MLP hidden width.

Choices (see README, "Multi-device and multi-host runs"):
  * Explicit `NamedSharding`s chosen by rules on parameter NAMES, not Flax
    sharding metadata: the same rules then cover the pure core's params dict,
    an NNX model's state and the optimizer state that mirrors it (optax's
    mu/nu leaves carry the parameter names in their paths).
  * Heads are the tensor-parallel axis. `w_q [D,H,Dh]`, `w_k`, `w_v` are split
    along their head axis and `w_o [H,Dv,D]` along its head axis, so every
    device computes whole heads; the contraction over H in the output
    projection leaves partial sums that ONE all-reduce combines.
  * GQA with fewer kv heads than the model axis (K % model != 0): `w_k`, `w_v`
    are replicated, so each device computes all K kv heads (cheap: K < H) and
    its own query heads read the kv head they need. Query heads must divide
    evenly (H % model == 0), else a clear error.
  * MLP: the up-projection is split along F and the down-projection along F
    (the Megatron pairing: one all-reduce per MLP). Everything else
    (embeddings, norms, biases of the output) is replicated.
  * Batches are split along "data".
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

DATA, SEQUENCE, MODEL = "data", "sequence", "model"


def make_mesh(data: int = -1, model: int = 1, devices=None, *,
              sequence: int = 1) -> Mesh:
  """A `("data", "sequence", "model")` mesh; `data=-1` takes all devices
  left over. The sequence axis (context parallelism, `context.py`) is
  size 1 unless asked for; parameters and batches are replicated over it.
  """
  devices = jax.devices() if devices is None else list(devices)
  n = len(devices)
  for name, val in (("model", model), ("sequence", sequence)):
    if not isinstance(val, int) or val < 1:
      raise ValueError(f"make_mesh: `{name}` must be a positive int, got "
                       f"{val!r}")
  inner = model * sequence
  if data == -1:
    if n % inner:
      raise ValueError(f"make_mesh: `model` x `sequence`={model} x "
                       f"{sequence} does not divide the {n} available "
                       "devices")
    data = n // inner
  if not isinstance(data, int) or data < 1 or data * inner != n:
    raise ValueError(f"make_mesh: mesh data x sequence x model = {data} x "
                     f"{sequence} x {model} must use exactly the {n} "
                     "available devices")
  # Model innermost: its all-reduces run every layer, so its devices are
  # neighbours; the ring's ppermutes next, the data axis outermost (one
  # gradient all-reduce per step).
  grid = np.asarray(devices, dtype=object).reshape(data, sequence, model)
  # Auto axes: GSPMD propagates shardings through unannotated code, so the
  # library's functions run unchanged.
  return Mesh(grid, (DATA, SEQUENCE, MODEL), axis_types=(AxisType.Auto,) * 3)


def _key_name(entry) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(entry, attr):
      return str(getattr(entry, attr))
  return str(entry)


# Module names of the two halves of an MLP. `TransformerBlock` calls them
# `mlp_in` / `mlp_out` (and a gated MLP's gate `mlp_gate`, split on F like
# `mlp_in` so that their product stays on one device); the others are
# common spellings elsewhere.
_MLP_UP = ("mlp_in", "mlp_gate", "up", "up_proj", "gate_proj", "fc1",
           "linear1", "w_in", "wi")
_MLP_DOWN = ("mlp_out", "down", "down_proj", "fc2", "linear2", "w_out", "wo")
# Trailing path entries that are not names: an NNX Variable's payload.
_WRAPPERS = ("value", "raw_value")


def param_spec(path: tuple[str, ...], shape: tuple[int, ...],
               model_size: int) -> P:
  """PartitionSpec of one parameter (or optimizer-state leaf) from its path.

  `path` is the leaf's key path as strings, e.g. `("blocks", "0",
  "attn", "w_q", "value")` in an `nnx.State` or `("mu", ..., "w_q",
  "value")` in AdamW's state; the rules read the last real name and the
  module names above it.
  """
  path = tuple(path)
  while path and path[-1] in _WRAPPERS:
    path = path[:-1]
  name = path[-1] if path else ""
  ndim = len(shape)

  def split(axis):
    if shape[axis] % model_size:
      return P()  # does not divide: replicate (documented for kv heads)
    return P(*[MODEL if i == axis else None for i in range(ndim)])

  if name in ("w_q", "w_k", "w_v") and ndim == 3:
    spec = split(1)
    if name == "w_q" and model_size > 1 and spec == P():
      raise ValueError(f"sharding: {'/'.join(path)} has H={shape[1]} query "
                       f"heads, not divisible by the model axis "
                       f"({model_size}); choose mesh.model dividing num_heads")
    return spec
  if name in ("b_q", "b_k", "b_v") and ndim == 2:
    return split(0)
  if name == "w_o" and ndim == 3:
    return split(0)
  if name == "sinks" and ndim == 1:
    return split(0)  # [H]: each device holds its own heads' sink logits
  up = any(p in _MLP_UP for p in path[:-1])
  down = any(p in _MLP_DOWN for p in path[:-1])
  if up and name == "kernel" and ndim == 2:
    return split(1)  # [D, F] on F: each device makes its own slice of F
  if up and name == "bias" and ndim == 1:
    return split(0)  # [F] follows the kernel's F
  if down and name == "kernel" and ndim == 2:
    return split(0)  # [F, D] on F: partial sums, one all-reduce
  return P()  # embeddings, norms, readout, down bias, step counters


def tree_shardings(tree, mesh: Mesh):
  """NamedShardings for every array leaf of `tree` (params or opt state)."""
  model_size = mesh.shape[MODEL]

  def one(path, leaf):
    shape = tuple(getattr(leaf, "shape", ()))
    names = tuple(_key_name(e) for e in path)
    return NamedSharding(mesh, param_spec(names, shape, model_size))

  return jax.tree_util.tree_map_with_path(one, tree)


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
  """Split the leading (batch) axis over "data", replicate over "model";
  with a sequence axis (size > 1) split the second (tokens) over it."""
  if ndim >= 2 and mesh.shape.get(SEQUENCE, 1) > 1:
    return NamedSharding(mesh, P(DATA, SEQUENCE, *([None] * (ndim - 2))))
  return NamedSharding(mesh, P(DATA, *([None] * (ndim - 1))))


def shard_batch(batch, mesh: Mesh):
  """device_put every array of a batch with its batch axis over "data"."""
  return jax.tree.map(
      lambda x: jax.device_put(x, batch_sharding(mesh, np.ndim(x))), batch)


def shard_tree(tree, mesh: Mesh):
  """device_put params / optimizer state with `tree_shardings`."""
  return jax.device_put(tree, tree_shardings(tree, mesh))


def bytes_per_device(tree) -> dict[str, int]:
  """Total bytes of a sharded tree and the bytes held on each device."""
  per = {}
  total = 0
  for leaf in jax.tree.leaves(tree):
    total += leaf.nbytes
    for shard in leaf.addressable_shards:
      key = str(shard.device)
      per[key] = per.get(key, 0) + shard.data.nbytes
  return {"total": total, "per_device": per}


def mesh_from_config(config, devices=None) -> Mesh:
  """The mesh of `config.mesh`, checked against the model, batch and devices.

  Raises ValueError naming the config field: the mesh must use exactly the
  available devices (`mesh.data=-1` takes what `mesh.model` leaves), and
  `task.batch_size` must split evenly over the data axis.
  """
  ms, heads, batch = config.mesh, config.model.num_heads, config.task.batch_size
  seq = ms.get("sequence", 1)  # configs saved before the axis existed
  devices = jax.devices() if devices is None else list(devices)
  n = len(devices)
  if n % (ms.model * seq):
    field = "model" if n % ms.model else "sequence"
    raise ValueError(f"config.mesh.{field}: mesh.model x mesh.sequence = "
                     f"{ms.model} x {seq} does not divide the {n} available "
                     "devices")
  data = n // (ms.model * seq) if ms.data == -1 else ms.data
  if data * ms.model * seq != n:
    raise ValueError(f"config.mesh.data: mesh.data x mesh.sequence x "
                     f"mesh.model = {data} x {seq} x {ms.model} must use "
                     f"exactly the {n} available devices (-1 takes all that "
                     "mesh.model and mesh.sequence leave)")
  if heads % ms.model:
    raise ValueError(f"config.mesh.model: {ms.model} must divide "
                     f"model.num_heads={heads}")
  if batch % data:
    raise ValueError(f"config.task.batch_size: {batch} does not split over "
                     f"the {data} devices of the mesh's data axis")
  return make_mesh(data, ms.model, devices, sequence=seq)


def shard_model(model, mesh: Mesh):
  """An NNX model whose parameters are placed by `tree_shardings`."""
  graphdef, state = nnx.split(model)
  return nnx.merge(graphdef, shard_tree(state, mesh))
