"""The IOI prompts on SmolLM2-135M itself: its tokenizer keeps common
first names as one token after a space, the END-only forward pass equals
the model's own call, and the model prefers the indirect object (a first
probe, outside this code, found it does on 98% of templated prompts)."""

import jax.numpy as jnp
import numpy as np

from experiments.ioi_task import forward
from experiments.ioi_task import models
from experiments.ioi_task import prompts


def test_smollm2_prefers_the_indirect_object():
  model, tok, prefix = models.load("smollm2")
  names = prompts.single_token_names(tok)
  assert {"Mary", "John", "Tom", "Sarah"} <= set(names)
  p = prompts.build(tok, names, per_template_order=1, seed=0, prefix=prefix)
  # SmolLM2 adds no BOS: the prefix is its document separator, id 0.
  assert np.all(p["tokens"][:, 0] == 0)
  tokens, end = jnp.asarray(p["tokens"]), jnp.asarray(p["end"])
  logits, _ = forward.end_logits(model, tokens, end)
  own = np.asarray(model(tokens))[np.arange(len(end)), p["end"]]
  np.testing.assert_allclose(logits, own, rtol=1e-4, atol=1e-3)
  ld = np.asarray(forward.logit_diff(logits, jnp.asarray(p["io"]),
                                     jnp.asarray(p["s"])))
  assert np.mean(ld > 0) >= 0.8 and ld.mean() > 1.0
