"""transformers' decoder LMs as the peers mha_jax's are timed against.

Shape letters: T tokens, P prompt tokens, N new tokens, V vocabulary (one
sequence throughout: batch 1).

What the decoder benchmarks (`pretrained_bench`, `real_lm_bench`, the GPU
benchmark) share: the random ids both libraries read, a torch
contestant's name, transformers' forward and greedy decode as the
zero-argument calls the clock times, and how far two decodes agree.
Torch is imported inside the calls, so importing this module needs no
torch.
"""

from __future__ import annotations

import numpy as np

FIRST_ID = 3  # past the special tokens of the GGUF files' vocabularies


def token_ids(vocab: int, length: int, *, seed: int = 0) -> np.ndarray:
  """`[1, length]` ids drawn uniformly from [FIRST_ID, vocab): timing
  needs no meaning, and a fixed seed gives both libraries one input."""
  rng = np.random.default_rng(seed)
  return rng.integers(FIRST_ID, vocab, (1, length), dtype=np.int64)


def thread_name(threads: int) -> str:
  """A torch contestant's name: "torch 1 thread", "torch 2 threads"."""
  return f"torch {threads} thread{'s' if threads > 1 else ''}"


def forward(hf, ids):
  """A call returning transformers' logits `[1, T, V]` of `ids [1, T]`
  (a torch tensor), no cache written."""
  import torch  # pylint: disable=import-outside-toplevel

  def call():
    with torch.no_grad():
      return hf(ids, use_cache=False).logits
  return call


def greedy_decode(hf, prompt, new_tokens: int):
  """A call returning the `[1, N]` tokens transformers' `generate` adds
  greedily after `prompt [1, P]` (a torch tensor), with its KV cache; N
  exactly (`min_new_tokens`), so an end-of-text token cannot cut the
  timed work short."""
  import torch  # pylint: disable=import-outside-toplevel
  ones = torch.ones_like(prompt)

  def call():
    with torch.no_grad():
      out = hf.generate(prompt, attention_mask=ones,
                        max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                        do_sample=False, pad_token_id=0)
    return out[:, prompt.shape[1]:]
  return call


def leading_agreement(a, b) -> int:
  """How many tokens `a` and `b` (`[1, N]`) share before they differ."""
  a, b = np.asarray(a).ravel(), np.asarray(b).ravel()
  differ = np.flatnonzero(a != b)
  return int(differ[0]) if differ.size else int(a.size)
