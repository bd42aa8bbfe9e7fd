"""Training loop: one step per model/task, overfitting, exact resume, and
the keys of step s (its batch and its dropout masks)."""

import functools
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import ml_collections

from configs import default
from mha_jax.training import tasks
from mha_jax.training import train
from mha_jax.training import optimizer
from mha_jax.training import saved_run
from mha_jax.training import train_state
from mha_jax.training import workdir as workdir_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _small(**task):
  c = default.get_config()
  c.model.update(d_model=16, num_layers=1, num_heads=2)
  c.task.update(batch_size=4, seq_len=12, vocab_size=8, min_segment=2,
                max_segment=4, feature_dim=3, **task)
  c.train.update(num_steps=12, warmup_steps=2, log_every=4, eval_every=6,
                 eval_batches=1, checkpoint_every=5)
  return c


@jax.jit
def _eval_and_outputs(state, batch):
  """eval_step's metrics and the model outputs, in one compiled call."""
  return (train_state.eval_step(state, batch),
          train_state.apply_model(state.model(), batch))


def _equal_trees(a, b):
  return all(jax.tree.leaves(jax.tree.map(
      lambda x, y: bool(np.array_equal(x, y)), a, b)))


@pytest.mark.parametrize("name,model", [
    ("induction", dict()),
    ("copy", dict(attention_only=False, positions="rotary", num_kv_heads=1,
                  dropout_rate=0.1)),
    ("reverse", dict(positions="sinusoidal", use_bias=True)),
    ("two_offset_continuous", dict(positions="none")),
    ("two_offset_token", dict(implementation="vmap")),
])
def test_one_train_step_every_model(name, model):
  c = _small(name=name)
  c.model.update(**model)
  state = train_state.create_train_state(c)
  batch = train_state.batch_fn(c)(jax.random.PRNGKey(0))
  before = jax.tree.map(np.asarray, state.params)
  new, _ = train_state.train_step_jit(state, batch)  # lr(0) = 0: warmup
  new, metrics = train_state.train_step_jit(new, batch)
  assert int(new.step) == 2
  assert np.isfinite(float(metrics["loss"]))
  assert float(metrics["grad_norm"]) > 0
  assert not _equal_trees(before, new.params)
  # The loss is the masked mean of the per-position loss, recomputed here.
  got, out = _eval_and_outputs(new, batch)
  out = np.asarray(out, np.float64)
  y, mask = np.asarray(batch["targets"]), np.asarray(batch["loss_mask"])
  if tasks.get_task(name).loss == "xent":
    logp = out - np.log(np.exp(out).sum(-1, keepdims=True))
    per_pos = -np.take_along_axis(logp, y[..., None], -1)[..., 0]
  else:
    per_pos = ((out - y) ** 2).mean(-1)
  want = (per_pos * mask).sum() / mask.sum()
  np.testing.assert_allclose(got["loss"], want, rtol=1e-5)
  again, _ = _eval_and_outputs(new, batch)  # deterministic: no dropout
  np.testing.assert_array_equal(got["loss"], again["loss"])


def test_tiny_model_overfits_a_fixed_batch():
  c = _small(name="copy")
  c.model.update(d_model=32, num_layers=2, num_heads=4, attention_only=False)
  c.train.update(learning_rate=1e-2, warmup_steps=10, num_steps=100,
                 weight_decay=0.0)
  state = train_state.create_train_state(c)
  batch = train_state.batch_fn(c)(jax.random.PRNGKey(1))
  step = train_state.train_step_jit
  state, first = step(state, batch)
  for _ in range(c.train.num_steps - 1):
    state, metrics = step(state, batch)
  assert float(first["loss"]) > 1.5
  assert float(metrics["loss"]) < 0.05
  assert float(metrics["accuracy"]) == 1.0


def _rows(workdir):
  return [json.loads(line)
          for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _record_batches(monkeypatch):
  """Make `train_and_evaluate` record the batch each step trains on, by step
  number (a list per step: a resumed run redoes some steps)."""
  seen = {}
  real = train_state.step_fns

  def step_fns(config, mesh):
    step, eval_fn, make = real(config, mesh)

    def recording_step(state, batch):
      seen.setdefault(int(state.step), []).append(jax.device_get(batch))
      return step(state, batch)

    return recording_step, eval_fn, make

  monkeypatch.setattr(train_state, "step_fns", step_fns)
  return seen


def test_resumed_run_equals_uninterrupted_run(tmp_path, monkeypatch):
  c = _small(name="copy")
  c.model.dropout_rate = 0.1  # the dropout keys must be replayed too
  seen_full = _record_batches(monkeypatch)
  full = train.train_and_evaluate(c, tmp_path / "full")
  # Killed after step 8: the last checkpoint is step 5, so 6..8 are redone.
  seen_resumed = _record_batches(monkeypatch)
  part = train.train_and_evaluate(c, tmp_path / "resumed", stop_at=8)
  assert int(part.step) == 8
  resumed = train.train_and_evaluate(c, tmp_path / "resumed")
  assert int(resumed.step) == c.train.num_steps
  assert _equal_trees(full.params, resumed.params)  # bit-identical on CPU
  assert _equal_trees(full.opt_state, resumed.opt_state)
  assert _rows(tmp_path / "full") == _rows(tmp_path / "resumed")
  steps = [(r["step"], r["split"]) for r in _rows(tmp_path / "full")]
  assert steps == [(4, "train"), (6, "eval"), (8, "train"), (12, "train"),
                   (12, "eval")]
  # The batch of step s is the task's batch for fold_in(data_key, s), in
  # both runs (bit-identity alone cannot tell: a shared bug would pass).
  make = jax.jit(functools.partial(
      tasks.get_task(c.task.name).make_batch,
      cfg=ml_collections.FrozenConfigDict(c.task)))
  data_key = train_state.seed_key(c.train.seed, train_state.DATA)
  assert sorted(seen_full) == list(range(c.train.num_steps))
  assert sorted(seen_resumed) == list(range(c.train.num_steps))
  assert [len(seen_resumed[s]) for s in range(6, 8)] == [2, 2]  # redone
  for s in range(c.train.num_steps):
    want = make(jax.random.fold_in(data_key, s))
    for got in seen_full[s] + seen_resumed[s]:
      assert _equal_trees(got, want), s
  # ... and differs from step to step.
  assert not np.array_equal(seen_full[0][0]["inputs"],
                            seen_full[1][0]["inputs"])
  # The saved run loads back as a model with the trained parameters.
  model, config = saved_run.load_model(tmp_path / "resumed")
  assert config.model.d_model == 16
  assert _equal_trees(nnx.state(model), resumed.params)
  # Step 0 is the state a run starts from (no checkpoint is saved there);
  # a step without a checkpoint is refused, naming the saved ones.
  start = train.train_and_evaluate(c, tmp_path / "start", stop_at=0)
  initial, _ = saved_run.load_state(tmp_path / "full", 0)
  assert int(initial.step) == 0
  assert _equal_trees(initial.params, start.params)
  assert not _equal_trees(initial.params, full.params)
  with pytest.raises(FileNotFoundError, match=r"`step` 7 .*\[10, 12\]"):
    saved_run.load_state(tmp_path / "full", 7)


def test_dropout_key_of_step_s_is_the_state_key_folded_with_s():
  """train_step's loss at step s equals the loss under the dropout key
  fold_in(state.rng, s), and differs between steps: the masks change from
  step to step and are a function of (seed, step), so a resume replays
  them."""
  c = _small(name="copy")
  c.model.dropout_rate = 0.1  # the config of the resume test: one compile
  state = train_state.create_train_state(c)
  batch = train_state.batch_fn(c)(jax.random.PRNGKey(4))
  # The base key is the seed's own dropout stream.
  np.testing.assert_array_equal(state.rng, jax.random.fold_in(
      jax.random.PRNGKey(c.train.seed), train_state.DROPOUT))

  @jax.jit
  def loss_with_key(params, key):
    model = nnx.merge(state.graphdef, params)
    return train_state.compute_loss(model, batch, state.loss,
                                    deterministic=False, rngs=key)[0]

  losses = {}
  for s in (0, 3):
    at_s = jax.tree.map(jnp.array, state.replace(step=jnp.int32(s)))
    _, metrics = train_state.train_step_jit(at_s, batch)  # donates its copy
    losses[s] = float(metrics["loss"])
    want = loss_with_key(state.params, jax.random.fold_in(state.rng, s))
    # Two compiled programs (the step fuses the loss with its gradient):
    # float32 rounding only, a few ulps.
    np.testing.assert_allclose(losses[s], want, rtol=1e-6, err_msg=str(s))
  # Other masks at another step: the loss moves by far more than rounding.
  assert abs(losses[0] - losses[3]) > 1e-4 * abs(losses[0])
  deterministic = float(train_state.eval_step_jit(state, batch)["loss"])
  assert abs(deterministic - losses[0]) > 1e-4 * abs(losses[0])  # dropout on


def test_learning_rate_schedule_follows_config():
  """Adam on a constant gradient moves each weight by exactly -lr(step)."""
  c = _small()
  c.train.update(learning_rate=0.5, warmup_steps=4, end_lr_fraction=0.1,
                 weight_decay=0.0)
  tx = optimizer.make_optimizer(c.train)
  params = {"w": jnp.zeros((2, 2))}
  grads = {"w": jnp.ones((2, 2))}
  update = jax.jit(tx.update)
  opt_state, moves = tx.init(params), []
  for _ in range(c.train.num_steps + 1):
    updates, opt_state = update(grads, opt_state, params)
    moves.append(float(updates["w"][0, 0]))
  np.testing.assert_allclose(moves[0], 0.0)  # warmup starts at 0
  np.testing.assert_allclose(moves[2], -0.25, rtol=1e-5)  # half way up
  np.testing.assert_allclose(moves[4], -0.5, rtol=1e-5)  # peak
  np.testing.assert_allclose(moves[12], -0.05, rtol=1e-5)  # cosine end


def test_reading_a_folder_that_is_no_run_says_what_it_is(tmp_path):
  """Every reader of a run (load_state, and so generate and explore) names
  what is missing and, for an experiment's folder, its runs; it creates
  nothing."""
  with pytest.raises(FileNotFoundError, match=r"missing: no such directory"):
    saved_run.load_state(tmp_path / "missing")
  (tmp_path / "seed0").mkdir()
  (tmp_path / "seed0" / "config.json").write_text("{}")
  with pytest.raises(FileNotFoundError,
                     match=r"no config\.json.*sub-folders seed0"):
    saved_run.load_model(tmp_path)
  with pytest.raises(FileNotFoundError, match=r"no checkpoint in .*seed0"):
    saved_run.load_state(tmp_path / "seed0")
  assert not (tmp_path / "seed0" / "checkpoints").exists()


def test_generate_on_a_folder_that_is_no_run_exits_with_the_reason(tmp_path):
  """The command line prints the reason, not a traceback, and fails."""
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.generate",
       f"--workdir={tmp_path / 'missing'}"], cwd=ROOT, capture_output=True,
      text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode != 0
  assert "no such directory" in proc.stderr
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


def _truncate_every_file(folder: pathlib.Path) -> None:
  for f in folder.rglob("*"):
    if f.is_file():
      f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 3])


def test_a_damaged_latest_checkpoint_resumes_from_the_one_before(
    tmp_path, caplog):
  """With every file of the newest checkpoint truncated, the run resumes
  from the newest one that restores, says which it skipped and why, keeps
  the damaged one, and ends bit-identical to an uninterrupted run."""
  c = _small(name="copy")
  full = train.train_and_evaluate(c, tmp_path / "full")
  part = train.train_and_evaluate(c, tmp_path / "resumed", stop_at=11)
  ckpts = tmp_path / "resumed" / "checkpoints"
  assert sorted(p.name for p in ckpts.iterdir()) == ["10", "5"]
  _truncate_every_file(ckpts / "10")
  del part
  with caplog.at_level("WARNING"):
    resumed = train.train_and_evaluate(c, tmp_path / "resumed")
  assert "Checkpoint 10 in" in caplog.text and "does not restore" in (
      caplog.text)
  assert "Resumed from checkpoint 5" in caplog.text
  assert (ckpts / "10.unreadable").is_dir()  # kept, not deleted
  assert _equal_trees(full.params, resumed.params)
  assert _rows(tmp_path / "full") == _rows(tmp_path / "resumed")


def test_no_checkpoint_that_restores_fails_by_name(tmp_path):
  c = _small(name="copy")
  train.train_and_evaluate(c, tmp_path, stop_at=11)
  for step in ("5", "10"):
    _truncate_every_file(tmp_path / "checkpoints" / step)
  with pytest.raises(RuntimeError, match=r"no checkpoint in .*checkpoints "
                     r"restores \(step 10: .*; step 5: "):
    train.train_and_evaluate(c, tmp_path)
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
      "10", "5"]  # nothing moved or deleted


def test_a_second_run_on_a_workdir_in_use_is_refused_naming_the_first(
    tmp_path):
  """Two commands on one workdir would interleave their metrics: the
  second is refused while the first holds the lock (any process: flock
  locks open files, not processes), and runs once it is gone."""
  c = _small(name="copy")
  c.train.num_steps = 4
  with workdir_lib.lock(tmp_path):
    with pytest.raises(workdir_lib.WorkdirInUse,
                       match=rf"in use by process {os.getpid()} on "):
      train.train_and_evaluate(c, tmp_path)
  assert not (tmp_path / "metrics.jsonl").exists()  # refused before writing
  train.train_and_evaluate(c, tmp_path)  # free again


def test_a_killed_run_leaves_no_stuck_lock(tmp_path):
  holder = subprocess.Popen(
      [sys.executable, "-c",
       "import sys, time\n"
       "from mha_jax.training import workdir\n"
       "with workdir.lock(sys.argv[1]):\n"
       "  print('held', flush=True)\n"
       "  time.sleep(120)\n", str(tmp_path)],
      cwd=ROOT, stdout=subprocess.PIPE, text=True,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(workdir_lib.WorkdirInUse,
                       match=rf"process {holder.pid} on "):
      with workdir_lib.lock(tmp_path):
        pass
  finally:
    holder.kill()
    holder.wait(timeout=60)
    holder.stdout.close()
  with workdir_lib.lock(tmp_path):  # the kernel freed it with the process
    pass
