"""The real-heads experiment's MHA twin on the real GQA models: the
twin of SmolLM2-135M (9 query heads on 3 KV heads) and of Gemma 3 270M (4
on 1) computes the model's own logits, with H / K times its cache."""

import numpy as np
import pytest

import mha_jax
from experiments.real_heads import kv_twin
from mha_jax.pretrained import real_models


@pytest.mark.parametrize("path", [real_models.smollm2_135m,
                                  real_models.gemma3_270m])
def test_the_mha_twin_of_a_real_model_has_its_logits(path):
  model = mha_jax.load_pretrained(path())
  twin = kv_twin.mha_twin(model)
  c = model.config
  ids = np.arange(1000, 1040)[None]
  want, got = np.asarray(model(ids)), np.asarray(twin(ids))
  # Both run the same float32 sums in another grouping: within a float32
  # rounding of the logits' scale.
  np.testing.assert_allclose(got, want, atol=1e-4 * np.abs(want).max())
  assert kv_twin.cache_bytes_per_token(twin) == (
      kv_twin.cache_bytes_per_token(model) * c.num_heads // c.num_kv_heads)
