"""Bad checkpoints fail before any model exists, naming what is wrong.

Each case edits a copy of a tiny saved model and must raise
PretrainedError whose message names the file (or directory), the tensor
or field, what was expected and what came. Also: sharded checkpoints
load to the same model as a single file.
"""

import json
import shutil

import numpy as np
import pytest

import mha_jax
from mha_jax.pretrained import PretrainedError
from mha_jax.pretrained import safetensors_files

ST = "model.safetensors"


def _tensors(directory):
  infos = safetensors_files.list_tensors([directory / ST])
  return {n: safetensors_files.read_tensor(i) for n, i in infos.items()}


def _copy(built, family, tmp_path, edit_tensors=None, edit_config=None):
  src = built(family).directory
  dst = tmp_path / f"{family}_edited"
  shutil.copytree(src, dst)
  if edit_tensors is not None:
    tensors = _tensors(dst)
    edit_tensors(tensors)
    safetensors_files.write(tensors, dst / ST, metadata={"format": "pt"})
  if edit_config is not None:
    fields = json.loads((dst / "config.json").read_text())
    edit_config(fields)
    (dst / "config.json").write_text(json.dumps(fields))
  return dst


def _set(name, value):
  return lambda t: t.__setitem__(name, value)


CASES = {
    "missing tensor": ("gpt2", dict(edit_tensors=lambda t: t.pop(
        "transformer.h.1.mlp.c_fc.bias")),
        r"missing tensors: \['h\.1\.mlp\.c_fc\.bias'\] \(for parameters "
        r"\['blocks\.1\.mlp_in\.bias'\]\)"),
    "unexpected tensor": ("gpt2", dict(edit_tensors=_set(
        "transformer.h.0.attn.extra", np.zeros(3, np.float32))),
        r"model\.safetensors: unexpected tensor "
        r"'transformer\.h\.0\.attn\.extra': the gpt2 table has no such name"),
    "tensor the config lacks": ("llama", dict(edit_tensors=_set(
        "model.layers.0.self_attn.q_proj.bias", np.zeros(32, np.float32))),
        r"unexpected tensor 'model\.layers\.0\.self_attn\.q_proj\.bias': it "
        r"would fill \['blocks\.0\.attn\.b_q'\], which this config's model "
        r"does not have"),
    "wrong shape": ("llama", dict(edit_tensors=_set(
        "model.layers.1.self_attn.k_proj.weight",
        np.zeros((32, 32), np.float32))),
        r"model\.safetensors: tensor 'model\.layers\.1\.self_attn\.k_proj\."
        r"weight': expected shape \[16, 32\] \(\(k d\) m for this "
        r"config\.json\), got \[32, 32\]"),
    "wrong dtype": ("gpt_neox", dict(edit_tensors=_set(
        "gpt_neox.final_layer_norm.weight", np.zeros(32, np.int32))),
        r"tensor 'gpt_neox\.final_layer_norm\.weight': expected a float "
        r"dtype \(F32, F16, BF16, F64\), got I32"),
    "unsupported architecture": ("gpt2", dict(
        edit_config=lambda c: c.update(model_type="t5")),
        r"config\.json: field 'model_type': mha_jax loads \['bert', 'gemma2',"
        r".*\], got 't5'"),
    "unimplemented rope type": ("llama", dict(
        edit_config=lambda c: c["rope_parameters"].update(rope_type="yarn")),
        r"config\.json: field 'rope_parameters': rope_type 'yarn' is not "
        r"implemented; mha_jax implements 'default', 'linear' and 'llama3'"),
    "unknown field": ("mistral", dict(
        edit_config=lambda c: c.update(attention_chunk_size=8)),
        r"config\.json: field 'attention_chunk_size'=8 is not understood by "
        r"the mistral loader"),
    "unsupported value": ("gpt2", dict(
        edit_config=lambda c: c.update(scale_attn_by_inverse_layer_idx=True)),
        r"field 'scale_attn_by_inverse_layer_idx': mha_jax scales every "
        r"layer's scores alike; expected false, got true"),
    "bad config value": ("bert", dict(
        edit_config=lambda c: c.update(position_embedding_type="relative_key")),
        r"field 'position_embedding_type': mha_jax supports \['absolute'\], "
        r"got 'relative_key'"),
    "invalid ModelConfig": ("qwen2", dict(
        edit_config=lambda c: c.update(num_key_value_heads=3)),
        r"config\.json: gives an invalid ModelConfig: "
        r"ModelConfig\.num_kv_heads: num_kv_heads=3 must divide num_heads=4"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_checkpoint_is_refused_by_name(built, tmp_path, case):
  family, edits, message = CASES[case]
  directory = _copy(built, family, tmp_path, **edits)
  with pytest.raises(PretrainedError, match=message):
    mha_jax.load_pretrained(directory)


def test_truncated_file_is_refused_naming_it(built, tmp_path):
  directory = _copy(built, "gpt2", tmp_path)
  data = (directory / ST).read_bytes()
  (directory / ST).write_bytes(data[:len(data) // 2])
  with pytest.raises(PretrainedError,
                     match=r"model\.safetensors: expected a safetensors file,"
                           r" the package could not read it"):
    mha_jax.load_pretrained(directory)


def test_directory_without_config_or_weights(built, tmp_path):
  for path, problem in [
      (tmp_path / "absent", "expected a checkpoint directory or a GGUF "
       "file, got no such file or directory"),
      (tmp_path / "model.gguf", "expected a GGUF file, got no such file")]:
    with pytest.raises(PretrainedError) as err:
      mha_jax.load_pretrained(path)
    assert str(err.value) == f"{path}: {problem}"
  text = tmp_path / "notes.txt"
  text.write_text("not a model")
  with pytest.raises(PretrainedError) as err:
    mha_jax.load_pretrained(text)
  assert str(err.value) == (f"{text}: expected a checkpoint directory or a "
                            "GGUF file, got a file that is not GGUF")
  empty = tmp_path / "empty"
  empty.mkdir()
  (empty / "model.safetensors").write_bytes(b"")
  with pytest.raises(PretrainedError, match=r"empty: expected config\.json "
                     r"\(the model's architecture\), found "
                     r"\['model\.safetensors'\]"):
    mha_jax.load_pretrained(empty)
  no_weights = _copy(built, "bert", tmp_path)
  (no_weights / ST).unlink()
  with pytest.raises(PretrainedError, match=r"expected model\.safetensors or "
                     r"model\.safetensors\.index\.json, found no safetensors"):
    mha_jax.load_pretrained(no_weights)


def test_sharded_checkpoint_loads_the_same_weights(built, tmp_path):
  b = built("qwen2")
  sharded = tmp_path / "sharded"
  b.model.save_pretrained(sharded, max_shard_size="40KB")
  assert len(list(sharded.glob("*.safetensors"))) > 2
  one = mha_jax.load_pretrained(b.directory)
  many = mha_jax.load_pretrained(sharded)
  tokens = b.batch["input_ids"].numpy()
  np.testing.assert_array_equal(np.asarray(many(tokens)),
                                np.asarray(one(tokens)))
  index = sharded / "model.safetensors.index.json"
  weight_map = json.loads(index.read_text())["weight_map"]
  shard = sorted(set(weight_map.values()))[0]
  (sharded / shard).unlink()
  with pytest.raises(PretrainedError, match=rf"index\.json: names shard "
                     rf"{shard}, which is not in"):
    mha_jax.load_pretrained(sharded)


def _legacy(fields):
  """config.json as transformers 4 wrote it: rope_theta and rope_scaling
  (GPT-NeoX: rotary_emb_base, rotary_pct) instead of rope_parameters,
  and no layer_types."""
  rope = dict(fields.pop("rope_parameters"))
  fields.pop("layer_types", None)
  if fields["model_type"] == "gpt_neox":
    fields.update(rotary_emb_base=rope["rope_theta"],
                  rotary_pct=rope["partial_rotary_factor"])
    return
  fields["rope_theta"] = rope.pop("rope_theta")
  if rope["rope_type"] != "default":
    fields["rope_scaling"] = rope


@pytest.mark.parametrize("family", ("llama", "mistral", "qwen2", "gemma2",
                                    "gpt_neox"))
def test_configs_of_transformers_4_load_to_the_same_model(built, tmp_path,
                                                          family):
  legacy = _copy(built, family, tmp_path, edit_config=_legacy)
  assert "layer_types" not in json.loads((legacy / "config.json").read_text())
  want = mha_jax.pretrained.load_config(built(family).directory)
  assert mha_jax.pretrained.load_config(legacy) == want
