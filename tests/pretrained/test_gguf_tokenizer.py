"""`tokenizer_from_gguf` gives the ids of transformers' GGUF tokenizer.

The two installed GGUF files are tokenized by both on varied texts
(unicode, whitespace, code, numbers, special-token strings): SmolLM2-135M
(byte-level BPE, pre "smollm") and Gemma 3 270M (SentencePiece-style,
262,144 tokens; transformers takes about 20 s to build it, so each
reference is built once per module). Where transformers leaves out
SmolLM2's digit cut, ours is checked against llama.cpp's "smollm" split
instead. Tiny files written with `gguf.GGUFWriter` check the other
pre-tokenizers, the SentencePiece prefix space and the errors in
milliseconds.
"""

import gguf
import pytest
import transformers
from transformers.convert_slow_tokenizer import bytes_to_unicode

from mha_jax.pretrained import PretrainedError
from mha_jax.pretrained import gguf_tokenizer
from mha_jax.pretrained import real_models
from mha_jax.pretrained import tokenizer as tokenizer_lib

regex = pytest.importorskip("regex")  # a transformers dependency

# Texts both files must tokenize as transformers does.
TEXTS = [
    "",
    "Hello world",
    "Hello, world! How are you?",
    "  leading spaces",
    "trailing   ",
    "a   b    c     d",
    "tabs\tand\t\ttabs",
    "line one\nline two\n\nline four\n\n\n",
    "\r\n windows\r\nlines",
    " ", "\n", "\t", "    ",
    "café naïve résumé Ångström",
    "Ünïcödé ÀÉÎÕÜ ß ø",
    "日本語のテキストです。中文也可以。",
    "Привет мир",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "emoji 😀👍🏽 🇫🇷 family 👨‍👩‍👧",
    "1234567890 and 3.14159 and 1,000,000",
    "the year 2024, pi=3.14159265358979, -42e-7",
    "def f(x):\n    if x > 0:\n        return x ** 2\n    return -x\n",
    "¿Qué? ¡Sí! «quotes» “smart” — dash…",
    "it's they're we've I'm you'll he'd",
    "http://example.com/path?q=1&r=2#frag",
    "\u200b zero width \u00a0nbsp and 　full width",
    "a" * 50,
    "<|im_start|>user\nHi<|im_end|>\n",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "<|endoftext|>",
    "<bos>hello<eos>",
    "<table><tr><td>1</td></tr></table>",
    "mixed: <|im_start|>assistant 42 café 😀\n\tdone",
]
# Whitespace or a space before a digit: SmolLM2 cuts every digit off
# first (its tokenizer.json and llama.cpp both do; transformers' GGUF
# reader does not), so these are checked for it against llama.cpp's split.
DIGIT_CUT = [
    "items:\n  1. one\n  2. two",
    "x = [\n    1,\n    22,\n]",
    "x² + y² = z²  ½ ⅓ Ⅻ",
    "\n\n2024\n\n",
    "total:    42",
]
# Gemma-only extras: long runs past its added whitespace tokens, literal
# byte-token and unused-token spellings.
GEMMA_EXTRA = [" " * 40 + "spaces", "\n" * 40 + "newlines",
               "\t" * 35 + "tabs", "<0x41> literal", "<unused5>",
               "tokens<start_of_image>x", "[multimodal]"]


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


@pytest.fixture(scope="module")
def smollm2():
  return Pair(real_models.smollm2_135m())


@pytest.fixture(scope="module")
def gemma3():
  return Pair(real_models.gemma3_270m())


@pytest.mark.parametrize("text", TEXTS)
def test_smollm2_ids_equal_transformers(smollm2, text):
  smollm2.check(text)


@pytest.mark.parametrize("text", TEXTS + DIGIT_CUT + GEMMA_EXTRA)
def test_gemma3_ids_equal_transformers(gemma3, text):
  gemma3.check(text)


# llama.cpp's "smollm" split: every \p{N} alone, then GPT-2's pattern
# inside each piece.
_GPT2 = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
         r"|\s+(?!\S)|\s+")


def smollm_pieces(text):
  return [w for piece in regex.split(r"(\p{N})", text)
          for w in regex.findall(_GPT2, piece)]


@pytest.mark.parametrize("text", DIGIT_CUT + [t for t in TEXTS
                                               if "<" not in t])
def test_smollm2_cuts_digits_as_llama_cpp(smollm2, text):
  """Each piece of llama.cpp's split, tokenized alone by transformers (its
  own split leaves a piece whole), gives our ids in order."""
  want = [i for w in smollm_pieces(text)
          for i in smollm2.hf(w, add_special_tokens=False)["input_ids"]]
  assert smollm2.ours.encode(text).ids == want


def test_specials_bos_and_padding(smollm2, gemma3):
  """Chat markers are one id each; SmolLM2 adds no BOS, Gemma adds <bos>."""
  assert smollm2.ours.encode("<|im_start|>").ids == [1]
  assert smollm2.ours.encode("<|endoftext|>hi").ids[0] == 0
  assert gemma3.ours.encode("<start_of_turn>").ids == [2, 105]
  assert gemma3.ours.encode("").ids == [2]
  assert smollm2.ours.padding["pad_id"] == 2
  assert gemma3.ours.padding["pad_id"] == 0


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


def sentencepiece_file(path, arch, *, prefix):
  pieces = ["▁", "t", "h", "e", "c", "a", "s", "he", "▁t", "▁the", "at",
            "▁c", "▁cat", "▁a", "▁s", "▁sat"]
  tokens = (["<unk>", "<s>", "</s>", "<ctl>", "<ud>"]
            + [f"<0x{b:02X}>" for b in range(256)] + pieces)
  types = [2, 3, 3, 3, 4] + [6] * 256 + [1] * len(pieces)
  # Pieces best-first, as SentencePiece writes them.
  scores = [0.0] * 261 + [-float(i) for i in range(len(pieces))]
  return write(path, arch, model="llama", pre="default", tokens=tokens,
               token_type=types, scores=scores, bos_token_id=1,
               eos_token_id=2, unknown_token_id=0, add_bos_token=True,
               add_space_prefix=prefix)


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
