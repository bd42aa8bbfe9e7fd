"""Top-k and top-p (nucleus) sampling in `generate`, against a NumPy
reference written here.

The reference (`reference_probs`) follows the definitions, not the code:
in float64, divide by the temperature; top-k keeps the tokens whose logit
is at least the k-th largest; top-p walks the tokens from most to least
likely (equal logits: lower id first) over the renormalized survivors of
top-k and stops once the walked mass reaches p. The random cases put p
1e-3 either side of the boundaries, never within float32 rounding of one
(float32 against float64); the exact boundaries use probabilities exact
in binary (equal logits: 1/4 each).
"""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from mha_jax.models import generate
from mha_jax.models import sampling
from mha_jax.models import transformer
from tests.compiles import count_compiles

V, MAX_LEN = 16, 32


def reference_probs(logits, temperature, top_k=None, top_p=None):
  """The probabilities `[V]` sampling should draw from (float64)."""
  x = np.asarray(logits, np.float64) / temperature
  v = len(x)
  keep = np.ones(v, bool)
  if top_k is not None:
    kth = sorted(x, reverse=True)[min(top_k, v) - 1]
    keep = x >= kth
  p = np.where(keep, np.exp(x - x[keep].max()), 0.0)
  p /= p.sum()
  if top_p is not None:
    walked, nucleus = 0.0, np.zeros(v, bool)
    for i in sorted(range(v), key=lambda i: (-x[i], i)):
      if walked >= top_p:
        break
      nucleus[i] = True
      walked += p[i]
    keep &= nucleus
    p = np.where(keep, p, 0.0)
    p /= p.sum()
  return p


def cumulative_masses(logits, temperature, top_k=None):
  """The masses of the 1, 2, ... most likely tokens after top-k."""
  p = reference_probs(logits, temperature, top_k)
  return np.cumsum(np.sort(p)[::-1])


def filtered_probs(logits, temperature, top_k=None, top_p=None):
  out = sampling.filter_logits(jnp.asarray(logits, jnp.float32)[None],
                               temperature, top_k, top_p)[0]
  return np.asarray(jax.nn.softmax(out)), np.isfinite(np.asarray(out))


def cases():
  """(logits, temperature, top_k, top_p): random rows, each p just below,
  just above and between the cumulative masses of the ranking."""
  rng = np.random.default_rng(0)
  out = []
  for row in range(6):
    logits = rng.normal(0, 2, 10)
    for temperature in (0.5, 1.0, 2.0):
      for top_k in (None, 1, 3, 7, 10, 50):
        masses = cumulative_masses(logits, temperature, top_k)[:-1]
        # Only boundaries between tokens with real mass: far down the
        # tail, p within 1e-3 of 1 would sit on several at once.
        masses = masses[masses < 0.99]
        ps = [None, 1.0]
        for m in masses[:4]:
          ps += [m - 1e-3, m + 1e-3]
        ps += list(((masses[1:] + masses[:-1]) / 2)[:3])
        for top_p in ps:
          # Off every boundary by more than float32 rounding (p = 1 is
          # exact: it keeps every token).
          if top_p is None or top_p == 1.0 or (
              0 < top_p < 1 and np.abs(masses - top_p).min(initial=1) > 1e-5):
            out.append((logits, temperature, top_k, top_p))
  return out


def test_filtered_distribution_equals_the_reference():
  checked = 0
  for logits, temperature, top_k, top_p in cases():
    probs, kept = filtered_probs(logits, temperature, top_k, top_p)
    want = reference_probs(logits, temperature, top_k, top_p)
    where = (temperature, top_k, top_p)
    np.testing.assert_array_equal(kept, want > 0, err_msg=str(where))
    np.testing.assert_allclose(probs, want, rtol=1e-5, atol=1e-7,
                               err_msg=str(where))
    checked += 1
  assert checked > 500  # the grid did not collapse


def test_temperature_comes_before_top_p():
  # Masses 0.6 and 0.3 at temperature 1 (0.6 reaches p = 0.55 alone);
  # at temperature 2 the top token holds less than 0.55, so a second
  # token is needed. Top-p on the unscaled logits would keep one.
  logits = np.log([0.6, 0.3, 0.1])
  assert reference_probs(logits, 2.0, top_p=0.55)[1] > 0
  for temperature, count in ((1.0, 1), (2.0, 2)):
    _, kept = filtered_probs(logits, temperature, top_p=0.55)
    assert kept.sum() == count, temperature


def test_exact_boundaries_and_ties():
  # Four equal logits hold exactly 1/4 each once top-k has dropped the
  # two low ones, so the masses 1/4, 1/2, 3/4 are exact in float32.
  logits = np.array([-5.0, 0.0, 0.0, -5.0, 0.0, 0.0])
  kept = lambda **kw: list(np.flatnonzero(filtered_probs(logits, 1.0,
                                                          **kw)[1]))
  # Ties at the k-th value are all kept (transformers' `<` comparison).
  assert kept(top_k=1) == [1, 2, 4, 5]
  assert kept(top_k=5) == [0, 1, 2, 3, 4, 5]
  # Mass reaching p exactly stops the walk: 2 tokens make 1/2; equal
  # logits are taken in id order. Top-p is over what top-k left: over all
  # six tokens the zeros hold 0.2496 each and p = 1/2 would need three.
  assert kept(top_k=4, top_p=0.5) == [1, 2]
  assert kept(top_k=4, top_p=0.25) == [1]
  assert kept(top_k=4, top_p=0.75) == [1, 2, 4]
  assert kept(top_p=0.5) == [1, 2, 4]
  # At least one token however small p is; p = 1 keeps every token.
  assert kept(top_p=1e-9) == [1]
  assert kept(top_p=1.0) == [0, 1, 2, 3, 4, 5]
  # k past the vocabulary keeps all (transformers clips k to V).
  assert kept(top_k=100) == [0, 1, 2, 3, 4, 5]


def test_draws_follow_the_reference_and_never_leave_the_kept_set():
  logits = np.array([2.0, 1.5, 1.0, 0.6, 0.3, 0.0, -0.5, -1.0])
  settings = [(0.7, None, 0.8), (1.3, 5, None), (1.3, 5, 0.9),
              (1.0, None, None)]
  n = 20000
  keys = jax.random.split(jax.random.PRNGKey(0), n)
  row = jnp.asarray(logits, jnp.float32)[None]
  draw = jax.jit(jax.vmap(lambda k, t, tk, tp: sampling.sample_next(
      row, t, k, tk, tp)[0], in_axes=(0, None, None, None)))
  for temperature, top_k, top_p in settings:
    if top_k is None or top_p is None:  # None cannot be traced: close over
      draws = jax.jit(jax.vmap(lambda k: sampling.sample_next(
          row, temperature, k, top_k, top_p)[0]))(keys)
    else:
      draws = draw(keys, temperature, top_k, top_p)
    counts = np.bincount(np.asarray(draws), minlength=len(logits))
    want = reference_probs(logits, temperature, top_k, top_p)
    where = (temperature, top_k, top_p)
    assert counts[want == 0].sum() == 0, where
    observed, expected = counts[want > 0], n * want[want > 0]
    chi2 = ((observed - expected) ** 2 / expected).sum()
    # A one-in-a-million bound: a correct sampler with this seed passes,
    # and a distribution off by a few percent of a token's mass does not.
    assert chi2 < stats.chi2.ppf(1 - 1e-6, len(observed) - 1), (where, chi2)


@pytest.fixture(scope="module")
def model():
  return transformer.DecoderLM(transformer.ModelConfig(
      vocab_size=V, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2,
      max_len=MAX_LEN, positions="rotary", attention_only=False),
      rngs=nnx.Rngs(0))


def prompts(seed=1):
  lengths = np.array([3, 9, 1, 6], np.int32)
  prompt = np.random.default_rng(seed).integers(3, V, (4, 9))
  return np.where(np.arange(9)[None] < lengths[:, None], prompt, 2), lengths


def test_every_cached_step_draws_from_its_filtered_logits(model):
  prompt, lengths = prompts()
  for top_k, top_p in ((3, None), (None, 0.6), (4, 0.7)):
    tokens, logits = generate.generate(
        model, prompt, 8, prompt_lengths=lengths, temperature=0.8,
        rng=jax.random.PRNGKey(3), top_k=top_k, top_p=top_p,
        return_logits=True)
    tokens, logits = np.asarray(tokens), np.asarray(logits)
    for b in range(len(lengths)):
      for n in range(tokens.shape[1]):
        allowed = reference_probs(logits[b, n], 0.8, top_k, top_p) > 0
        assert allowed[tokens[b, n]], (top_k, top_p, b, n)
        if top_k == 3:
          assert allowed.sum() == 3  # random logits: no ties


def test_first_token_frequencies_through_generate(model):
  # One prompt repeated: each row's first token is an independent draw
  # from the same filtered distribution of the prefill logits.
  rows = 4000
  prompt = np.tile(prompts()[0][1], (rows, 1))
  temperature, top_k, top_p = 1.5, 6, 0.85
  tokens, logits = generate.generate(
      model, prompt, 1, temperature=temperature, top_k=top_k, top_p=top_p,
      rng=jax.random.PRNGKey(11), return_logits=True)
  want = reference_probs(np.asarray(logits[0, 0]), temperature, top_k,
                         top_p)
  counts = np.bincount(np.asarray(tokens[:, 0]), minlength=V)
  assert counts[want == 0].sum() == 0 and (want > 0).sum() > 2
  observed, expected = counts[want > 0], rows * want[want > 0]
  chi2 = ((observed - expected) ** 2 / expected).sum()
  assert chi2 < stats.chi2.ppf(1 - 1e-6, len(observed) - 1), chi2


def test_seeded_and_one_program_for_every_k_and_p(model):
  prompt, lengths = prompts()
  run = lambda key, k, p, **kw: np.asarray(generate.generate(
      model, prompt, 6, prompt_lengths=lengths, temperature=1.0,
      rng=jax.random.PRNGKey(key), top_k=k, top_p=p, **kw))
  a = run(5, 5, 0.9)
  with count_compiles() as compiles:
    np.testing.assert_array_equal(run(5, 5, 0.9), a)
    run(5, 3, 0.5)
    run(6, 12, 0.95)
  assert compiles == []
  assert (run(6, 5, 0.9) != a).any()
  # Bucketed and exact shapes draw the same tokens from the same key.
  np.testing.assert_array_equal(run(5, 5, 0.9, bucket_shapes=False), a)


def test_unfiltered_and_no_op_filters_draw_the_same_tokens(model):
  prompt, lengths = prompts()
  run = lambda **kw: np.asarray(generate.generate(
      model, prompt, 6, prompt_lengths=lengths, temperature=1.0,
      rng=jax.random.PRNGKey(4), **kw))
  plain = run()
  np.testing.assert_array_equal(run(top_k=V), plain)
  np.testing.assert_array_equal(run(top_p=1.0), plain)
  np.testing.assert_array_equal(run(top_k=V, top_p=1.0), plain)


def test_top_1_and_a_tiny_nucleus_are_greedy(model):
  prompt, lengths = prompts()
  greedy = np.asarray(generate.generate(model, prompt, 6,
                                        prompt_lengths=lengths))
  for kw in (dict(top_k=1), dict(top_p=1e-6)):
    np.testing.assert_array_equal(generate.generate(
        model, prompt, 6, prompt_lengths=lengths, temperature=2.0,
        rng=jax.random.PRNGKey(0), **kw), greedy)


def test_greedy_program_has_no_filter(model):
  # Temperature 0 compiles the program it did before sampling filters
  # existed: no sort anywhere in it.
  prompt, lengths = prompts()
  args, static = generate.prepare(model, prompt, 4, prompt_lengths=lengths)
  sort = "stablehlo.sort"
  assert sort not in generate.decode_jit.lower(*args, **static).as_text()
  args, static = generate.prepare(model, prompt, 4, prompt_lengths=lengths,
                                  temperature=1.0, top_k=3,
                                  rng=jax.random.PRNGKey(0))
  assert sort in generate.decode_jit.lower(*args, **static).as_text()


@pytest.mark.parametrize("kwargs,message", [
    (dict(top_k=0), "generate: `top_k` must be an int >= 1 (or None for no "
     "top-k), got 0"),
    (dict(top_k=2.0), "generate: `top_k` must be an int >= 1 (or None for "
     "no top-k), got 2.0"),
    (dict(top_k=True), "generate: `top_k` must be an int >= 1 (or None for "
     "no top-k), got True"),
    (dict(top_p=0.0), "generate: `top_p` must be a number in (0, 1] (or "
     "None for no top-p), got 0.0"),
    (dict(top_p=1.5), "generate: `top_p` must be a number in (0, 1] (or "
     "None for no top-p), got 1.5"),
    (dict(top_p="0.9"), "generate: `top_p` must be a number in (0, 1] (or "
     "None for no top-p), got '0.9'"),
    (dict(top_k=5, temperature=0.0, rng=None), "generate: `top_k` applies "
     "only when sampling: expected temperature > 0 with an `rng` key, got "
     "top_k=5 with temperature=0.0 (greedy)"),
    (dict(top_k=5, top_p=0.9, temperature=0.0), "generate: `top_k` and "
     "`top_p` apply only when sampling: expected temperature > 0 with an "
     "`rng` key, got top_k=5, top_p=0.9 with temperature=0.0 (greedy)"),
])
def test_bad_filters_are_refused_by_name(model, kwargs, message):
  prompt, lengths = prompts()
  kwargs = dict(dict(temperature=1.0, rng=jax.random.PRNGKey(0)), **kwargs)
  with pytest.raises(ValueError) as err:
    generate.generate(model, prompt, 2, prompt_lengths=lengths, **kwargs)
  assert str(err.value) == message
