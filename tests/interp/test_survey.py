"""The survey's floors, layer split and bootstrap intervals."""

import numpy as np

from mha_jax.interp import head_metrics
from mha_jax.interp import survey


def test_js_by_layer_splits_pairs():
  # 2 layers x 2 heads, layer-major: within pairs (0,1) and (2,3).
  js = np.array([[0.0, 0.2, 0.5, 0.7],
                 [0.2, 0.0, 0.9, 0.3],
                 [0.5, 0.9, 0.0, 0.4],
                 [0.7, 0.3, 0.4, 0.0]])
  got = survey.js_by_layer(js, 2)
  assert got["within_layer"] == np.mean([0.2, 0.4])
  assert got["across_layer"] == np.mean([0.5, 0.7, 0.9, 0.3])
  assert survey.js_by_layer(js[:2, :2], 1)["across_layer"] is None


def _previous_token_weights(b, t):
  w = np.zeros((t, t), np.float32)
  w[0, 0] = 1.0
  w[np.arange(1, t), np.arange(t - 1)] = 1.0
  return np.broadcast_to(w, (1, b, 1, t, t))  # [L, B, H, T, T]


def test_bootstrap_of_identical_examples_is_a_point():
  tokens = np.tile(np.arange(6), (5, 1))
  ci = survey.bootstrap_metrics(_previous_token_weights(5, 6), tokens,
                                     resamples=20)
  np.testing.assert_allclose(ci["previous_token"], [[[1.0, 1.0]]])


def test_bootstrap_interval_brackets_the_score_and_varies():
  # Half the examples previous-token, half uniform: the pooled score is
  # between, and resampling examples moves it.
  b, t = 40, 8
  prev = _previous_token_weights(b, t)[0]
  uni = np.asarray(head_metrics.uniform_causal_weights(b, t))
  w = np.concatenate([prev[: b // 2], uni[b // 2:]])[None]
  tokens = np.tile(np.arange(t), (b, 1))
  lo, hi = survey.bootstrap_metrics(w, tokens)["previous_token"][0, 0]
  score = float(head_metrics.previous_token_score(w[0])[0])
  assert lo < score < hi and hi - lo > 0.05


def test_uniform_floor_of_a_batch():
  tokens = np.tile(np.arange(4), (2, 1))
  floor = survey.uniform_floor({"inputs": tokens})
  np.testing.assert_allclose(floor["previous_token"],
                             np.mean([1 / 2, 1 / 3, 1 / 4]), rtol=1e-6)


def test_floored_lays_out_trained_ablation_uniform_and_init():
  """The shared survey structure: the same measures of the trained and the
  untrained model, the uniform floor and the ablation, each only when
  asked for."""
  def measure(model):
    return {"score": f"score of {model}"}

  got = survey.floored("trained", measure, uniform=lambda: {"score": 0.5},
                       init_model="init", ablate=lambda m: f"ablated {m}")
  assert got == {"trained": {"score": "score of trained"},
                 "ablation": "ablated trained",
                 "uniform": {"score": 0.5},
                 "init": {"score": "score of init"}}
  assert survey.floored("trained", measure) == {
      "trained": {"score": "score of trained"}, "ablation": None}
