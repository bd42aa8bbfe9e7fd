"""`pretrained.encode` pads to the batch, truncates on request, and leaves
the caller's tokenizer as it was (known answers from a hand-built
word-level vocabulary)."""

import numpy as np
import tokenizers

from mha_jax import pretrained


def _tokenizer():
  words = ["<pad>", "the", "cat", "sat", "on", "mat"]
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(
      {w: i for i, w in enumerate(words)}, unk_token="<pad>"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  # The file's own settings, as MiniLM's pads every text to 128.
  tok.enable_padding(pad_id=0, pad_token="<pad>", length=8)
  tok.enable_truncation(max_length=6)
  return tok


def test_encode_pads_to_the_batch_and_keeps_the_tokenizer():
  tok = _tokenizer()
  before = (tok.padding, tok.truncation)
  ids, mask = pretrained.encode(tok, ["the cat sat", "on the mat mat"],
                                max_len=3)
  np.testing.assert_array_equal(ids, [[1, 2, 3], [4, 1, 5]])
  np.testing.assert_array_equal(mask, np.ones((2, 3), bool))
  ids, mask = pretrained.encode(tok, ["the cat", "on the mat"])
  np.testing.assert_array_equal(ids, [[1, 2, 0], [4, 1, 5]])
  np.testing.assert_array_equal(mask, [[1, 1, 0], [1, 1, 1]])
  assert (tok.padding, tok.truncation) == before
