"""Training loop: one step per model/task, overfitting, exact resume."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import default
from mha_jax import tasks
from mha_jax import train


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
  return train.eval_step(state, batch), train.apply_model(state.model(), batch)


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
  state = train.create_train_state(c)
  batch = train.batch_fn(c)(jax.random.PRNGKey(0))
  before = jax.tree.map(np.asarray, state.params)
  new, _ = train.train_step_jit(state, batch)  # lr(0) = 0: warmup
  new, metrics = train.train_step_jit(new, batch)
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
  state = train.create_train_state(c)
  batch = train.batch_fn(c)(jax.random.PRNGKey(1))
  step = train.train_step_jit
  state, first = step(state, batch)
  for _ in range(c.train.num_steps - 1):
    state, metrics = step(state, batch)
  assert float(first["loss"]) > 1.5
  assert float(metrics["loss"]) < 0.05
  assert float(metrics["accuracy"]) == 1.0


def _rows(workdir):
  return [json.loads(line)
          for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_resumed_run_equals_uninterrupted_run(tmp_path):
  c = _small(name="copy")
  c.model.dropout_rate = 0.1  # the dropout keys must be replayed too
  full = train.train_and_evaluate(c, tmp_path / "full")
  # Killed after step 8: the last checkpoint is step 5, so 6..8 are redone.
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
  # The saved run loads back as a model with the trained parameters.
  model, config = train.load_model(tmp_path / "resumed")
  assert config.model.d_model == 16
  assert _equal_trees(nnx.state(model), resumed.params)


def test_learning_rate_schedule_follows_config():
  """Adam on a constant gradient moves each weight by exactly -lr(step)."""
  c = _small()
  c.train.update(learning_rate=0.5, warmup_steps=4, end_lr_fraction=0.1,
                 weight_decay=0.0)
  tx = train.make_optimizer(c.train)
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
