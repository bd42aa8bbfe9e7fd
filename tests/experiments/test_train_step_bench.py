"""The train-step benchmark compares like with like: the PyTorch model it
times is the project's DecoderLM (same loss and gradients on the same
weights), and its ratios and table follow from the timings."""

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from configs import benchmark as benchmark_config
from experiments.benchmark import report
from experiments.benchmark import train_step
from mha_jax.core import flops
from mha_jax.training import config as config_lib
from mha_jax.training import train
from mha_jax.training import train_state

torch = pytest.importorskip("torch")
torch_models = pytest.importorskip("experiments.benchmark.torch_models")


@pytest.fixture(scope="module")
def pair():
  """Experiment 1's config at 2 layers of width 32 with 4 heads (Dh = 8:
  the scale 1/sqrt(8) is not a power of two), its DecoderLM and a batch,
  and the PyTorch Decoder holding the same weights."""
  c = train_step.experiment_config(
      benchmark_config.get_config().train_step.specs.induction)
  c.model.update(d_model=32, num_heads=4)
  c.task.update(batch_size=4)
  state = train_state.create_train_state(c)
  batch = train_state.batch_fn(c)(jax.random.PRNGKey(3))
  m = config_lib.model_config(c)
  dec = torch_models.Decoder(m.vocab_size, m.d_model, m.num_layers,
                             m.num_heads, c.task.seq_len)
  torch_models.load_from(dec, state.params)
  return state, batch, dec, torch_models.batch_to_torch(batch)


def test_the_pytorch_model_is_the_decoder_lm(pair):
  """Loss and every gradient agree in float32 on the same weights and
  batch: a wrong rotary pairing, LayerNorm epsilon, causal rule, scale or
  weight layout in the mirror would show here."""
  state, batch, dec, tb = pair

  def loss_fn(params):
    return train_state.compute_loss(nnx.merge(state.graphdef, params), batch,
                                    "xent")[0]
  value, grads = jax.value_and_grad(loss_fn)(state.params)
  loss = torch_models.loss(dec, tb["inputs"], tb["targets"], tb["loss_mask"])
  loss.backward()
  assert float(loss.detach()) == pytest.approx(float(value), rel=1e-6)
  g = lambda x: np.asarray(x[...])
  d = dec.embed.weight.shape[1]
  for i, block in enumerate(dec.blocks):
    attn = grads["blocks"][i]["attn"]
    want = np.concatenate([g(attn[n]).reshape(d, -1)
                           for n in ("w_q", "w_k", "w_v")], axis=1).T
    np.testing.assert_allclose(block.qkv.weight.grad.numpy(), want,
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(block.out.weight.grad.numpy(),
                               g(attn["w_o"]).reshape(-1, d).T,
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(block.ln.weight.grad.numpy(),
                               g(grads["blocks"][i]["ln_attn"]["scale"]),
                               rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(dec.embed.weight.grad.numpy(),
                             g(grads["embed"]["embed"]["embedding"]),
                             rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(dec.readout.weight.grad.numpy(),
                             g(grads["readout"]["kernel"]).T,
                             rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(dec.readout.bias.grad.numpy(),
                             g(grads["readout"]["bias"]),
                             rtol=1e-4, atol=1e-6)


def test_the_pytorch_step_is_adamw_with_decay_on_matrices_only(pair):
  """Adam's first update is -lr * g / (|g| + eps) elementwise, whatever
  clipping did to g's norm; AdamW also shrinks the decayed weights by
  lr * weight_decay first. So after one step the readout bias (a vector:
  no decay) moves by -lr sign(g), and the readout matrix by that minus
  lr * weight_decay * W: the decay groups of `make_optimizer`."""
  state, batch, dec, tb = pair
  c = train_step.experiment_config(
      benchmark_config.get_config().train_step.specs.induction)
  lr, wd = c.train.learning_rate, c.train.weight_decay
  opt = torch_models.optimizer(dec, c.train)
  bias0 = dec.readout.bias.detach().clone().numpy()
  w0 = dec.readout.weight.detach().clone().numpy()
  dec.zero_grad(set_to_none=True)
  torch_models.train_step(dec, opt, tb, c.train.grad_clip)
  grads = jax.grad(lambda p: train_state.compute_loss(
      nnx.merge(state.graphdef, p), batch, "xent")[0])(state.params)
  g_bias = np.asarray(grads["readout"]["bias"][...])
  g_w = np.asarray(grads["readout"]["kernel"][...]).T
  big = np.abs(g_bias) > 1e-5  # where eps = 1e-8 does not matter
  np.testing.assert_allclose((dec.readout.bias.detach().numpy() - bias0)[big],
                             -lr * np.sign(g_bias[big]), rtol=1e-3)
  big = np.abs(g_w) > 1e-5
  want = -lr * wd * w0 - lr * np.sign(g_w)
  np.testing.assert_allclose((dec.readout.weight.detach().numpy() - w0)[big],
                             want[big], rtol=1e-3, atol=1e-7)


@pytest.mark.parametrize("field,value,needle", [
    ("paths", "einsum,tf", "config.train_step.paths: unknown ['tf']"),
    ("shapes", "induction,huge", "config.train_step.shapes: unknown ['huge']"),
])
def test_bad_settings_are_refused_by_name(field, value, needle):
  c = benchmark_config.get_config("smoke")
  c.train_step[field] = value
  with pytest.raises(ValueError) as e:
    train_step.sweep(c)
  assert needle in str(e.value)


def test_the_peers_refuse_a_model_they_do_not_mirror():
  spec = benchmark_config.get_config().train_step.specs.induction
  c = train_step.experiment_config(spec)
  c.model.attention_only = False
  with pytest.raises(ValueError, match=r"model fields \['attention_only'\]"):
    train_step.peer_sizes(c)


@pytest.mark.cpu_only("parses the CPU backend's compiled HLO text, where "
                      "a matmul is a `dot`; a GPU's may hold a cuBLAS "
                      "custom-call instead")
def test_the_profile_sorts_xla_ops_by_what_was_fused_into_them():
  """Each instruction of a compiled program gets the kind of work inside
  it (the dot of a fusion makes it a matmul, whatever else it holds)."""
  from experiments.benchmark import profile  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  a = jnp.ones((8, 8))
  text = jax.jit(lambda a: (jnp.exp(a @ a.T).T, jnp.max(a, axis=0))
                 ).lower(a).compile().as_text()
  ops = profile._hlo_ops(text)
  kinds = {name: profile._kind(opcodes) for name, (_, _, opcodes) in ops.items()}
  with_dot = [n for n, (_, _, o) in ops.items() if "dot" in o]
  assert with_dot and all(kinds[n] == "matmul" for n in with_dot)
  assert "reduction" in kinds.values()
  assert profile._kind({"exponential", "add"}) == "exp (softmax)"
  assert profile._kind({"transpose", "multiply"}) == "layout (transpose, copy)"
  assert profile._kind({"pad", "add"}) == "slices, pads, concatenations"
  assert profile._kind({"add", "multiply"}) == "other elementwise"


def test_the_random_shape_is_drawn_from_its_choices_and_repeats_by_seed():
  r = benchmark_config.get_config().train_step.random
  r.seed = 7
  specs = [train_step.random_spec(r) for _ in range(2)]
  assert specs[0] == specs[1] and specs[0][1] == 7  # a seed repeats a run
  seen = set()
  for seed in range(40):
    r.seed = seed
    spec, _ = train_step.random_spec(r)
    m, t = spec["model"], spec["task"]
    assert m["num_layers"] in r.num_layers and m["num_heads"] in r.num_heads
    assert m["d_model"] // m["num_heads"] in r.head_dim
    assert m["d_model"] % m["num_heads"] == 0
    assert t["seq_len"] in r.seq_len and t["batch_size"] in r.batch_size
    seen.add((m["num_layers"], m["num_heads"], m["d_model"], t["seq_len"],
              t["batch_size"]))
  assert len(seen) > 30  # 243 combinations: the draws differ
  r.seed = -1  # drawn from the operating system, and recorded
  drawn = {train_step.random_spec(r)[1] for _ in range(3)}
  assert len(drawn) == 3 and all(s >= 0 for s in drawn)
  r.seed = -2
  with pytest.raises(ValueError, match="random.seed: expected -1"):
    train_step.random_spec(r)


@pytest.mark.parametrize("spec", [
    dict(config="induction:smoke", model={}, task={}),
    dict(config="text", model=dict(num_layers=1, num_heads=2, d_model=24),
         task=dict(seq_len=10, batch_size=3)),
])
def test_the_roofline_counts_three_forward_passes_of_matmuls(spec):
  """The step's matmul FLOPs against the closed form of an attention-only
  decoder: per layer q, k, v and output projections (2 B T D 4D) and the
  scores and values (2 * 2 B H T^2 Dh, the dense [T, T]), the readout
  (2 B T D V); the backward twice the forward (each matmul's two input
  gradients), the optimizer none."""
  c = train_step.experiment_config(ml_collections.ConfigDict(spec))
  m = config_lib.model_config(c)
  big_l, h, d, v = m.num_layers, m.num_heads, m.d_model, m.vocab_size
  t, b = c.task.seq_len, c.task.batch_size
  forward = (big_l * (2 * b * t * d * 4 * d + 2 * 2 * b * h * t * t * (d // h))
             + 2 * b * t * d * v)
  assert train_step.step_matmul_flops(c) == 3 * forward
  # The compiled step runs every one of them (a training step reads all
  # its products), and the compiled count finds them in XLA's program.
  dense = ml_collections.ConfigDict(c.to_dict())
  dense.model.implementation = "einsum"
  state = train.create_train_state(dense)
  batch = train.batch_fn(dense)(jax.random.PRNGKey(0))
  compiled = jax.jit(train.train_step).lower(state, batch).compile()
  assert flops.compiled_matmul_flops(compiled) == 3 * forward


# torch.compile's own import of inductor calls torch.jit.script_method,
# which torch 2.13 marks deprecated (a warning about torch, not this code).
@pytest.mark.filterwarnings(
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_the_compiled_peer_trains_the_eager_model(pair):
  """torch.compile's step (compiled by its first, untimed step) gives the
  eager step's loss at the next step: the same model, optimizer and
  batch, only compiled."""
  state, batch, _, _ = pair
  c = train_step.experiment_config(
      benchmark_config.get_config().train_step.specs.induction)
  c.model.update(d_model=32, num_heads=4)
  c.task.update(batch_size=4)
  eager = train_step.peer_step("torch", c, batch)
  compiled = train_step.peer_step("torch_compile", c, batch)
  if isinstance(compiled, str):
    pytest.skip(compiled)  # no C++ compiler for inductor on this machine
  eager()  # the compiled peer's first step ran when it was made
  np.testing.assert_allclose(float(compiled()), float(eager()), rtol=1e-5)


def test_the_peers_flush_denormals_as_xla_does(pair):
  """XLA's CPU code flushes denormal floats to zero; after a peer is made,
  so does torch (a float32 1e-39 reads as 0), else a peer training on
  one repeated batch slows down as its gradients turn denormal (tests/
  conftest.py restores torch's default after the test)."""
  _, batch, _, _ = pair
  c = train_step.experiment_config(
      benchmark_config.get_config().train_step.specs.induction)
  c.model.update(d_model=32, num_heads=4)
  c.task.update(batch_size=4)
  xla = jax.jit(lambda x, y: x * y)  # operands XLA cannot fold away
  assert float(xla(np.float32(1e-39), np.float32(1.0))) == 0.0
  tiny = lambda: (torch.tensor([1e-39]) * 1.0).item()
  torch.set_flush_denormal(False)  # as if no peer had been made before
  assert tiny() != 0.0
  train_step.peer_step("torch", c, batch)
  assert tiny() == 0.0
