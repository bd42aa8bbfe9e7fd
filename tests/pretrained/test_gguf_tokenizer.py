"""`tokenizer_from_gguf` on tiny files written with `gguf.GGUFWriter`:
the pre-tokenizers, the SentencePiece prefix space and the errors, in
milliseconds, against transformers' GGUF tokenizer. The two real files
are checked in tests/real_models/test_real_tokenizer.py.
"""

import gguf
import pytest
import transformers
from transformers.convert_slow_tokenizer import bytes_to_unicode

from mha_jax.pretrained import PretrainedError
from mha_jax.pretrained import gguf_tokenizer
from mha_jax.pretrained import tokenizer as tokenizer_lib

regex = pytest.importorskip("regex")  # a transformers dependency


class Pair:
  """Ours and transformers' tokenizer of one file."""

  def __init__(self, path):
    self.ours = gguf_tokenizer.tokenizer_from_gguf(path)
    self.hf = transformers.AutoTokenizer.from_pretrained(
        str(path.parent), gguf_file=path.name)

  def check(self, text):
    ids = self.ours.encode(text).ids
    assert ids == self.hf(text)["input_ids"], text
    assert (self.ours.decode(ids, skip_special_tokens=False)
            == self.hf.decode(ids, skip_special_tokens=False)), text
    if self.hf.decode(ids, skip_special_tokens=True) == text:
      assert self.ours.decode(ids) == text  # round trip where theirs does



# --- tiny files -----------------------------------------------------------

BYTES = list(bytes_to_unicode().values())
BYTE_MERGES = ["Ġ t", "h e", "Ġt he", "Ġ w", "o r", "Ġw or", "l d",
               "Ġwor ld", "1 2", "12 3", "4 5", "Ġ 1", "Ġ Ġ", "ĠĠ Ġ",
               "' s", "Ċ Ċ", "i t"]


def write(path, arch="llama", **keys):
  """A GGUF file with no tensors and the given `tokenizer.ggml.*` keys."""
  w = gguf.GGUFWriter(str(path), arch)
  for key, value in keys.items():
    name = gguf_tokenizer.PREFIX + key
    if isinstance(value, bool):
      w.add_bool(name, value)
    elif isinstance(value, int):
      w.add_uint32(name, value)
    elif isinstance(value, str):
      w.add_string(name, value)
    else:
      w.add_array(name, value)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


def byte_level_file(path, pre):
  tokens = (["<|endoftext|>", "<|im_start|>"] + BYTES
            + ["".join(m.split()) for m in BYTE_MERGES])
  return write(path, model="gpt2", pre=pre, tokens=tokens,
               token_type=[3, 3] + [1] * (len(tokens) - 2),
               merges=BYTE_MERGES, bos_token_id=1, eos_token_id=0,
               padding_token_id=0)


BYTE_TEXTS = ["the 12345 world", "it's   there\n\n\n  42", "x1234y",
              "  \n  1", "A's 9999999 <|im_start|>the", "", "über 7½"]


@pytest.mark.parametrize("pre", ["gpt-2", "llama-bpe", "qwen2"])
def test_byte_level_splits_equal_transformers(tmp_path, pre):
  path = byte_level_file(tmp_path / "t.gguf", pre)
  pair = Pair(path)
  for text in BYTE_TEXTS:
    pair.check(text)


def test_smollm_cuts_every_digit(tmp_path):
  """"1 2" is a merge, yet "12" stays two tokens: the digits are cut
  apart before the BPE sees them."""
  tok = gguf_tokenizer.tokenizer_from_gguf(
      byte_level_file(tmp_path / "t.gguf", "smollm"))
  assert tok.encode(" 123 the").tokens == ["Ġ", "1", "2", "3", "Ġthe"]


def sentencepiece_file(path, arch, *, prefix, add_bos=True):
  pieces = ["▁", "t", "h", "e", "c", "a", "s", "he", "▁t", "▁the", "at",
            "▁c", "▁cat", "▁a", "▁s", "▁sat"]
  tokens = (["<unk>", "<s>", "</s>", "<ctl>", "<ud>"]
            + [f"<0x{b:02X}>" for b in range(256)] + pieces)
  types = [2, 3, 3, 3, 4] + [6] * 256 + [1] * len(pieces)
  # Pieces best-first, as SentencePiece writes them.
  scores = [0.0] * 261 + [-float(i) for i in range(len(pieces))]
  flags = {} if add_bos is None else {"add_bos_token": add_bos}
  return write(path, arch, model="llama", pre="default", tokens=tokens,
               token_type=types, scores=scores, bos_token_id=1,
               eos_token_id=2, unknown_token_id=0, add_space_prefix=prefix,
               **flags)


SP_TEXTS = ["the cat", "a cat sat", "thecat", " the", "é ok", "",
            "the<ctl>cat", "x<ud>y", "  the  cat  ", "<s>the"]


def test_sentencepiece_equals_transformers(tmp_path):
  """With the prefix space (llama.cpp's default, and what transformers
  always uses for a "llama" file)."""
  pair = Pair(sentencepiece_file(tmp_path / "t.gguf", "llama", prefix=True))
  for text in SP_TEXTS:
    pair.check(text)
  assert pair.ours.encode("é").tokens == ["<s>", "▁", "<0xC3>", "<0xA9>"]


def test_sentencepiece_without_prefix_space(tmp_path):
  tok = gguf_tokenizer.tokenizer_from_gguf(
      sentencepiece_file(tmp_path / "t.gguf", "llama", prefix=False))
  assert tok.encode("the cat").tokens == ["<s>", "t", "he", "▁cat"]
  assert tok.encode("x<ud>").tokens == ["<s>", "<0x78>", "<ud>"]
  assert tok.decode(tok.encode(" the cat").ids) == " the cat"


def test_bos_without_the_flag_follows_llama_cpp(tmp_path):
  """A file without `add_bos_token`: llama.cpp adds BOS to a SentencePiece
  vocabulary and not to a byte-level one; the flag, when present, wins."""
  def first(path, text="the cat"):
    return gguf_tokenizer.tokenizer_from_gguf(path).encode(text).tokens[0]
  assert first(sentencepiece_file(tmp_path / "a.gguf", "llama", prefix=True,
                                  add_bos=None)) == "<s>"
  assert first(sentencepiece_file(tmp_path / "b.gguf", "llama", prefix=True,
                                  add_bos=False)) == "▁the"
  assert first(byte_level_file(tmp_path / "c.gguf", "gpt-2"),
               "the") == "t"  # bos_token_id=1 is <|im_start|>, not added


def test_load_tokenizer_dispatches_on_suffix(tmp_path):
  path = byte_level_file(tmp_path / "t.gguf", "gpt-2")
  ours = tokenizer_lib.load_tokenizer(path)
  assert ours.encode("the world").tokens == ["t", "he", "Ġworld"]
  ours.save(str(tmp_path / "tokenizer.json"))  # the old path still works
  again = tokenizer_lib.load_tokenizer(tmp_path)
  assert again.encode("the 12").ids == ours.encode("the 12").ids


def test_no_tokenizer_keys(tmp_path):
  path = write(tmp_path / "t.gguf")
  with pytest.raises(PretrainedError,
                     match="expected tokenizer.ggml.tokens, found none"):
    gguf_tokenizer.tokenizer_from_gguf(path)


def test_unknown_model(tmp_path):
  path = write(tmp_path / "t.gguf", model="t5", tokens=["<pad>", "a"])
  with pytest.raises(PretrainedError, match=r"tokenizer\.ggml\.model: "
                     r"expected one of 'gpt2', 'llama'.*got 't5'"):
    gguf_tokenizer.tokenizer_from_gguf(path)


def test_unknown_pre(tmp_path):
  path = byte_level_file(tmp_path / "t.gguf", "falcon")
  with pytest.raises(PretrainedError, match=r"tokenizer\.ggml\.pre: "
                     r"expected one of .*'smollm'.*got 'falcon'"):
    tokenizer_lib.load_tokenizer(path)


def test_short_token_types(tmp_path):
  path = write(tmp_path / "t.gguf", model="gpt2", pre="gpt-2",
               tokens=BYTES, token_type=[1] * 10, merges=["Ġ t"])
  with pytest.raises(PretrainedError, match="token_type: expected 256"):
    gguf_tokenizer.tokenizer_from_gguf(path)
