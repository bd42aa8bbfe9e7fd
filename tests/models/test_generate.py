"""Generation through DecoderLM with KV caches equals the uncached model.

The reference is always the model's own full causal forward `model(tokens)`
(no cache: causal rule over positions 0..T-1), against the cached call
`model(tokens, cache=...)` (slots written one call at a time, masks and
positions per sequence). Prompts are
right padded with junk tokens so that any leak of padding shows up.
"""

import chex
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import default as default_config
from mha_jax.core import attention
from mha_jax.measure import continuations
from mha_jax.models import generate
from mha_jax.models import sampling
from mha_jax.training import tasks
from mha_jax.models import transformer

V, D, H, MAX_LEN = 16, 16, 4, 12
LAYOUTS = {"mha": 4, "gqa": 2, "mqa": 1}  # name -> K for H = 4
LENS = np.array([3, 5, 1], np.int32)  # unequal prompt lengths, one batch
STEPS = 4


def make_model(num_kv_heads=2, positions="learned", implementation="einsum",
               seed=0, **kwargs):
  return transformer.DecoderLM(transformer.ModelConfig(
      vocab_size=V, d_model=D, num_layers=2, num_heads=H,
      num_kv_heads=num_kv_heads, max_len=MAX_LEN, positions=positions,
      implementation=implementation, attention_only=False, use_bias=True,
      **kwargs), rngs=nnx.Rngs(seed))


def make_tokens(seed=1):
  """Full sequences `[B, P+N]` and right-padded prompts `[B, P]` with junk."""
  p = int(LENS.max())
  full = jax.random.randint(jax.random.PRNGKey(seed), (len(LENS), p + STEPS),
                            3, V)
  real = jnp.arange(p)[None, :] < LENS[:, None]
  return full, jnp.where(real, full[:, :p], 2)  # junk: SEP in the padding


@jax.jit
def _teacher_forced(graphdef, state, full, lens):
  """Prefill the prompts, then feed the true next tokens one at a time."""
  model = nnx.merge(graphdef, state)
  p = full.shape[1] - STEPS
  real = jnp.arange(p)[None, :] < lens[:, None]
  prompt = jnp.where(real, full[:, :p], 2)
  caches = model.init_cache(full.shape[0])
  first, caches, status = generate.prefill(model, prompt, caches,
                                           lengths=lens)
  rows = jnp.arange(full.shape[0])

  def step(caches, s):
    logits, caches, st = generate.decode_step(model, full[rows, lens + s],
                                              caches)
    return caches, (logits, st.overflow)

  _, (logits, overflow) = jax.lax.scan(step, caches, jnp.arange(STEPS))
  return first, logits, status.overflow | overflow.any(0)


def rel_err(a, b):
  return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def check_cached_equals_full(model):
  full, _ = make_tokens()
  ref = jax.jit(lambda g, s, t: nnx.merge(g, s)(t))(*nnx.split(model), full)
  first, logits, overflow = _teacher_forced(*nnx.split(model), full,
                                            jnp.asarray(LENS))
  rows = np.arange(len(LENS))
  assert not overflow.any()
  assert rel_err(first, ref[rows, LENS - 1]) < 1e-5
  for s in range(STEPS):
    # logits[s] predict the token after position LENS + s.
    assert rel_err(logits[s], ref[rows, LENS + s]) < 1e-5, s


# A covering design instead of the full product (which would compile 3 x 4
# x 6 models): every head layout, position scheme and implementation appears,
# each layout with several schemes. The cache path builds the same masks for
# every scheme; schemes differ only in the embedding or the q/k rotation.
CASES = [("mha", "learned", "einsum"), ("gqa", "sinusoidal", "vmap"),
         ("mqa", "rotary", "einsum"), ("gqa", "none", "einsum"),
         ("mqa", "alibi", "flash"), ("mha", "rotary", "xla"),
         ("gqa", "rotary", "auto"), ("mqa", "sinusoidal", "cudnn")]


def test_cases_cover_every_layout_position_and_implementation():
  layouts, positions, impls = (set(c) for c in zip(*CASES))
  assert layouts == set(LAYOUTS)
  assert positions == set(transformer.POSITIONS)
  # "pallas_tpu" needs lengths in whole blocks of 128 (tests/core/test_pallas.py);
  # "pallas_gpu" takes no dense mask (tests/core/test_pallas_gpu.py).
  assert impls == set(attention.PATHS) - {"pallas_tpu", "pallas_gpu"}


@pytest.mark.parametrize("layout,positions,implementation", CASES)
def test_cached_logits_equal_full_forward(layout, positions, implementation):
  if implementation == "cudnn" and jax.default_backend() != "gpu":
    pytest.skip("'cudnn' needs a CUDA GPU (see mha_jax/core/kernels/xla.py)")
  if implementation == "cudnn":
    pytest.skip("cuDNN's attention takes float16/bfloat16 only and this "
                "model is float32; tests/core/test_flash.py::"
                "test_cudnn_equals_the_reference_in_bf16 checks cuDNN")
  check_cached_equals_full(
      make_model(LAYOUTS[layout], positions, implementation))


def naive_greedy(model, prompt_row, n):
  """Re-run the full forward on the growing sequence and take the argmax."""
  fwd = jax.jit(lambda g, s, t: nnx.merge(g, s)(t))
  graphdef, state = nnx.split(model)
  seq = list(np.asarray(prompt_row))
  for _ in range(n):
    # Fixed width MAX_LEN (right padding cannot affect a causal model), so
    # the reference compiles once.
    padded = jnp.asarray([seq + [0] * (MAX_LEN - len(seq))])
    seq.append(int(jnp.argmax(fwd(graphdef, state, padded)[0, len(seq) - 1])))
  return seq[len(prompt_row):]


def test_greedy_equals_naive_full_forward_loop():
  model = make_model(LAYOUTS["gqa"], "learned", seed=3)
  _, prompt = make_tokens(seed=4)
  n = MAX_LEN - int(LENS.max()) + 1  # the longest prompt fills the cache
  tokens = generate.generate(model, prompt, n, prompt_lengths=LENS)
  assert tokens.shape == (len(LENS), n)
  for b, length in enumerate(LENS):
    assert list(np.asarray(tokens[b])) == naive_greedy(
        model, prompt[b, :length], n), b
  # Per-row budgets: the same tokens up to each budget, then padding.
  budget = np.array([n, 2, 1])
  short = generate.generate(model, prompt, n, prompt_lengths=LENS,
                            new_tokens=budget)
  keep = np.arange(n)[None, :] < budget[:, None]
  np.testing.assert_array_equal(short, np.where(keep, tokens, 0))


def test_sampling_reproducible_given_key():
  model = make_model(2, "rotary")
  _, prompt = make_tokens()
  run = lambda key, t=1.0: generate.generate(
      model, prompt, 6, prompt_lengths=LENS, temperature=t, rng=key)
  a, b = run(jax.random.PRNGKey(7)), run(jax.random.PRNGKey(7))
  np.testing.assert_array_equal(a, b)
  assert (a != run(jax.random.PRNGKey(8))).any()
  # Temperature 0 is the argmax, and a vanishing one concentrates all mass
  # on it (both run in the same compiled program as sampling).
  greedy = run(jax.random.PRNGKey(7), 0.0)
  np.testing.assert_array_equal(run(jax.random.PRNGKey(9), 1e-4), greedy)
  logits = generate.generate(model, prompt, 6, prompt_lengths=LENS,
                             temperature=0.0, rng=jax.random.PRNGKey(7),
                             return_logits=True)[1]
  np.testing.assert_array_equal(greedy, jnp.argmax(logits, -1))


def test_sample_next_follows_softmax_of_scaled_logits():
  logits = jnp.array([[2.0, 1.0, 0.0, -1.0]])
  temperature, n = 2.0, 4000
  keys = jax.random.split(jax.random.PRNGKey(0), n)
  draws = jax.jit(jax.vmap(
      lambda k: sampling.sample_next(logits, temperature, k)))(keys)[:, 0]
  freq = np.bincount(np.asarray(draws), minlength=4) / n
  want = np.asarray(jax.nn.softmax(logits[0] / temperature))
  # Binomial standard error is at most 0.008 here: 5 standard errors.
  np.testing.assert_allclose(freq, want, atol=0.04)
  assert int(sampling.sample_next(logits, 0.0, keys[0])[0]) == 0


def test_decode_loop_traces_once_for_new_values():
  model = make_model(2, "learned")
  graphdef, state = nnx.split(model)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def run(state, prompt, lens, temperature, key):
    return generate.decode_loop(nnx.merge(graphdef, state), prompt, 5,
                                lengths=lens, temperature=temperature,
                                rng=key)

  _, prompt = make_tokens()
  for i, lens in enumerate(([3, 5, 1], [5, 2, 4], [1, 1, 5])):
    # New token values each call, kept inside the vocabulary.
    run(state, (prompt + i) % V, jnp.asarray(lens, jnp.int32),
        jnp.float32(i * 0.5), jax.random.PRNGKey(i))


def test_decode_step_does_not_recompile_as_position_advances():
  model = make_model(4, "rotary")
  graphdef, state = nnx.split(model)
  step = jax.jit(chex.assert_max_traces(
      lambda s, tok, c: generate.decode_step(nnx.merge(graphdef, s), tok, c),
      n=1))
  caches = model.init_cache(2)
  token = jnp.array([3, 4])
  for _ in range(5):
    logits, caches, _ = step(state, token, caches)
    token = jnp.argmax(logits, -1)
  np.testing.assert_array_equal(caches[0].length, [5, 5])


def test_overflow_is_reported_per_sequence_under_jit():
  model = make_model(2, "rotary")
  _, prompt = make_tokens()
  lens = jnp.array([3, 5, 1], jnp.int32)
  run = jax.jit(lambda p, l, n: generate.decode_loop(
      model, p, 4, lengths=l, new_tokens=n, max_len=7))
  _, logits, status = run(prompt, lens, jnp.array([4, 4, 4]))
  # Row 1 needs 5 + 4 - 1 = 8 slots > 7; the others fit.
  np.testing.assert_array_equal(status.overflow, [False, True, False])
  assert np.isnan(logits[1, -1]).all() and np.isfinite(logits[0]).all()
  # With a budget of 3 new tokens row 1 needs exactly the 7 slots there are.
  _, logits, status = run(prompt, lens, jnp.array([4, 3, 4]))
  assert not status.overflow.any() and np.isfinite(logits[:, :3]).all()


def test_generate_raises_on_overflow_and_bad_inputs():
  model = make_model(2, "learned")
  _, prompt = make_tokens()
  with pytest.raises(OverflowError, match="max_len"):
    generate.generate(model, prompt, MAX_LEN - 3, prompt_lengths=LENS)
  with pytest.raises(ValueError, match="position table"):
    model.init_cache(1, max_len=MAX_LEN + 1)
  with pytest.raises(ValueError, match="prompt_lengths"):
    generate.generate(model, prompt, 2, prompt_lengths=[0, 1, 2])
  with pytest.raises(ValueError, match="rng"):
    generate.generate(model, prompt, 2, temperature=1.0)
  with pytest.raises(ValueError, match="prompt"):
    generate.generate(model, prompt.astype(jnp.float32), 2)
  with pytest.raises(ValueError, match="max_new_tokens"):
    generate.generate(model, prompt, 0)
  with pytest.raises(ValueError, match="new_tokens"):
    generate.generate(model, prompt, 2, new_tokens=[1, 3, 1])
  features = transformer.DecoderLM(transformer.ModelConfig(
      vocab_size=0, input_dim=3, output_dim=2, d_model=D, num_layers=1,
      num_heads=H, max_len=MAX_LEN), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="token model"):
    generate.generate(features, prompt, 2)



@pytest.mark.parametrize("task", ["copy", "induction"])
def test_task_prompts_split_each_example_at_its_scored_span(task):
  """continuations.task_prompts' prompts + expected continuations rebuild the
  task's sequences, and the continuation is exactly the scored targets."""
  config = default_config.get_config()
  config.task.name = task
  ex = continuations.task_prompts(config, 32, seed=5)
  task_cfg = ml_collections.ConfigDict(config.task.to_dict())
  task_cfg.batch_size = 32
  batch = jax.jit(lambda key: tasks.get_task(task).make_batch(key, task_cfg))(
      jax.random.PRNGKey(5))
  inputs, targets = np.asarray(batch["inputs"]), np.asarray(batch["targets"])
  mask = np.asarray(batch["loss_mask"]) > 0
  for b in range(32):
    n, c = ex["lengths"][b], ex["counts"][b]
    np.testing.assert_array_equal(ex["prompt"][b, :n], inputs[b, :n])
    assert (ex["prompt"][b, n:] == tasks.PAD).all()
    np.testing.assert_array_equal(ex["expected"][b, :c], targets[b][mask[b]])
    # The prompt stops right before the first scored target.
    assert mask[b, n - 1] and not mask[b, :n - 1].any()
  if task == "induction":  # ragged prompts and continuations
    assert len(set(ex["lengths"])) > 1 and len(set(ex["counts"])) > 1
