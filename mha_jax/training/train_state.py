"""The training state and the pure steps over it; jit at the call site.

Shape letters: B batch, T length, V classes (vocabulary), O output features.

`TrainState` is a pytree (step, params, optimizer state, dropout key) with
the model's `nnx.GraphDef` and the optax transformation as static fields,
so `train_step(state, batch)` and `eval_step` are pure functions: they
`nnx.merge` the model inside, and the caller applies
`jax.jit(train_step, donate_argnums=0)` (or takes `train_step_jit`).
`step_fns` hands the loop the steps and batches for a mesh; `evaluate`
averages the held-out batches. The loop itself is `train.py`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx
from flax import struct

from mha_jax.training import config as config_lib
from mha_jax.training import optimizer
from mha_jax.parallel import sharding
from mha_jax.training import tasks
from mha_jax.models import transformer

# Separate PRNG streams derived from the one seed.
INIT, DATA, EVAL, DROPOUT = range(4)


class TrainState(struct.PyTreeNode):
  """Everything a step changes, plus the static pieces to rebuild the model."""
  step: jax.Array  # int32 scalar, optimizer steps taken
  params: nnx.State  # the model's nnx.Param state
  opt_state: optax.OptState
  rng: jax.Array  # uint32[2] base key for dropout
  graphdef: nnx.GraphDef = struct.field(pytree_node=False)
  tx: optax.GradientTransformation = struct.field(pytree_node=False)
  loss: str = struct.field(pytree_node=False, default="xent")

  def model(self):
    """The nnx model with the current parameters."""
    return nnx.merge(self.graphdef, self.params)


def seed_key(seed: int, stream: int) -> jax.Array:
  return jax.random.fold_in(jax.random.PRNGKey(seed), stream)


def apply_model(model, batch, **kwargs):
  """Call a DecoderLM or EncoderDecoder on a task batch."""
  if isinstance(model, transformer.EncoderDecoder):
    return model(batch["inputs"], batch["decoder_inputs"], **kwargs)
  return model(batch["inputs"], **kwargs)


def compute_loss(model, batch, loss: str, **kwargs):
  """Masked mean loss and metrics; `kwargs` go to the model call.

  "xent": cross-entropy of logits `[B, T, V]` against int targets `[B, T]`;
  "mse": squared error of `[B, T, O]` against float targets, averaged
  over O. Both average over positions where `loss_mask` is 1.
  Returns `(loss, {"loss", "accuracy" (xent only)})`.
  """
  out = apply_model(model, batch, **kwargs)
  mask = batch["loss_mask"]
  denom = jnp.maximum(jnp.sum(mask), 1.0)
  metrics = {}
  if loss == "xent":
    logits = out.astype(jnp.float32)
    per_pos = optax.softmax_cross_entropy_with_integer_labels(
        logits, batch["targets"])  # [B, T]
    hit = jnp.argmax(logits, axis=-1) == batch["targets"]
    metrics["accuracy"] = jnp.sum(hit * mask) / denom
  elif loss == "mse":
    err = out.astype(jnp.float32) - batch["targets"]
    per_pos = jnp.mean(jnp.square(err), axis=-1)  # [B, T]
  else:
    raise ValueError(f"compute_loss: unknown `loss`={loss!r}")
  value = jnp.sum(per_pos * mask) / denom
  metrics["loss"] = value
  return value, metrics


def create_train_state(config) -> TrainState:
  """Fresh model and optimizer state for `config` (validated first)."""
  key = seed_key(config.train.seed, INIT)
  model = config_lib.build_model(config, nnx.Rngs(params=key))
  graphdef, params = nnx.split(model)
  tx = optimizer.make_optimizer(config.train)
  return TrainState(
      step=jnp.zeros((), jnp.int32), params=params,
      opt_state=tx.init(params), rng=seed_key(config.train.seed, DROPOUT),
      graphdef=graphdef, tx=tx,
      loss=tasks.get_task(config.task.name).loss)


def train_step(state: TrainState, batch) -> tuple[TrainState, dict]:
  """One AdamW step on `batch`; returns the new state and metrics."""
  # A key, which the model uses as it is (an nnx.Rngs would hold a count
  # that this pure step would have to carry in its state).
  dropout_key = jax.random.fold_in(state.rng, state.step)

  def loss_fn(params):
    model = nnx.merge(state.graphdef, params)
    return compute_loss(model, batch, state.loss, deterministic=False,
                        rngs=dropout_key)

  (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      state.params)
  updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics["grad_norm"] = optax.tree.norm(grads)
  new_state = state.replace(step=state.step + 1, params=params,
                            opt_state=opt_state)
  return new_state, metrics


def eval_step(state: TrainState, batch) -> dict:
  """Metrics on `batch` without dropout and without changing the state."""
  _, metrics = compute_loss(state.model(), batch, state.loss)
  return metrics


def batch_fn(config):
  """A jitted `step_key -> batch` for the config's task."""
  return _batch_fn(ml_collections.FrozenConfigDict(config.task))


# Why a module-level cache: `evaluate` and every run of a process ask for
# the batches of a task again, and a fresh `jax.jit` of a fresh partial
# would trace and compile again each time. Keyed by the task section as a
# FrozenConfigDict (hashed and compared by content); bounded at 64 task
# settings, each holding one jitted function and its compiled programs.
# A batch is a pure function of (step key, task section), so what a user
# can observe is only that: equal sections give the same function, and
# compile time.
@functools.lru_cache(maxsize=64)
def _batch_fn(task_cfg):
  make = tasks.get_task(task_cfg.name).make_batch
  return jax.jit(functools.partial(make, cfg=task_cfg))


# Jitted once per process, as `_batch_fn`: JAX's own caches of these key on
# the state's static fields (graphdef, optimizer, loss) and on the shapes,
# dtypes and shardings of the arrays, so a process compiles a step once per
# model and optimizer setting; the steps are pure, so only compile time
# and the programs' memory show.
train_step_jit = jax.jit(train_step, donate_argnums=0)
eval_step_jit = jax.jit(eval_step)


def sharded_train_step(state: TrainState, batch, mesh):
  """`train_step` on a state placed by `sharding.tree_shardings(state, mesh)`.

  GSPMD propagates the layout from the placed inputs (params split on
  heads, batch on "data"); the constraint pins the NEW state to the layout
  of the old one, so step s + 1 sees the shardings step s saw and the
  compiled program is reused, and nothing drifts to replicated.
  """
  new_state, metrics = train_step(state, batch)
  new_state = jax.lax.with_sharding_constraint(
      new_state, sharding.tree_shardings(new_state, mesh))
  return new_state, metrics


sharded_train_step_jit = jax.jit(sharded_train_step, static_argnames="mesh",
                                 donate_argnums=0)


# As `_batch_fn`, keyed also by the mesh (hashed by its devices and axis
# names); bounded at 16.
@functools.lru_cache(maxsize=16)
def _sharded_batch_fn(task_cfg, mesh):
  make = tasks.get_task(task_cfg.name).make_batch
  # Each device draws only its own rows of the global batch (and on many
  # hosts each process only its devices' rows): no host-side split. With a
  # sequence axis, only its own tokens of them.
  ndim = 2 if mesh.shape.get(sharding.SEQUENCE, 1) > 1 else 1
  return jax.jit(functools.partial(make, cfg=task_cfg),
                 out_shardings=sharding.batch_sharding(mesh, ndim))


def _on_mesh(fn, mesh):
  """`fn` run under `jax.set_mesh(mesh)`: context-parallel attention
  ("ring", "all_to_all") finds its mesh there when the step is traced."""
  def run(*args, **kwargs):
    with jax.set_mesh(mesh):
      return fn(*args, **kwargs)
  return run


def step_fns(config, mesh):
  """`(train_step, eval_step, make_batch)` for `mesh`.

  A one-device mesh gets the plain jitted steps (the program of an
  unsharded run, unchanged); a larger one the sharded step and batches
  born split along "data" (and along "sequence" with that axis, where the
  steps run under `jax.set_mesh`).
  """
  if mesh.size == 1:
    return train_step_jit, eval_step_jit, batch_fn(config)
  step = functools.partial(sharded_train_step_jit, mesh=mesh)
  task_cfg = ml_collections.FrozenConfigDict(config.task)
  make = _sharded_batch_fn(task_cfg, mesh)
  if mesh.shape.get(sharding.SEQUENCE, 1) > 1:
    return _on_mesh(step, mesh), _on_mesh(eval_step_jit, mesh), make
  return step, eval_step_jit, make


def evaluate(state, config, eval_step_fn=None, make=None):
  """Mean metrics over `train.eval_batches` fixed held-out batches."""
  eval_step_fn = eval_step_fn or eval_step_jit
  make = make or batch_fn(config)
  rows = [eval_step_fn(state, make(jax.random.fold_in(
      seed_key(config.train.seed, EVAL), i)))
          for i in range(config.train.eval_batches)]
  return jax.tree.map(lambda *xs: jnp.mean(jnp.stack(xs)), *rows)
