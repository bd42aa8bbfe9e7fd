"""save_pretrained: what transformers opens from mha_jax's files.

Round trips in both directions: a loaded checkpoint saves the tensors it
was loaded from, bit for bit, and transformers computes the same logits
from them to the last bit (same float32 weights, same eager code); a
model initialised by mha_jax, saved, computes in transformers the logits
mha_jax computes, within twice transformers' own float32 error (as in
test_pretrained_agreement.py). A project config no family holds is
refused, naming the fields.
"""

import copy
import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.torch
import torch
import transformers
from flax import nnx

import mha_jax
from mha_jax.training import config as config_lib
from mha_jax.pretrained import PretrainedError
from mha_jax.pretrained import safetensors_files
from tests.pretrained import compare
import hf_models


def open_hf(directory, family):
  cls = hf_models.CLASSES.get(family, transformers.AutoModelForCausalLM)
  return cls.from_pretrained(directory, attn_implementation="eager").eval()


def tensors_of(directory):
  infos = safetensors_files.list_tensors(
      safetensors_files.checkpoint_files(directory))
  return {n: safetensors_files.read_tensor(i) for n, i in infos.items()}


@pytest.mark.parametrize("family", tuple(hf_models.CONFIGS))
def test_loaded_model_saves_its_tensors_and_transformers_logits(
    built, family, tmp_path):
  b = built(family)
  model = mha_jax.load_pretrained(b.directory)
  out = mha_jax.save_pretrained(model, tmp_path / "saved")
  before, after = tensors_of(b.directory), tensors_of(out)
  ignored = mha_jax.pretrained.FAMILIES[family].ignored
  before = {n: a for n, a in before.items()  # buffers, BERT's pooler
            if not any(re.fullmatch(p, n) for p, _ in ignored)}
  assert sorted(before) == sorted(after)
  for name, arr in before.items():
    np.testing.assert_array_equal(after[name], arr, err_msg=name)
  again = hf_models.run(open_hf(out, family), b.batch)
  np.testing.assert_array_equal(again["main"], b.out32["main"])


def _llama_like(**changes):
  return mha_jax.ModelConfig(**{**dict(
      vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
      max_len=32, positions="rotary", norm="rms", mlp_gated=True,
      mlp_activation="silu", mlp_bias=False, readout_bias=False,
      mlp_dim=48), **changes})


@pytest.mark.parametrize("family, config", [
    ("llama", _llama_like()),
    ("mistral", _llama_like(layer_windows=((3, 0), (3, 0)))),
    ("gpt2", mha_jax.ModelConfig(
        vocab_size=64, d_model=32, num_layers=2, num_heads=4, max_len=32,
        use_bias=True, tie_embeddings=True, readout_bias=False,
        norm_eps=1e-5)),
    # Local and global bases, scaling on the global layer only, QK-norm
    # with the model's eps and (1 + w).
    ("gemma3", _llama_like(
        num_layers=3, head_dim=16, mlp_activation="gelu_tanh",
        norm_offset=1.0, norm_placement="sandwich", norm_eps=1e-2,
        qk_norm="rms", embed_scale=math.sqrt(32), tie_embeddings=True,
        attn_scale=12 ** -0.5, rotary_base=1e6, local_rotary_base=1e4,
        rotary_scaling=("linear", 2.0),
        layer_windows=((3, 0), (3, 0), None))),
])
def test_mha_jax_model_opens_in_transformers(family, config, tmp_path):
  model = mha_jax.DecoderLM(config, rngs=nnx.Rngs(3))
  # Non-trivial norms and biases, so that a lost one shows.
  state = nnx.state(model, nnx.Param)
  keys = iter(jax.random.split(jax.random.key(4), 100))
  state = jax.tree.map(
      lambda x: x + 0.2 * jax.random.normal(next(keys), x.shape), state)
  nnx.update(model, state)
  out = mha_jax.save_pretrained(model, tmp_path / family)
  hf = open_hf(out, family)
  assert hf.config.model_type == mha_jax.pretrained.FAMILIES[
      family].model_types[0]
  tokens = jax.random.randint(jax.random.key(5), (2, 10), 0, 64)
  ours = np.asarray(model(tokens), np.float64)
  batch = dict(input_ids=torch.tensor(np.asarray(tokens), dtype=torch.long))
  ref32 = hf_models.run(hf, batch)["main"]
  ref64 = hf_models.run(copy.deepcopy(hf).double(), batch)["main"]
  assert compare.rel(ours, ref64) <= 2 * compare.rel(ref32, ref64)


def test_project_configs_without_a_family_are_refused_by_name(tmp_path):
  from configs import default  # pylint: disable=import-outside-toplevel
  config = config_lib.model_config(default.get_config())
  model = mha_jax.DecoderLM(config, rngs=nnx.Rngs(0))
  with pytest.raises(PretrainedError, match=r"no family holds.*readout_bias"):
    mha_jax.save_pretrained(model, tmp_path / "x")
  only = _llama_like(attention_only=True, mlp_gated=False)
  with pytest.raises(PretrainedError, match=r"attention_only: model True"):
    mha_jax.save_pretrained(mha_jax.DecoderLM(only, rngs=nnx.Rngs(0)),
                            tmp_path / "y", family="llama")
  assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_bfloat16_model_saves_bf16_tensors_torch_reads(built, tmp_path):
  """The hand-written bf16 path of the writer, read by safetensors' own
  torch reader: the original float32 weights rounded to bf16 by torch."""
  b = built("gemma2")
  model = mha_jax.load_pretrained(b.directory, param_dtype=jnp.bfloat16)
  out = mha_jax.save_pretrained(model, tmp_path / "bf16")
  assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
  got = safetensors.torch.load_file(out / "model.safetensors")
  want = {n: p.detach().to(torch.bfloat16)
          for n, p in b.model.state_dict().items() if n in got}
  assert sorted(want) == sorted(got)
  for name, tensor in got.items():
    assert tensor.dtype == torch.bfloat16, name
    assert torch.equal(tensor, want[name]), name


def test_a_local_rotary_base_that_changes_nothing_is_no_base():
  from mha_jax.pretrained import save  # pylint: disable=import-outside-toplevel
  c = mha_jax.ModelConfig(vocab_size=16, d_model=16, num_layers=2,
                          num_heads=2, max_len=8, positions="rotary",
                          rotary_base=1e4)
  windowed = c.replace(layer_windows=((3, 0), None))
  # No sliding layer, or the global base without scaling: the same model.
  assert save.canonical(c.replace(local_rotary_base=5.0)) == save.canonical(c)
  assert (save.canonical(windowed.replace(local_rotary_base=1e4))
          == save.canonical(windowed))
  # A base of its own on a sliding layer, or beside a global scaling, is not.
  assert (save.canonical(windowed.replace(local_rotary_base=5.0))
          != save.canonical(windowed))
  scaled = windowed.replace(rotary_scaling=("linear", 2.0))
  assert (save.canonical(scaled.replace(local_rotary_base=1e4))
          != save.canonical(scaled))
