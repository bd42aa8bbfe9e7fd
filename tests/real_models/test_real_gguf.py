"""SmolLM2-135M-Instruct (Q4_1) and Gemma 3 270M (Q4_K_M), read from their
GGUF files by mha_jax, agree with transformers reading the same files.

Bounds, as for the tiny families (docs/pretrained.md): two float32 runs
of transformers give identical bits, so its noise floor is its distance
from its own float64 run on the same weights; mha_jax in float32 must be
within `FACTOR` times that distance for the logits, every layer's
residual stream and every attention pattern, on short prompts and on a
200-token input (Gemma also on 612 tokens, past its 512-token window).
The test prints the measured ratios; docs/pretrained.md
records them with the largest activation of each stream (SmolLM2's later
layers reach about 1e4, where one float32 rounding is about 1e-3
absolute, yet the relative errors in norm stay at the floor's size).
"""

import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import mha_jax
from mha_jax.models import generate
from mha_jax.pretrained import families
from tests.pretrained import compare

FAMILY = {"smollm2": "llama", "gemma3": "gemma3"}
FACTOR = 2.0


@pytest.fixture(scope="session", params=["smollm2", "gemma3"])
def model(request, real):
  return real(request.param)


def test_every_dequantized_tensor_equals_transformers_bit_for_bit(model):
  ours = compare.as_hf_tensors(model.model,
                               families.FAMILIES[FAMILY[model.name]])
  theirs = {n: t.numpy() for n, t in model.hf.state_dict().items()}
  if model.model.config.tie_embeddings:  # the head is the embedding
    assert "lm_head.weight" not in ours
    np.testing.assert_array_equal(theirs.pop("lm_head.weight"),
                                  theirs["model.embed_tokens.weight"])
  compare.assert_tensors_equal_bitwise(ours, theirs)


def test_forward_within_twice_transformers_own_float32_error(model):
  for batch, ids in model.batches.items():
    ours = compare.run(model.model, FAMILY[model.name], {"input_ids": ids})
    for q in ("main", "stream", "patterns"):
      ref, floor32 = model.out64[batch][q], model.out32[batch][q]
      assert ours[q].shape == ref.shape, (batch, q)
      floor = compare.rel(floor32, ref)
      assert 0 < floor < 1e-4, (batch, q, floor)  # a real float32 run
      err = compare.rel(ours[q], ref)
      print(f"{model.name} {batch} {q}: transformers {floor:.3g}, mha_jax "
            f"{err:.3g} ({err / floor:.2f}x), max |ref| "
            f"{np.abs(ref).max():.3g}")
      assert err <= FACTOR * floor, (batch, q, err, floor)


def test_greedy_decoding_with_the_cache_equals_generate(model):
  prompt = model.batches["short"][:1, :8]
  n = 32
  with torch.no_grad():
    want = model.hf.generate(prompt, max_new_tokens=n, do_sample=False,
                             min_new_tokens=n)[:, prompt.shape[1]:]
  got = generate.generate(model.model, jnp.asarray(prompt.numpy()), n,
                          max_len=64)
  np.testing.assert_array_equal(np.asarray(got), want.numpy())


def test_saved_back_opens_in_transformers_with_equal_logits(model, tmp_path):
  mha_jax.save_pretrained(model.model, tmp_path)
  hf = transformers.AutoModelForCausalLM.from_pretrained(
      tmp_path, dtype=torch.float32, attn_implementation="eager").eval()
  ids = model.batches["short"]
  with torch.no_grad():
    got, want = hf(ids).logits.numpy(), model.hf(ids).logits.numpy()
  np.testing.assert_array_equal(got, want)


def test_docs_recipes_run():
  # The blocks of docs/*.md marked `<!-- runnable-real -->`: they load a
  # real model, too slow for `make test`'s check of runnable blocks.
  mark = "<!-- runnable-real -->"
  blocks = []
  for page in sorted(pathlib.Path(__file__).parents[2].glob("docs/*.md")):
    lines = page.read_text().splitlines()
    for i, line in enumerate(lines):
      if line.strip() == mark:
        assert lines[i + 1].strip() == "```python", (page.name, i + 1)
        end = next(j for j in range(i + 2, len(lines))
                   if lines[j].strip() == "```")
        blocks.append((page.name, i + 1, "\n".join(lines[i + 2:end])))
  assert blocks
  for page, line, code in blocks:
    exec(compile(code, f"{page}:{line}", "exec"), {})  # pylint: disable=exec-used
