"""A whole model, its training loop, checkpoints and decoding on a 2x4 mesh.

Every check compares the sharded program with the same computation on ONE
device (plain arrays on device 0, the unsharded jitted functions), so the
reference does not share the code under test's sharding path.

Tolerances: sharded matmuls reduce over heads / MLP width / batch in another
order (partial sums per device, then an all-reduce), so float32 results
differ from one device by rounding only: ~1e-7 relative per reduction.
Training compounds that over steps (Adam divides by sqrt(nu), which can
magnify rounding in small gradients), hence the looser bound on parameters
after N steps than on one forward pass. Restoring a checkpoint copies
bytes, so it is checked bit for bit.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import default
from mha_jax.training import checkpoint
from mha_jax.models import generate
from mha_jax.parallel import sharding
from mha_jax.training import train
from mha_jax.training import train_state
from mha_jax.models import transformer

STEPS = 6


def _config(data=2, model=4):
  """A small model WITH MLPs and grouped kv heads, so every rule is used."""
  c = default.get_config()
  c.task.update(name="copy", batch_size=8, seq_len=12, vocab_size=16)
  c.model.update(d_model=32, num_layers=1, num_heads=8, num_kv_heads=4,
                 attention_only=False, positions="rotary", use_bias=True)
  c.train.update(num_steps=STEPS, warmup_steps=1, log_every=1,
                 eval_every=STEPS, eval_batches=1, checkpoint_every=STEPS)
  c.mesh.update(data=data, model=model)
  return c


def _heads_split(w_q):
  """True if `w_q [D, H, Dh]` is laid out split on H over "model"."""
  want = sharding.NamedSharding(w_q.sharding.mesh,
                                sharding.P(None, "model", None))
  return w_q.sharding.is_equivalent_to(want, w_q.ndim)


def _leaves(tree):
  return jax.tree_util.tree_leaves_with_path(tree)


def _assert_trees_close(got, want, **tol):
  for (path, a), (_, b) in zip(_leaves(got), _leaves(want), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **tol,
                               err_msg=jax.tree_util.keystr(path))


@pytest.fixture(scope="module")
def mesh():
  assert jax.device_count() == 8, jax.devices()
  return sharding.make_mesh(data=2, model=4)


@jax.jit
def _loss_and_grad(params, graphdef, batch):
  def loss(p):
    model = nnx.merge(graphdef, p)
    return train_state.compute_loss(model, batch, "xent")[0]
  return jax.value_and_grad(loss)(params)


def test_whole_model_forward_and_grads_equal_one_device(mesh):
  c = _config()
  state = train_state.create_train_state(c)
  batch = train_state.batch_fn(c)(jax.random.PRNGKey(3))
  l1, g1 = _loss_and_grad(state.params, state.graphdef, batch)
  params = sharding.shard_tree(state.params, mesh)
  l2, g2 = _loss_and_grad(params, state.graphdef,
                          sharding.shard_batch(batch, mesh))
  np.testing.assert_allclose(l2, l1, rtol=1e-6)
  _assert_trees_close(g2, g1, rtol=1e-4, atol=1e-6)
  # The gradients come back in the layout of their parameters.
  for (path, g), (_, p) in zip(_leaves(g2), _leaves(params), strict=True):
    assert g.sharding.is_equivalent_to(p.sharding, g.ndim), path


@pytest.mark.parametrize("implementation", ["einsum", "flash"])
def test_attention_variants_sharded_equal_one_device(mesh, implementation):
  # Sliding window, learned sinks (split over heads with the heads), soft
  # cap, QK-norm and ALiBi under the head-parallel rules.
  c = _config()
  c.model.update(positions="alibi", local_window=4, logit_soft_cap=3.0,
                 attention_sinks=True, qk_norm="rms",
                 implementation=implementation)
  state = train_state.create_train_state(c)
  batch = train_state.batch_fn(c)(jax.random.PRNGKey(4))
  l1, g1 = _loss_and_grad(state.params, state.graphdef, batch)
  params = sharding.shard_tree(state.params, mesh)
  sinks = params["blocks"][0]["attn"]["sinks"]
  assert sinks.sharding.is_equivalent_to(
      sharding.NamedSharding(mesh, sharding.P("model")), 1)
  l2, g2 = _loss_and_grad(params, state.graphdef,
                          sharding.shard_batch(batch, mesh))
  np.testing.assert_allclose(l2, l1, rtol=1e-6)
  _assert_trees_close(g2, g1, rtol=1e-4, atol=1e-6)


def test_per_device_bytes_are_total_over_model_axis(mesh):
  state = sharding.shard_tree(train_state.create_train_state(_config()), mesh)
  split = replicated = 0
  for path, leaf in _leaves((state.params, state.opt_state)):
    names = [sharding._key_name(e) for e in path]  # pylint: disable=protected-access
    got = sharding.bytes_per_device(leaf)
    per = set(got["per_device"].values())
    assert len(per) == 1, (names, per)  # every device holds the same bytes
    if "model" in leaf.sharding.spec:
      assert per == {leaf.nbytes // 4}, names
      split += leaf.nbytes
    else:
      assert per == {leaf.nbytes}, names
      replicated += leaf.nbytes
    # What must be split is split: attention heads and both MLP kernels
    # (w_k/w_v too: K = 4 kv heads divide the model axis).
    if names[-2] in ("w_q", "w_k", "w_v", "w_o") or (
        names[-2] == "kernel" and names[-3] in ("mlp_in", "mlp_out")):
      assert "model" in leaf.sharding.spec, names
  total = sharding.bytes_per_device((state.params, state.opt_state))
  assert set(total["per_device"].values()) == {replicated + split // 4}
  assert split > replicated  # the bulk of this model is split


@pytest.fixture(scope="module")
def run_2x4(tmp_path_factory):
  """STEPS training steps through `train_and_evaluate` on the 2x4 mesh."""
  workdir = tmp_path_factory.mktemp("run_2x4")
  state = train.train_and_evaluate(_config(2, 4), workdir)
  return workdir, state


def test_training_steps_on_2x4_equal_one_device(run_2x4):
  workdir, sharded = run_2x4
  c = _config()
  state, make = train_state.create_train_state(c), train_state.batch_fn(c)
  data_key = train_state.seed_key(c.train.seed, train_state.DATA)
  losses = []
  for step in range(STEPS):  # the unsharded loop, on device 0
    state, metrics = train_state.train_step_jit(
        state, make(jax.random.fold_in(data_key, step)))
    losses.append(float(metrics["loss"]))
  assert {d for a in jax.tree.leaves(state.params) for d in a.devices()} == {
      jax.devices()[0]}
  rows = [json.loads(line) for line in
          (workdir / "metrics.jsonl").read_text().splitlines()]
  rows = [r for r in rows if r["split"] == "train"]
  np.testing.assert_allclose([r["loss"] for r in rows], losses, rtol=1e-5)
  _assert_trees_close(sharded.params, state.params, rtol=1e-4, atol=2e-6)
  _assert_trees_close(sharded.opt_state, state.opt_state, rtol=1e-3,
                      atol=1e-8)
  # The state stayed in its layout for all the steps.
  w_q = sharded.params["blocks"][0]["attn"]["w_q"][...]
  assert _heads_split(w_q)


def test_killed_and_resumed_on_2x4_equals_uninterrupted(run_2x4, tmp_path):
  """Stopped after step 5 (checkpoints at 2 and 4) and restarted on the same
  mesh: step 4 is redone and the run ends bit-identical to `run_2x4`, with
  the same metrics rows (the same program, the same batches)."""
  workdir, full = run_2x4
  c = _config()
  c.train.checkpoint_every = 2  # not part of the state: the step is reused
  part = train.train_and_evaluate(c, tmp_path, stop_at=5)
  assert int(part.step) == 5
  resumed = train.train_and_evaluate(c, tmp_path)
  assert int(resumed.step) == STEPS
  for (path, a), (_, b) in zip(_leaves((resumed.params, resumed.opt_state)),
                               _leaves((full.params, full.opt_state)),
                               strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b),
                                  err_msg=jax.tree_util.keystr(path))
  read = lambda d: (d / "metrics.jsonl").read_text().splitlines()
  assert read(tmp_path) == read(workdir)
  assert _heads_split(resumed.params["blocks"][0]["attn"]["w_q"][...])


@pytest.mark.parametrize("shape", [(8, 1), (1, 1)])
def test_checkpoint_from_2x4_restores_on_other_meshes(run_2x4, shape):
  workdir, saved = run_2x4
  data, model = shape
  target = sharding.make_mesh(data, model, jax.devices()[:data * model])
  fresh = sharding.shard_tree(train_state.create_train_state(_config(*shape)),
                              target)
  manager = checkpoint.make_manager(workdir, STEPS, 2)
  got = checkpoint.restore(manager, fresh, STEPS)
  checkpoint.close(manager)
  assert int(got.step) == STEPS
  for (path, a), (_, b) in zip(_leaves((got.params, got.opt_state)),
                               _leaves((saved.params, saved.opt_state)),
                               strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b),
                                  err_msg=jax.tree_util.keystr(path))
    assert a.sharding.mesh.shape == target.shape, path


def test_generation_with_sharded_params_equals_unsharded(mesh):
  model = transformer.DecoderLM(transformer.ModelConfig(
      vocab_size=16, d_model=32, num_layers=1, num_heads=8, num_kv_heads=2,
      max_len=16, positions="learned", attention_only=False,
      implementation="einsum"), rngs=nnx.Rngs(0))
  prompt = jax.random.randint(jax.random.PRNGKey(1), (4, 5), 3, 16)
  lengths = jnp.array([5, 2, 4, 3], jnp.int32)
  want, want_logits = generate.generate(model, prompt, 6, return_logits=True,
                                        prompt_lengths=lengths)
  sharded = sharding.shard_model(model, mesh)
  w_q = sharded.blocks[0].attn.w_q[...]
  assert _heads_split(w_q)
  got, got_logits = generate.generate(
      sharded, sharding.shard_batch(prompt, mesh), 6, return_logits=True,
      prompt_lengths=lengths)
  np.testing.assert_allclose(got_logits, want_logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got, want)
