"""One training loop for every experiment: pure steps, jit at the call site.

Shape letters: B batch, T length, V classes (vocabulary), O output features.

`TrainState` is a pytree (step, params, optimizer state, dropout key) with
the model's `nnx.GraphDef` and the optax transformation as static fields,
so `train_step(state, batch)` and `eval_step` are pure functions: they
`nnx.merge` the model inside, and the caller applies
`jax.jit(train_step, donate_argnums=0)`.

Determinism: the batch of step s is drawn from `fold_in(data_key, s)` and
the dropout key of step s is `fold_in(state.rng, s)`, so the whole run is
a function of (config, seed). A run resumed from a checkpoint therefore
replays exactly the steps it missed and ends with bit-identical parameters
(on CPU) to a run that was never stopped.

Progress: a console line right after the first step (its seconds, mostly
compiling), then one every `train.log_every` steps with the metrics and
at least one every `QUIET_S` seconds; the steps per second and the ETA
count only the steps after the first, less the first evaluation's
compile, so that compilation does not inflate the estimate.
"""

from __future__ import annotations

import contextlib
import functools
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import ml_collections
import optax
from absl import logging
from flax import nnx
from flax import struct

from mha_jax.core import precision
from mha_jax.training import checkpoint
from mha_jax.training import config as config_lib
from mha_jax.parallel import sharding
from mha_jax.training import tasks
from mha_jax.training import workdir as workdir_lib
from mha_jax.models import transformer

# Separate PRNG streams derived from the one seed.
_INIT, _DATA, _EVAL, _DROPOUT = range(4)


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


def make_optimizer(train_cfg) -> optax.GradientTransformation:
  """AdamW with linear warmup, cosine decay and global-norm clipping."""
  tr = train_cfg
  return _optimizer(tr.learning_rate, tr.warmup_steps, tr.num_steps,
                    tr.end_lr_fraction, tr.weight_decay, tr.b1, tr.b2,
                    tr.grad_clip)


# Memoised so that equal settings give the SAME transformation object: it is
# a static field of TrainState, and jit reuses a compiled step only when the
# static fields compare equal (an optax transformation compares its
# functions by identity), so several seeds in one process compile once.
# A module-level cache rather than one the caller holds, because every
# TrainState (`create_train_state`, `load_state`) must get the same object
# without a caller threading it through. Keyed by the eight numbers;
# bounded at 64 settings (the least recently used is dropped, and a
# dropped setting's next state compiles its step again). What a user can
# observe: `make_optimizer` returns one immutable object for equal
# settings; never a different number.
@functools.lru_cache(maxsize=64)
def _optimizer(learning_rate, warmup_steps, num_steps, end_lr_fraction,
               weight_decay, b1, b2, grad_clip):
  tr = ml_collections.ConfigDict(locals())
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=tr.learning_rate,
      warmup_steps=tr.warmup_steps, decay_steps=tr.num_steps,
      end_value=tr.learning_rate * tr.end_lr_fraction)
  # Decay matrices only: shrinking LayerNorm scales and biases has no
  # regularising meaning.
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
  adamw = optax.adamw(schedule, b1=tr.b1, b2=tr.b2,
                      weight_decay=tr.weight_decay, mask=decay_mask)
  if tr.grad_clip > 0:
    return optax.chain(optax.clip_by_global_norm(tr.grad_clip), adamw)
  return adamw


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
  key = seed_key(config.train.seed, _INIT)
  model = config_lib.build_model(config, nnx.Rngs(params=key))
  graphdef, params = nnx.split(model)
  tx = make_optimizer(config.train)
  return TrainState(
      step=jnp.zeros((), jnp.int32), params=params,
      opt_state=tx.init(params), rng=seed_key(config.train.seed, _DROPOUT),
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


def _fmt_time(seconds: float) -> str:
  seconds = int(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


# The longest a run goes without a console line after its first step: a
# line comes every `log_every` steps, or sooner when those take longer.
QUIET_S = 10.0


def pace(done: int, total: int, first: int, seconds: float):
  """`(steps per second, seconds left)` when `seconds` of wall time were
  spent on steps `first + 1 .. done`, i.e. after step `first`, the one
  that compiled (timing it would put compilation into the estimate);
  `(None, None)` while no step after it has run."""
  if done <= first or seconds <= 0:
    return None, None
  rate = (done - first) / seconds
  return rate, (total - done) / rate


def _fmt_pace(done, total, first, seconds) -> str:
  rate, left = pace(done, total, first, seconds)
  if rate is None:
    return "ETA after the next step"
  return f"{rate:.1f} steps/s | ETA {_fmt_time(left)}"


def _fmt_metrics(row) -> str:
  return " | ".join(f"{k} {v:.4f}" for k, v in row.items()
                    if k not in ("step", "split"))


def _append_metrics(path: pathlib.Path, step: int, split: str, metrics):
  row = {"step": step, "split": split}
  row.update({k: float(v) for k, v in jax.device_get(metrics).items()})
  if jax.process_index() == 0:  # many hosts share one workdir: one writer
    with path.open("a") as f:
      f.write(json.dumps(row) + "\n")
  return row


def evaluate(state, config, eval_step_fn=None, make=None):
  """Mean metrics over `train.eval_batches` fixed held-out batches."""
  eval_step_fn = eval_step_fn or eval_step_jit
  make = make or batch_fn(config)
  rows = [eval_step_fn(state, make(jax.random.fold_in(
      seed_key(config.train.seed, _EVAL), i)))
          for i in range(config.train.eval_batches)]
  return jax.tree.map(lambda *xs: jnp.mean(jnp.stack(xs)), *rows)


def train_and_evaluate(config, workdir, *, stop_at: int | None = None):
  """Train per `config`, writing metrics and checkpoints into `workdir`.

  Restarting with the same `workdir` resumes from the latest checkpoint.
  `stop_at` ends the run before that step WITHOUT a final checkpoint, as a
  kill would (tests use it to check that resuming loses nothing).
  Returns the final `TrainState`. While it runs, a second call on the same
  `workdir` (from any process) raises `workdir.WorkdirInUse` naming it.
  """
  config_lib.validate_config(config)
  # No process-wide setting is made here (a caller's process stays as it
  # was): the entry points that train apply host_memory.keep_freed_memory.
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  # One run per workdir (on the host that writes it): a second command
  # on the same folder is refused instead of racing this one.
  # Every step and evaluation is traced under the run's matmul precision.
  with (workdir_lib.lock(workdir) if jax.process_index() == 0
        else contextlib.nullcontext()), precision.setting_context(
            config.train.get("matmul_precision", "")):
    return _train_and_evaluate(config, workdir, stop_at)


def _train_and_evaluate(config, workdir, stop_at):
  if jax.process_index() == 0:
    (workdir / "config.json").write_text(
        config.to_json_best_effort(indent=2))
  tr = config.train
  mesh = sharding.mesh_from_config(config)
  state = create_train_state(config)
  logging.info("Mesh %s over %d devices", dict(mesh.shape), mesh.size)
  if mesh.size > 1:
    # Params and optimizer state by name rules; a checkpoint restores into
    # these shardings whatever mesh it was saved from.
    state = sharding.shard_tree(state, mesh)
  manager = checkpoint.make_manager(workdir, tr.checkpoint_every,
                                    tr.max_checkpoints)
  state = checkpoint.restore_latest(manager, state)
  start = int(state.step)
  metrics_path = workdir / "metrics.jsonl"
  if jax.process_index() == 0:
    checkpoint.truncate_metrics(metrics_path, start)
  if start:
    logging.info("Resumed from the checkpoint at step %d", start)

  step_fn, eval_fn, make = step_fns(config, mesh)
  data_key = seed_key(tr.seed, _DATA)
  total = tr.num_steps
  t_start = time.time()
  # The first step of this process compiles; the pace counts from its end,
  # less the seconds the first evaluation spends compiling its own step.
  first, t_first, compiling = None, 0.0, 0.0
  t_line = t_start
  for step in range(start, total):
    if stop_at is not None and step >= stop_at:
      break
    state, metrics = step_fn(state, make(jax.random.fold_in(data_key, step)))
    done = step + 1
    logged = done % tr.log_every == 0 or done == total
    row = (_append_metrics(metrics_path, done, "train", metrics) if logged
           else None)
    if first is None:
      # A line within seconds of the start, whatever log_every is.
      shown = row or {k: float(v) for k, v in
                      jax.device_get(metrics).items()}  # waits for it
      first, t_first = done, time.time()
      t_line = t_first
      logging.info("step %d/%d | %s | first step %.1f s, compile included",
                   done, total, _fmt_metrics(shown), t_first - t_start)
    elif logged or time.time() - t_line >= QUIET_S:
      jax.block_until_ready(metrics)
      t_line = time.time()
      progress = _fmt_pace(done, total, first,
                           t_line - t_first - compiling)
      if row is None:  # a line between metric rows: the pace alone
        logging.info("step %d/%d | %s", done, total, progress)
      else:
        logging.info("step %d/%d | %s | %s", done, total, _fmt_metrics(row),
                     progress)
    if done % tr.eval_every == 0 or done == total:
      t_eval = time.time()
      row = _append_metrics(metrics_path, done, "eval",
                            evaluate(state, config, eval_fn, make))
      if not compiling:
        compiling = time.time() - t_eval
      logging.info("eval step %d | %s", done, _fmt_metrics(row))
    checkpoint.save(manager, state, force=done == total)
  checkpoint.close(manager)
  return state


def load_config(workdir) -> ml_collections.ConfigDict:
  """The config a run in `workdir` was started with."""
  text = (pathlib.Path(workdir) / "config.json").read_text()
  return ml_collections.ConfigDict(json.loads(text))


def check_run(workdir) -> pathlib.Path:
  """`workdir` as a path, if it holds a training run with a checkpoint.

  Raises FileNotFoundError saying what is missing (the folder, its
  config.json, or any checkpoint) and, for an experiment's folder, which
  of its sub-folders are runs; it creates nothing.
  """
  workdir = pathlib.Path(workdir)
  if not workdir.is_dir():
    raise FileNotFoundError(f"--workdir={workdir}: no such directory")
  if not (workdir / "config.json").is_file():
    runs = sorted(p.name for p in workdir.iterdir()
                  if (p / "config.json").is_file())
    hint = (f"; its runs are in the sub-folders {', '.join(runs)}" if runs
            else "; train one with python -m experiments.train")
    raise FileNotFoundError(f"--workdir={workdir}: no config.json, so not a "
                            f"training run{hint}")
  ckpt = workdir / "checkpoints"
  if not ckpt.is_dir() or not checkpoint_steps(workdir):
    raise FileNotFoundError(f"--workdir={workdir}: no checkpoint in "
                            f"{ckpt}; train the run (python -m "
                            "experiments.train) before reading it")
  return workdir


def checkpoint_steps(workdir) -> list[int]:
  """The steps of a run's saved checkpoints, sorted (its folder names)."""
  return sorted(int(p.name) for p in
                (pathlib.Path(workdir) / "checkpoints").iterdir()
                if p.name.isdigit())


def load_state(workdir, step: int | None = None):
  """`(TrainState, config)` of a run, from checkpoint `step` (None: latest).

  Step 0 is the state the run started from: runs save no checkpoint there,
  so unless one exists it is rebuilt from the config's seed, as
  `train_and_evaluate` built it (the untrained baseline of an analysis).
  A folder that is not a run with a checkpoint fails by `check_run`.
  """
  config = load_config(check_run(workdir))
  tr = config.train
  state = create_train_state(config)
  manager = checkpoint.make_manager(workdir, tr.checkpoint_every,
                                    tr.max_checkpoints)
  try:
    saved = sorted(manager.all_steps())
    if step is None and not saved:
      raise FileNotFoundError(f"load_state: no checkpoint in {workdir}")
    step = saved[-1] if step is None else step
    if step in saved:
      state = checkpoint.restore(manager, state, step)
    elif step != 0:
      raise FileNotFoundError(f"load_state: `step` {step} has no checkpoint "
                              f"in {workdir}; saved steps: {saved}")
  finally:
    checkpoint.close(manager)
  return state, config


def load_model(workdir, step: int | None = None):
  """`(model, config)`: a run's trained nnx model (analysis, decoding)."""
  state, config = load_state(workdir, step)
  return state.model(), config
