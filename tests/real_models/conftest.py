"""The real GGUF models, read once per session by transformers (the
reference, float32, eager attention so that it returns patterns) and by
mha_jax. This tier runs with `make test-real` (MHA_JAX_REAL_MODELS=1);
`make test` leaves it out (tests/conftest.py): transformers alone needs
about a minute to read Gemma 3 270M's file on 2 cores."""

import copy
import gc

import numpy as np
import pytest
import torch
import transformers

import mha_jax
from mha_jax.pretrained import real_models
import hf_models

transformers.utils.logging.disable_progress_bar()
torch.set_num_threads(2)

PATHS = {"smollm2": real_models.smollm2_135m,
         "gemma3": real_models.gemma3_270m}
SHORT, LONG = (2, 16), 200  # the short prompts' shape; the long input


def token_batches(vocab: int, window=None):
  """`{"short": [2, 16], "long": [1, 200]}` token ids drawn uniformly
  (ids 3 and up: past the special tokens of both files), fixed seed;
  with a sliding `window`, also `"window": [1, window + 100]`, so that
  the sliding layers drop keys the global ones keep."""
  g = torch.Generator().manual_seed(7)
  out = {"short": torch.randint(3, vocab, SHORT, generator=g),
         "long": torch.randint(3, vocab, (1, LONG), generator=g)}
  if window is not None:
    out["window"] = torch.randint(3, vocab, (1, window + 100), generator=g)
  return out


class Real:
  """One real model: `path`, transformers' float32 model `hf`, mha_jax's
  `model`, and for each batch transformers' float32 and float64 outputs
  (`hf_models.run`: logits, every layer's stream, every pattern)."""

  def __init__(self, name):
    self.name, self.path = name, PATHS[name]()
    self.hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(self.path.parent), gguf_file=self.path.name,
        dtype=torch.float32, attn_implementation="eager").eval()
    self.model = mha_jax.load_pretrained(self.path)
    self.batches = token_batches(self.hf.config.vocab_size,
                                 getattr(self.hf.config, "sliding_window",
                                         None))
    self.out32 = {k: hf_models.run(self.hf, {"input_ids": b})
                  for k, b in self.batches.items()}
    double = copy.deepcopy(self.hf).double()
    self.out64 = {k: hf_models.run(double, {"input_ids": b})
                  for k, b in self.batches.items()}
    del double
    gc.collect()


@pytest.fixture(scope="session")
def real():
  """`real(name)` -> that model's `Real`, made on first use; the other
  model's is dropped first, so one model's copies are held at a time."""
  held = {}

  def get(name):
    if name not in held:
      held.clear()
      gc.collect()
      held[name] = Real(name)
    return held[name]

  return get


def as_numpy(x):
  return np.asarray(x, np.float64)
