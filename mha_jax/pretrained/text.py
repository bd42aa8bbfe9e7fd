"""Text in and out of a loaded model, as TransformerLens's calls.

Shape letters: B batch (texts), T tokens, V vocabulary, N new tokens.

    lm = mha_jax.load_language_model("path/to/gpt2")  # or a .gguf file
    tokens = lm.to_tokens("The cat sat")      # [1, T] int32, BOS first
    lm.to_str_tokens("The cat sat")           # ["<|endoftext|>", "The", ...]
    logits, cache = lm.run_with_cache("The cat sat")
    lm.generate("The cat sat", max_new_tokens=5)   # the text, continued

`LanguageModel` holds a model, its `tokenizers.Tokenizer` and its BOS
rule. Text is tokenized without the tokenizer's own special tokens and
BOS is then prepended by the rule, so that `prepend_bos` means the same
for every family (TransformerLens does the same reconciliation). Where
`prepend_bos` is None the family's default applies (`DEFAULT_PREPEND_BOS`):
TransformerLens's, which prepends BOS for every family except GPT-NeoX
and Qwen2; a GGUF file says itself (`tokenizer.ggml.add_bos_token`, the
rule llama.cpp follows: SmolLM2 no, Gemma 3 yes). An encoder (BERT) takes
its tokenizer's template ([CLS] ... [SEP]) and no `prepend_bos`.
"""

from __future__ import annotations

import pathlib

import jax.numpy as jnp
import numpy as np
import tokenizers

from mha_jax.models import generate as generate_lib
from mha_jax.models import transformer
from mha_jax.pretrained import gguf_files
from mha_jax.pretrained import gguf_tokenizer
from mha_jax.pretrained import load as load_lib
from mha_jax.pretrained import tokenizer as tokenizer_lib
from mha_jax.pretrained.tokenizer import load_tokenizer

# config.json `model_type` -> prepend BOS by default (TransformerLens's
# `default_prepend_bos`: True unless the family says otherwise).
DEFAULT_PREPEND_BOS = {"gpt2": True, "llama": True, "mistral": True,
                       "qwen2": False, "gemma2": True, "gemma3": True,
                       "gpt_neox": False}


def _first(value):
  """An id field that may be a list (Llama 3's eos_token_id) or None."""
  if isinstance(value, (list, tuple)):
    return int(value[0]) if value else None
  return None if value is None else int(value)


class LanguageModel:
  """A model with its tokenizer: text in, text out.

  Args:
    model: a `DecoderLM` or `Encoder`.
    tokenizer: its `tokenizers.Tokenizer` (`load_tokenizer`).
    bos_id, eos_id: the BOS and EOS ids (None: the model has none).
    prepend_bos: the default of `to_tokens`' `prepend_bos` (decoders).
    family: what the rule came from, for messages ("gpt2", "gguf llama").
  """

  def __init__(self, model, tokenizer: tokenizers.Tokenizer, *,
               bos_id: int | None = None, eos_id: int | None = None,
               prepend_bos: bool = False, family: str = ""):
    self.model, self.tokenizer = model, tokenizer
    self.bos_id, self.eos_id, self.family = bos_id, eos_id, family
    self.encoder = isinstance(model, transformer.Encoder)
    if prepend_bos and bos_id is None:
      raise ValueError("LanguageModel: prepend_bos=True needs `bos_id`, got "
                       "None")
    self.prepend_bos = prepend_bos and not self.encoder
    self.pad_id = tokenizer.padding["pad_id"] if tokenizer.padding else 0

  def __repr__(self) -> str:
    return (f"LanguageModel({type(self.model).__name__}, family="
            f"{self.family!r}, bos_id={self.bos_id}, prepend_bos="
            f"{self.prepend_bos})")

  # --- text -> ids --------------------------------------------------------

  def _bos(self, prepend_bos, fn) -> bool:
    if prepend_bos is None:
      return self.prepend_bos
    if self.encoder:
      raise ValueError(f"{fn}: `prepend_bos` applies to decoders; an "
                       "encoder's text takes its tokenizer's template "
                       "([CLS] ... [SEP] for BERT), got prepend_bos="
                       f"{prepend_bos!r}")
    if not isinstance(prepend_bos, bool):
      raise TypeError(f"{fn}: `prepend_bos` must be None, True or False, "
                      f"got {prepend_bos!r}")
    if prepend_bos and self.bos_id is None:
      raise ValueError(f"{fn}: prepend_bos=True, but this model "
                       f"({self.family or 'no family'}) has no BOS token")
    return prepend_bos

  def _rows(self, text, prepend_bos, fn) -> list[list[int]]:
    """Each text's ids, unpadded, with BOS as the rule says."""
    texts = [text] if isinstance(text, str) else text
    if not isinstance(texts, (list, tuple)) or not all(
        isinstance(t, str) for t in texts) or not texts:
      raise TypeError(f"{fn}: `text` must be a str or a non-empty list of "
                      f"str, got {text!r:.60}")
    bos = self._bos(prepend_bos, fn)
    # Neither padded nor truncated here: rows are padded to the batch's
    # longest after BOS is placed.
    encs = tokenizer_lib.encodings(self.tokenizer, list(texts),
                                   truncate=False,
                                   add_special_tokens=self.encoder)
    return [([self.bos_id] if bos else []) + e.ids for e in encs]

  def _pad(self, rows):
    """`(ids [B, T] int32, lengths [B])`, right-padded with the pad id."""
    t = max(len(r) for r in rows)
    ids = np.full((len(rows), t), self.pad_id, np.int32)
    for b, r in enumerate(rows):
      ids[b, :len(r)] = r
    return ids, np.array([len(r) for r in rows], np.int32)

  def to_tokens(self, text, prepend_bos: bool | None = None) -> jnp.ndarray:
    """A str or a list of str -> ids `[B, T]` int32 (B = 1 for a str),
    right-padded with the tokenizer's pad id (0 without one).
    `prepend_bos`: None is the family's default (the module docstring)."""
    ids, _ = self._pad(self._rows(text, prepend_bos, "to_tokens"))
    return jnp.asarray(ids)

  def to_str_tokens(self, text_or_tokens, prepend_bos: bool | None = None):
    """Each token as the text it decodes to alone (TransformerLens's: a
    GPT-2 "Ġcat" reads " cat"; special tokens kept). A str or ids `[T]`
    (or `[1, T]`) -> list of str; a list of str or ids `[B, T]` -> one
    list per row (ids rows keep their padding)."""
    fn = "to_str_tokens"
    if isinstance(text_or_tokens, str) or (
        isinstance(text_or_tokens, (list, tuple)) and text_or_tokens
        and all(isinstance(t, str) for t in text_or_tokens)):
      rows = self._rows(text_or_tokens, prepend_bos, fn)
      out = [self._pieces(r) for r in rows]
      return out[0] if isinstance(text_or_tokens, str) else out
    ids = self._ids(text_or_tokens, fn)
    if ids.ndim == 1:
      return self._pieces(ids)
    rows = [self._pieces(r) for r in ids]
    return rows[0] if len(rows) == 1 else rows

  def _pieces(self, ids) -> list[str]:
    return [self.tokenizer.decode([int(i)], skip_special_tokens=False)
            for i in ids]

  def _ids(self, tokens, fn) -> np.ndarray:
    ids = np.asarray(tokens)
    if ids.ndim not in (1, 2) or not np.issubdtype(ids.dtype, np.integer):
      raise ValueError(f"{fn}: `tokens` must be integer ids [T] or [B, T], "
                       f"got {ids.dtype} of shape {ids.shape}")
    return ids

  # --- ids -> text --------------------------------------------------------

  def to_string(self, tokens):
    """Ids `[T]` -> str, `[B, T]` -> list of str; special tokens kept
    (TransformerLens's, and nothing of the text is cleaned up)."""
    ids = self._ids(tokens, "to_string")
    decode = lambda r: self.tokenizer.decode([int(i) for i in r],
                                          skip_special_tokens=False)
    return decode(ids) if ids.ndim == 1 else [decode(r) for r in ids]

  # --- running ----------------------------------------------------------

  def _tokens(self, text_or_tokens, prepend_bos):
    if isinstance(text_or_tokens, str) or (
        isinstance(text_or_tokens, (list, tuple)) and text_or_tokens
        and isinstance(text_or_tokens[0], str)):
      return self.to_tokens(text_or_tokens, prepend_bos)
    return text_or_tokens

  def __call__(self, text_or_tokens, *, prepend_bos=None, **kwargs):
    """The model's call on text (tokenized by `to_tokens`) or ids."""
    return self.model(self._tokens(text_or_tokens, prepend_bos), **kwargs)

  def run_with_cache(self, text_or_tokens, names=None, *, prepend_bos=None,
                     **kwargs):
    """`(logits, ActivationCache)` of text or ids `[B, T]`
    (`DecoderLM.run_with_cache`)."""
    return self.model.run_with_cache(
        self._tokens(text_or_tokens, prepend_bos), names, **kwargs)

  def generate(self, prompt, max_new_tokens: int = 10, *,
               temperature: float = 0.0, rng=None, top_k: int | None = None,
               top_p: float | None = None, prepend_bos: bool | None = None,
               stop_at_eos: bool = True):
    """A prompt (str, or a list of str) continued by up to
    `max_new_tokens` tokens, as text: the prompt's tokens (less the BOS
    the rule prepended) and the new ones, decoded together. Greedy at
    temperature 0, else sampled with `rng`, kept to the `top_k` most
    likely tokens and the smallest set holding `top_p` of the mass when
    given (`models.generate.generate`, where their rules are). `stop_at_eos`: the text ends after the
    first EOS generated (the loop itself runs all N steps). Prompts
    of lengths within one `generate.bucket` share one compiled program.
    """
    rows = self._rows(prompt, prepend_bos, "generate")
    start = int(self._bos(prepend_bos, "generate"))  # drop the BOS we added
    ids, lengths = self._pad(rows)
    new = np.asarray(generate_lib.generate(
        self.model, jnp.asarray(ids), max_new_tokens,
        prompt_lengths=jnp.asarray(lengths), temperature=temperature,
        rng=rng, top_k=top_k, top_p=top_p))  # [B, N]
    texts = []
    for r, n in zip(rows, new):
      n = list(n)
      if stop_at_eos and self.eos_id is not None and self.eos_id in n:
        n = n[:n.index(self.eos_id) + 1]
      texts.append(self.to_string(np.asarray(r[start:] + n, np.int64)))
    return texts[0] if isinstance(prompt, str) else texts


# ----------------------------------------------------------------------------
# Loading: the model, its tokenizer and its BOS rule from one path.


def bos_rule(path) -> dict:
  """`{"family", "bos_id", "eos_id", "prepend_bos"}` of a checkpoint
  directory (config.json's `model_type`, `bos_token_id`,
  `eos_token_id`; the default from `DEFAULT_PREPEND_BOS`) or a GGUF file
  (its `tokenizer.ggml.*` ids and `add_bos_token`, which llama.cpp
  defaults to True for a SentencePiece vocabulary only)."""
  path = pathlib.Path(path)
  if path.is_file() and (path.suffix == ".gguf" or gguf_files.is_gguf(path)):
    reader = gguf_files.open_reader(path)
    fields = gguf_tokenizer.tokenizer_fields(reader)
    get = lambda k, d=None: fields.get(gguf_tokenizer.PREFIX + k, d)
    arch = gguf_files.metadata(reader).get("general.architecture")
    bos = _first(get("bos_token_id"))
    add = bool(get("add_bos_token", get("model") == "llama"))
    return dict(family=f"gguf {arch}", bos_id=bos,
                eos_id=_first(get("eos_token_id")),
                prepend_bos=add and bos is not None)
  fields = load_lib.read_config_json(path)
  kind = fields.get("model_type")
  bos = _first(fields.get("bos_token_id"))
  return dict(family=kind, bos_id=bos, eos_id=_first(
      fields.get("eos_token_id")), prepend_bos=bool(
          DEFAULT_PREPEND_BOS.get(kind, False)) and bos is not None)


def load_language_model(path, **load_kwargs) -> LanguageModel:
  """`load_pretrained(path, **load_kwargs)` with `load_tokenizer(path)`
  and the BOS rule of `bos_rule(path)`, as one `LanguageModel`."""
  model = load_lib.load_pretrained(path, **load_kwargs)
  return LanguageModel(model, load_tokenizer(path), **bos_rule(path))
