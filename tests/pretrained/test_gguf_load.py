"""GGUF files load into mha_jax equal to transformers' GGUF loader.

A tiny random model of each architecture (tests/pretrained/
gguf_models.py: llama, qwen2, qwen3, gemma2, gemma3, phi3, and Mistral
as a llama file) is written as GGUF the way llama.cpp writes it (llama's
q/k rows permuted, Gemma's norms as 1 + w, tensors quantized in Q8_0,
Q4_0, Q4_1, Q5_0, Q5_1, BF16, F16 and F32) and read by both loaders.
What transformers' GGUF loader does not read (phi3's partial rotary and
window, Gemma 2's soft caps) is checked against the tiny transformers
model the file was written from. The real files (SmolLM2-135M, Gemma 3
270M) are checked in tests/real_models, a tier of its own.
"""

import copy
import struct

import gguf
import numpy as np
import pytest
import torch
import transformers

import mha_jax
from mha_jax import pretrained
from mha_jax.pretrained import PretrainedError
from mha_jax.pretrained import families
from tests.pretrained import compare
from tests.pretrained import gguf_models
import hf_models


class Tiny:
  """A tiny model of `arch`, its quantized and float32 GGUF files, and
  transformers' model read from the quantized one (float32 and float64
  runs on one batch)."""

  def __init__(self, directory, arch):
    self.directory, self.arch = directory, arch
    self.family = families.BY_MODEL_TYPE[
        gguf_models.CONFIGS[arch]().model_type]
    self.original = gguf_models.build(arch)
    gguf_models.write(self.original, directory / "q.gguf", arch)
    gguf_models.write(self.original, directory / "f32.gguf", arch,
                      quantize=False)
    self.hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(directory), gguf_file="q.gguf", dtype=torch.float32,
        attn_implementation="eager").eval()
    self.batch = hf_models.inputs(arch)
    self.out32 = hf_models.run(self.hf, self.batch)
    self.out64 = hf_models.run(copy.deepcopy(self.hf).double(), self.batch)


@pytest.fixture(scope="module", params=list(gguf_models.CONFIGS))
def tiny_any(request, tmp_path_factory):
  """Each architecture in turn."""
  transformers.utils.logging.disable_progress_bar()
  return Tiny(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """The Llama, for the bad-file tests."""
  transformers.utils.logging.disable_progress_bar()
  return Tiny(tmp_path_factory.mktemp("llama"), "llama")


def test_every_dequantized_tensor_equals_transformers_bit_for_bit(tiny_any):
  tiny = tiny_any
  ours = compare.as_hf_tensors(
      mha_jax.load_pretrained(tiny.directory / "q.gguf"), tiny.family)
  theirs = {n: t.numpy() for n, t in tiny.hf.state_dict().items()}
  if tiny.hf.config.tie_word_embeddings:
    theirs.pop("lm_head.weight")
  compare.assert_tensors_equal_bitwise(ours, theirs)


def test_float32_file_gives_back_the_model_it_was_written_from(tiny_any):
  # Independent of transformers: the permutation undone restores the
  # original q and k rows exactly; Gemma's 1 + w minus 1 is within one
  # rounding of w (the sum was rounded once).
  tiny = tiny_any
  ours = compare.as_hf_tensors(
      mha_jax.load_pretrained(tiny.directory / "f32.gguf"), tiny.family)
  for name, t in tiny.original.state_dict().items():
    if name == "lm_head.weight" and tiny.hf.config.tie_word_embeddings:
      continue
    want = t.numpy()
    if name.endswith("norm.weight") and gguf_models.NORM_SHIFT.get(tiny.arch):
      np.testing.assert_allclose(ours[name], want, rtol=0,
                                 atol=np.finfo(np.float32).eps,
                                 err_msg=name)
    else:
      np.testing.assert_array_equal(ours[name], want, err_msg=name)


def test_forward_within_twice_transformers_own_float32_error(tiny_any):
  tiny = tiny_any
  model = mha_jax.load_pretrained(tiny.directory / "q.gguf")
  assert model.config.norm_eps == pytest.approx(1e-2)
  ours = compare.run(model, tiny.arch, tiny.batch)
  for q in ("main", "stream", "patterns"):
    floor = compare.rel(tiny.out32[q], tiny.out64[q])
    assert 0 < floor < 50 * compare.U32, (q, floor)
    assert compare.rel(ours[q], tiny.out64[q]) <= 2 * floor, q


# Files whose metadata transformers' GGUF loader does not read: phi3's
# rotated width and window, Gemma 2's soft caps (it takes Gemma 2's own
# 50 and 30). The reference is the model the file was written from.
DROPPED = {
    "phi3": lambda: gguf_models.phi3_config(partial=0.5, window=4),
    "gemma2": lambda: gguf_models.gemma2_config(caps=(2.0, 5.0)),
}


@pytest.mark.parametrize("arch", sorted(DROPPED))
def test_what_transformers_gguf_loader_drops(arch, tmp_path):
  """Half of each Phi-3 head rotated and a window of 4 on every layer;
  Gemma 2 soft caps of 2 (scores) and 5 (logits), which bite: against
  the tiny transformers model itself (float32 file, so the weights are
  its own; Gemma's norms go through 1 + w and back in float32 as both
  loaders read them)."""
  original = gguf_models.build(arch, config=DROPPED[arch]())
  gguf_models.write(original, tmp_path / "f32.gguf", arch, quantize=False)
  if gguf_models.NORM_SHIFT.get(arch):
    with torch.no_grad():
      for name, p in original.named_parameters():
        if name.endswith("norm.weight"):
          p.copy_((p + 1.0) - 1.0)
  batch = hf_models.inputs(arch)
  out32 = hf_models.run(original, batch)
  out64 = hf_models.run(copy.deepcopy(original).double(), batch)
  ours = compare.run(mha_jax.load_pretrained(tmp_path / "f32.gguf"), arch,
                     batch)
  for q in ("main", "stream", "patterns"):
    floor = compare.rel(out32[q], out64[q])
    assert 0 < floor < 50 * compare.U32, (q, floor)
    assert compare.rel(ours[q], out64[q]) <= 2 * floor, q


def test_load_config_reads_the_metadata_only(tiny):
  c = pretrained.load_config(tiny.directory / "q.gguf")
  assert (c.num_layers, c.num_heads, c.num_kv_heads, c.d_model,
          c.mlp_width, c.vocab_size) == (2, 4, 2, 32, 64, hf_models.VOCAB)
  assert c.rotary_base == 100.0 and not c.tie_embeddings


# --- bad files fail before a model is returned, naming what is wrong ---


def _rewrite(src, dst, *, drop=(), arch=None, extra=None, retype=None,
             add=None, drop_keys=(), ints=None):
  """A copy of the GGUF file `src` with tensors dropped or added, the
  architecture renamed, keys dropped, extra keys (float32 `extra`,
  uint32 `ints`), or one tensor stored as I32."""
  reader = gguf.GGUFReader(src)
  name = arch or reader.fields["general.architecture"].contents()
  writer = gguf.GGUFWriter(str(dst), name)
  for key, field in reader.fields.items():
    if key.startswith(("GGUF.", "general.architecture")) or (
        key in drop_keys):
      continue
    kind = field.types[0]
    value = field.contents()
    if key.startswith("llama.") and arch is not None:
      key = arch + key[len("llama"):]
    if kind == gguf.GGUFValueType.ARRAY:
      writer.add_array(key, value)
    else:
      writer.add_key_value(key, value, kind)
  for key, value in (extra or {}).items():
    writer.add_key_value(key, value, gguf.GGUFValueType.FLOAT32)
  for key, value in (ints or {}).items():
    writer.add_key_value(key, value, gguf.GGUFValueType.UINT32)
  for t in reader.tensors:
    if t.name in drop:
      continue
    if t.name == retype:
      data = np.zeros(tuple(reversed(t.shape.tolist())), np.int32)
      writer.add_tensor(t.name, data, raw_dtype=gguf.GGMLQuantizationType.I32)
      continue
    writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
  for name, value in (add or {}).items():
    writer.add_tensor(name, value)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return dst


def _fails(path, *words):
  with pytest.raises(PretrainedError) as e:
    mha_jax.load_pretrained(path)
  for w in (str(path.name),) + words:
    assert w in str(e.value), (w, str(e.value))


def test_truncated_file(tiny, tmp_path):
  data = (tiny.directory / "q.gguf").read_bytes()
  for cut in (len(data) - 100, 2000, 30):
    path = tmp_path / f"cut{cut}.gguf"
    path.write_bytes(data[:cut])
    _fails(path, "truncated")


def test_not_a_gguf_file(tmp_path):
  path = tmp_path / "model.gguf"
  path.write_bytes(struct.pack("<Q", 8) + b"{}      ")
  _fails(path, "GGUF", "magic")


def test_unknown_architecture(tiny, tmp_path):
  path = _rewrite(tiny.directory / "q.gguf", tmp_path / "a.gguf", arch="mamba")
  _fails(path, "general.architecture", "'mamba'", "llama")


def _message(path):
  with pytest.raises(PretrainedError) as e:
    mha_jax.load_pretrained(path)
  return str(e.value)


def test_unknown_metadata_key(tiny, tmp_path):
  path = _rewrite(tiny.directory / "q.gguf", tmp_path / "k.gguf",
                  extra={"llama.attention.clamp_kqv": 8.0})
  assert _message(path) == (
      f"{path}: key 'llama.attention.clamp_kqv'=8.0 is not understood by "
      "the llama GGUF loader (it reads ['llama.attention.head_count', "
      "'llama.attention.head_count_kv', 'llama.attention.key_length', "
      "'llama.attention.layer_norm_rms_epsilon', "
      "'llama.attention.value_length', 'llama.block_count', "
      "'llama.context_length', 'llama.embedding_length', "
      "'llama.feed_forward_length', 'llama.rope.dimension_count', "
      "'llama.rope.freq_base', 'llama.vocab_size'])")


def test_rope_scaling_key_is_refused_by_name(tiny, tmp_path):
  path = _rewrite(tiny.directory / "q.gguf", tmp_path / "k.gguf",
                  extra={"llama.rope.scaling.factor": 8.0})
  assert _message(path) == (
      f"{path}: key 'llama.rope.scaling.factor'=8.0: rope scaling in GGUF "
      "metadata is not implemented; expected no rope.scaling keys")


def test_phi3_longrope_is_refused_by_name(tmp_path):
  # Phi-3's 128k files add rope.scaling.attn_factor beside
  # rope_factors_long / _short tensors.
  model = gguf_models.build("phi3")
  gguf_models.write(model, tmp_path / "phi3.gguf", "phi3")
  path = _rewrite(tmp_path / "phi3.gguf", tmp_path / "long.gguf",
                  extra={"phi3.rope.scaling.attn_factor": 1.19})
  assert _message(path) == (
      f"{path}: key 'phi3.rope.scaling.attn_factor'="
      f"{np.float32(1.19).item()!r}: rope scaling in GGUF metadata is not "
      "implemented; expected no rope.scaling keys")


def test_refused_architecture_says_why(tiny, tmp_path):
  path = _rewrite(tiny.directory / "q.gguf", tmp_path / "m3.gguf",
                  arch="mistral3")
  assert _message(path) == (
      f"{path}: key 'general.architecture': 'mistral3' is refused: the "
      "newer Mistral converter's text model, which scales attention by "
      "position (attention.temperature_scale) and rope by YaRN; neither is "
      "implemented; mha_jax loads ['gemma2', 'gemma3', 'llama', 'phi3', "
      "'qwen2', 'qwen3']")


def test_partial_rotary_outside_phi3_is_refused_by_name(tiny, tmp_path):
  src = tiny.directory / "q.gguf"
  reader = gguf.GGUFReader(src)
  assert reader.fields["llama.rope.dimension_count"].contents() == 8
  path = _rewrite(src, tmp_path / "r.gguf", drop_keys=(
      "llama.rope.dimension_count",), ints={"llama.rope.dimension_count": 4})
  assert _message(path) == (
      f"{path}: key 'llama.rope.dimension_count': mha_jax expects the head "
      "width 8 (no partial rotary in llama files), got 4")


def test_phi3_window_of_zero_is_none_and_others_slide_every_layer(tmp_path):
  # llama.cpp's phi3 converter writes 0 for "no window"; Hugging Face's
  # window W lets query i see keys i - W < j <= i: (W - 1, 0).
  for window, want in ((None, (None, None)), (4, ((3, 0), (3, 0)))):
    model = gguf_models.build("phi3", config=gguf_models.phi3_config(
        partial=0.5, window=window))
    path = tmp_path / f"w{window}.gguf"
    gguf_models.write(model, path, "phi3")
    c = pretrained.load_config(path)
    assert tuple(c.window_of(l) for l in range(2)) == want
    assert (c.rotary_dim, c.head_width) == (4, 8)


def test_missing_tensor(tiny, tmp_path):
  path = _rewrite(tiny.directory / "q.gguf", tmp_path / "m.gguf",
                  drop=("blk.1.ffn_up.weight",))
  _fails(path, "missing tensors", "blk.1.ffn_up.weight")


def test_unexpected_tensor(tiny, tmp_path):
  # A tensor of a family the file does not claim: Gemma's QK-norm.
  path = _rewrite(tiny.directory / "q.gguf", tmp_path / "u.gguf",
                  add={"blk.0.attn_q_norm.weight": np.ones(8, np.float32)})
  _fails(path, "blk.0.attn_q_norm.weight", "unexpected tensor")


def test_integer_tensor_type(tiny, tmp_path):
  path = _rewrite(tiny.directory / "q.gguf", tmp_path / "i.gguf",
                  retype="blk.0.attn_norm.weight")
  _fails(path, "blk.0.attn_norm.weight", "I32", "gguf.quants")


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1", "Q5_0", "F16", "F32"])
def test_dequantizing_by_blocks_of_rows_equals_the_whole_call(qtype,
                                                              monkeypatch):
  from mha_jax.pretrained import gguf_files  # pylint: disable=import-outside-toplevel
  q = gguf.GGMLQuantizationType[qtype]
  w = np.random.default_rng(0).standard_normal((1000, 64)).astype(np.float32)
  data = (w.astype(np.float16) if qtype == "F16" else w if qtype == "F32"
          else gguf.quants.quantize(w, q))
  monkeypatch.setattr(gguf_files, "_CHUNK_BYTES", 1000)  # 3 to 15 rows
  got = gguf_files.dequantize(data, q)
  np.testing.assert_array_equal(got, gguf.quants.dequantize(data, q))
  assert got.dtype == np.float32 and got.flags.writeable
