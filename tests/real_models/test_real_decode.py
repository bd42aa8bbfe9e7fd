"""SmolLM2 decodes prompts of every length in one bucket with one compiled
program, and its greedy tokens are transformers' `generate` on the same
GGUF file; the bucketed program's logits are the unbucketed one's within
float32 rounding: two float32 runs, each within transformers' own float32
error of the float64 answer (tests/real_models/test_real_gguf.py), differ
by at most about twice that error (measured: 0.77 of it once).
"""

import jax.numpy as jnp
import numpy as np
import torch

from mha_jax.models import generate
from tests.compiles import count_compiles
from tests.pretrained import compare

N = 16  # new tokens: a 16-token prompt needs 31 slots, bucket 32


def test_prompt_lengths_in_one_bucket_compile_once_and_equal_generate(real):
  m = real("smollm2")
  row = m.batches["short"][:1]  # [1, 16]
  calls = {}
  with count_compiles() as first:
    calls[16] = generate.generate(m.model, row.numpy(), N)
  assert first
  with count_compiles() as seen:
    for p in (5, 9, 13):
      calls[p] = generate.generate(m.model, row[:, :p].numpy(), N)
  assert seen == []
  for p, got in calls.items():
    with torch.no_grad():
      want = m.hf.generate(row[:, :p], attention_mask=torch.ones_like(
          row[:, :p]), max_new_tokens=N, min_new_tokens=N, do_sample=False,
                           pad_token_id=0)[:, p:]
    np.testing.assert_array_equal(np.asarray(got), want.numpy(), err_msg=p)


def test_bucketed_logits_equal_unbucketed_within_float32_noise(real):
  m = real("smollm2")
  prompt = m.batches["short"][:, :11].numpy()  # [2, 11]: width 16 bucketed
  got, got_logits = generate.generate(m.model, prompt, N,
                                      return_logits=True)
  want, want_logits = generate.generate(m.model, prompt, N,
                                        return_logits=True,
                                        bucket_shapes=False)
  np.testing.assert_array_equal(got, want)
  floor = compare.rel(m.out32["short"]["main"], m.out64["short"]["main"])
  err = float(jnp.linalg.norm(got_logits - want_logits)
              / jnp.linalg.norm(want_logits))
  print(f"bucketed vs unbucketed logits: {err:.3g} (transformers' float32 "
        f"error {floor:.3g})")
  assert err < 2 * floor, (err, floor)
