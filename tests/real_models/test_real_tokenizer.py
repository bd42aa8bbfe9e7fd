"""The tokenizers of the two installed GGUF files give the ids of
transformers' GGUF tokenizer (a tier of its own: building Gemma's
262,144-token reference takes transformers about 20 s, reading each file
with the gguf package 4 to 16 s).

The two files are tokenized by both on varied texts (unicode,
whitespace, code, numbers, special-token strings): SmolLM2-135M
(byte-level BPE, pre "smollm") and Gemma 3 270M (SentencePiece-style).
Where transformers leaves out SmolLM2's digit cut, ours is checked
against llama.cpp's "smollm" split instead (docs/pretrained.md).
"""

import pytest

from mha_jax.pretrained import real_models
from tests.pretrained.test_gguf_tokenizer import Pair

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


