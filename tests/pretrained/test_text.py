"""Text in and out of loaded checkpoints (`pretrained/text.py`), and the
activation cache on them.

Known answers: token ids read off hand-written vocabularies; greedy text
from transformers' own `generate` on the same weights; the cache's
decomposition against transformers' final stream, and the norm applied
to it against NumPy by hand.
"""

import json
import shutil
import types

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
import torch
from flax import nnx
from tokenizers import models, pre_tokenizers

import mha_jax
from mha_jax.models import activation_cache
from mha_jax.models import generate
from mha_jax.pretrained import text as text_lib
from tests.pretrained import compare
from tests.pretrained import gguf_models
import hf_models

# --- the cache on loaded families -----------------------------------------


def _cached(model, tokens, kw):
  graphdef, state = nnx.split(model)
  return jax.jit(lambda s, t, kw: nnx.merge(graphdef, s).run_with_cache(
      t, **kw))(state, tokens, kw)


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma3"])
def test_decomposition_is_transformers_final_stream(built, family):
  """LayerNorm (GPT-2), RMSNorm (Llama), Gemma's (1 + w) RMSNorm with
  sandwich blocks: the components sum to the stream transformers
  computes, within twice transformers' own float32 error of float64."""
  b = built(family)
  model = mha_jax.load_pretrained(b.directory, implementation="vmap")
  tokens, kw = compare.model_kwargs(family, b.batch)
  logits, cache = _cached(model, tokens, kw)
  parts = np.asarray(cache.decompose_resid(), np.float64)
  want, want32 = b.out64["stream"][-1], b.out32["stream"][-1]
  floor = compare.rel(want32, want)
  assert compare.rel(parts.sum(0), want) <= 2 * floor + 8 * compare.U32
  # The final norm, by hand from the captured stream.
  x = np.asarray(cache["resid_post", -1], np.float64)
  norm = model.final_ln
  if family == "gpt2":
    w, bias = np.asarray(norm.scale[...]), np.asarray(norm.bias[...])
    x = x - x.mean(-1, keepdims=True)
    centred = parts - parts.mean(-1, keepdims=True)
  else:  # Llama's w; Gemma's 1 + w (its offset)
    w, bias, centred = norm.offset + np.asarray(norm.scale[...]), 0.0, parts
  scale = np.sqrt((x ** 2).mean(-1, keepdims=True) + hf_models.EPS)
  by_hand = centred / scale * w
  got = cache.apply_ln_to_stack(cache.decompose_resid(), model)
  np.testing.assert_allclose(got, by_hand, rtol=1e-4, atol=1e-5)
  # Through the readout, the parts plus the bias are the logits.
  readout = np.asarray(model.logits(jax.numpy.asarray(
      (by_hand.sum(0) + bias), jax.numpy.float32)))
  np.testing.assert_allclose(readout, logits, rtol=1e-4, atol=1e-4)


def test_bert_refuses_decomposition(built):
  """From the checkpoint's config alone: no forward is needed to know."""
  config = mha_jax.pretrained.load_config(built("bert").directory)
  cache = activation_cache.ActivationCache(
      {}, activation_cache.Layout.of(types.SimpleNamespace(config=config)))
  with pytest.raises(ValueError, match=r"decompose_resid: the model's "
                     r"blocks are post-norm \(norm_placement='post', as "
                     r"BERT's\)"):
    cache.decompose_resid()


# --- text on a checkpoint directory ---------------------------------------

# Ids by hand: 0 <pad>, 1 BOS (gpt2's config says bos_token_id=1), 2 EOS,
# then the words, then "w<id>" up to the model's vocabulary.
WORDS = ["<pad>", "<|endoftext|>", "<eos>", "the", "cat", "sat", "on",
         "mat"]
VOCAB = WORDS + [f"w{i}" for i in range(len(WORDS), hf_models.VOCAB)]


def word_tokenizer() -> tokenizers.Tokenizer:
  tok = tokenizers.Tokenizer(models.WordLevel(
      {w: i for i, w in enumerate(VOCAB)}, unk_token="<pad>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok.add_special_tokens(WORDS[:3])
  return tok


@pytest.fixture(scope="module")
def gpt2_lm(built, tmp_path_factory):
  """The tiny GPT-2 checkpoint with a word-level tokenizer.json beside
  it, loaded by `load_language_model`."""
  b = built("gpt2")
  directory = tmp_path_factory.mktemp("gpt2_text")
  for name in ("config.json", "model.safetensors"):
    shutil.copy(b.directory / name, directory / name)
  word_tokenizer().save(str(directory / "tokenizer.json"))
  return b, mha_jax.load_language_model(directory)


def test_to_tokens_and_back(gpt2_lm):
  _, lm = gpt2_lm
  assert lm.prepend_bos and lm.bos_id == 1 and lm.eos_id == 2
  np.testing.assert_array_equal(lm.to_tokens("the cat sat"), [[1, 3, 4, 5]])
  np.testing.assert_array_equal(lm.to_tokens("the cat", prepend_bos=False),
                                [[3, 4]])
  np.testing.assert_array_equal(lm.to_tokens(["the cat sat", "mat"]),
                                [[1, 3, 4, 5], [1, 7, 0, 0]])
  assert lm.to_str_tokens("the cat") == ["<|endoftext|>", "the", "cat"]
  assert lm.to_str_tokens(np.array([[5, 9]])) == ["sat", "w9"]
  assert lm.to_str_tokens(["cat", "on mat"], prepend_bos=False) == [
      ["cat"], ["on", "mat"]]
  assert lm.to_string(np.array([3, 4])) == "the cat"
  assert lm.to_string(np.array([[1, 5], [6, 7]])) == [
      "<|endoftext|> sat", "on mat"]


def test_run_with_cache_on_text_is_the_ids_run(gpt2_lm):
  _, lm = gpt2_lm
  logits, cache = lm.run_with_cache("the cat sat", ("blocks.1.resid_post",))
  want = lm.model(np.array([[1, 3, 4, 5]], np.int32))
  np.testing.assert_allclose(logits, want, atol=1e-6)
  assert cache.keys() == ("blocks.1.resid_post",)


def test_greedy_text_is_transformers_generate(gpt2_lm):
  b, lm = gpt2_lm
  with torch.no_grad():
    ids = b.model.generate(torch.tensor([[1, 3, 4, 5]]), max_new_tokens=4,
                           do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, 4:].tolist()
  want = " ".join(["the", "cat", "sat"] + [VOCAB[i] for i in ids])
  assert lm.generate("the cat sat", max_new_tokens=4) == want
  assert lm.generate(["the cat sat"], max_new_tokens=4) == [want]


def test_sampled_text_filters_as_generate_on_ids(gpt2_lm):
  _, lm = gpt2_lm
  key = jax.random.key(4)
  ids = jnp.asarray([[1, 3, 4, 5]], jnp.int32)
  new = generate.generate(lm.model, ids, 4, temperature=0.8, rng=key,
                          top_k=3, top_p=0.9)[0].tolist()
  want = " ".join(["the", "cat", "sat"] + [VOCAB[i] for i in new])
  assert lm.generate("the cat sat", max_new_tokens=4, temperature=0.8,
                     rng=key, top_k=3, top_p=0.9) == want
  # top_k=1 keeps only the most likely token: the greedy text.
  assert lm.generate("the cat sat", max_new_tokens=4, temperature=0.8,
                     rng=key, top_k=1) == lm.generate("the cat sat",
                                                      max_new_tokens=4)


@pytest.mark.parametrize("call, message", [
    (lambda lm: lm.to_tokens(3), TypeError("to_tokens: `text` must be a str "
                                           "or a non-empty list of str, got "
                                           "3")),
    (lambda lm: lm.to_tokens("the", prepend_bos=1), TypeError(
        "to_tokens: `prepend_bos` must be None, True or False, got 1")),
    (lambda lm: lm.to_string(np.zeros((1, 1, 2), np.int32)), ValueError(
        "to_string: `tokens` must be integer ids [T] or [B, T], got int32 "
        "of shape (1, 1, 2)")),
])
def test_text_errors(gpt2_lm, call, message):
  _, lm = gpt2_lm
  with pytest.raises(type(message)) as e:
    call(lm)
  assert str(e.value) == str(message)


def test_no_bos_token_refuses_prepend_bos(gpt2_lm):
  _, lm = gpt2_lm
  bare = text_lib.LanguageModel(lm.model, lm.tokenizer, family="qwen2")
  np.testing.assert_array_equal(bare.to_tokens("cat"), [[4]])
  with pytest.raises(ValueError, match=r"to_tokens: prepend_bos=True, but "
                     r"this model \(qwen2\) has no BOS token"):
    bare.to_tokens("cat", prepend_bos=True)


@pytest.mark.parametrize("model_type, bos, want", [
    ("gpt2", 50256, True), ("llama", 1, True), ("mistral", 1, True),
    ("gemma2", 2, True), ("gemma3", 2, True), ("gpt_neox", 0, False),
    ("qwen2", 151643, False), ("bert", None, False), ("llama", None, False),
])
def test_bos_rule_per_family(tmp_path, model_type, bos, want):
  (tmp_path / "config.json").write_text(json.dumps(
      {"model_type": model_type, "bos_token_id": bos, "eos_token_id": [7]}))
  rule = text_lib.bos_rule(tmp_path)
  assert rule == dict(family=model_type, bos_id=bos, eos_id=7,
                      prepend_bos=want)


# --- text on a GGUF file ------------------------------------------------------

# A SentencePiece vocabulary: 0 <unk>, 1 <s>, 2 </s>, 256 byte tokens
# (3..258), then the pieces (259 on).
PIECES = ["▁", "t", "h", "e", "c", "a", "he", "▁t", "▁the", "at", "▁c",
          "▁cat"]
SP_TOKENS = (["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
             + PIECES)


def _add_sentencepiece(writer, add_bos):
  writer.add_tokenizer_model("llama")
  writer.add_tokenizer_pre("default")
  writer.add_token_list(SP_TOKENS)
  writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(PIECES))
  writer.add_token_scores([0.0] * 259 + [-float(i)
                                         for i in range(len(PIECES))])
  writer.add_bos_token_id(1)
  writer.add_eos_token_id(2)
  writer.add_unk_token_id(0)
  if add_bos is not None:
    writer.add_add_bos_token(add_bos)


def test_gguf_language_model(tmp_path, monkeypatch):
  """A tiny llama GGUF file carrying its tokenizer: BOS by the file's
  own flag, ids read off the vocabulary above."""
  original = gguf.GGUFWriter

  class WithTokenizer(original):
    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      _add_sentencepiece(self, add_bos=True)

  monkeypatch.setattr(gguf, "GGUFWriter", WithTokenizer)
  path = tmp_path / "tiny.gguf"
  gguf_models.write(gguf_models.build("llama"), path, quantize=False)
  monkeypatch.undo()
  lm = mha_jax.load_language_model(path)
  assert (lm.family, lm.bos_id, lm.prepend_bos) == ("gguf llama", 1, True)
  the, cat = 259 + PIECES.index("▁the"), 259 + PIECES.index("▁cat")
  np.testing.assert_array_equal(lm.to_tokens("the cat"), [[1, the, cat]])
  assert lm.to_str_tokens("the cat") == ["<s>", "the", "cat"]
  logits, cache = lm.run_with_cache("the cat", ("blocks.0.attn.pattern",))
  assert logits.shape == (1, 3, hf_models.VOCAB)
  assert cache["pattern", 0].shape == (1, 4, 3, 3)


@pytest.mark.parametrize("add_bos, want", [(None, True), (False, False)])
def test_gguf_bos_rule_is_the_files_flag(tmp_path, add_bos, want):
  """Without the flag llama.cpp adds BOS to a SentencePiece vocabulary."""
  path = tmp_path / "t.gguf"
  writer = gguf.GGUFWriter(str(path), "llama")
  _add_sentencepiece(writer, add_bos)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  assert text_lib.bos_rule(path) == dict(family="gguf llama", bos_id=1,
                                         eos_id=2, prepend_bos=want)
