"""SAELens's folder format: a round trip here is bit for bit; what cannot
be mapped is refused by name; and, where SAELens is installed, an SAE
written here encodes and decodes in SAELens as it does here, and one
SAELens saved loads here and encodes the same."""

import importlib
import json
import os
import tempfile
import warnings

import hypothesis
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
import numpy as np
import pytest
import safetensors.numpy

from mha_jax.sae import buffer
from mha_jax.sae import sae
from mha_jax.sae import saelens

H, DV, F = 2, 4, 24  # a z site of 2 heads x 4: D = 8
D = H * DV
Z_SITE = "blocks.1.attn.z"


def _params(seed, d=D, f=F, kind="relu"):
  """Random params with non-zero biases, so that a dropped or misplaced
  bias shows (a trained SAE's b_dec is the data's mean, not zero); the
  thresholded kinds' threshold too (BatchTopK's one value repeated,
  JumpReLU's one per feature), set where it decides which features fire."""
  rng = np.random.default_rng(seed)
  normal = lambda *s: rng.normal(size=s).astype(np.float32)
  params = {"w_enc": normal(d, f), "b_enc": normal(f) * 0.5,
            "w_dec": normal(f, d), "b_dec": normal(d)}
  if kind == "batchtopk":
    params["threshold"] = np.full(f, 1.5, np.float32)
  elif kind == "jumprelu":
    params["threshold"] = rng.uniform(0.5, 2.5, f).astype(np.float32)
  return params


def _x(seed, n=64):
  """`[n, D]` activations, offset from zero as real ones are."""
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(n, D)) + 0.5).astype(np.float32)


# --- Here alone: the mapping, the round trip, the refusals. ---


SITES = [("blocks.1.attn.z", "blocks.1.attn.hook_z"),
         ("blocks.0.resid_pre", "blocks.0.hook_resid_pre"),
         ("blocks.12.resid_mid", "blocks.12.hook_resid_mid"),
         ("blocks.3.resid_post", "blocks.3.hook_resid_post"),
         ("blocks.2.attn_out", "blocks.2.hook_attn_out"),
         ("blocks.5.mlp_out", "blocks.5.hook_mlp_out")]


@pytest.mark.parametrize("site,name", SITES)
def test_site_names_map_both_ways(site, name):
  assert saelens.hook_name(site) == name
  assert saelens.site_of(name) == site


def _floats32(shape):
  # Every float32 bit pattern: NaNs, infinities, -0.0 and subnormals too.
  return hnp.arrays(np.float32, shape, elements=st.floats(width=32))


@st.composite
def _saes(draw):
  d, f = draw(st.integers(1, 6)), draw(st.integers(1, 9))
  kind = draw(st.sampled_from(sae.KINDS))
  k = draw(st.integers(1, f)) if kind in ("topk", "batchtopk") else None
  params = {"w_enc": draw(_floats32((d, f))), "b_enc": draw(_floats32(f)),
            "w_dec": draw(_floats32((f, d))), "b_dec": draw(_floats32(d))}
  if kind in sae.THRESHOLDED:
    params["threshold"] = draw(_floats32(f))
  site = draw(st.sampled_from([s for s, _ in SITES]))
  return params, kind, k, site


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(_saes())
def test_round_trip_is_bit_identical(drawn):
  params, kind, k, site = drawn
  with tempfile.TemporaryDirectory() as d:
    saelens.save_saelens(d, params, kind=kind, k=k, site=site,
                         metadata={"model_name": "toy"})
    back, meta = saelens.load_saelens(d)
  assert set(back) == set(params)
  for name, a in params.items():
    b = np.asarray(back[name])
    assert b.dtype == np.float32 and b.shape == a.shape, name
    assert b.tobytes() == a.tobytes(), name
  # BatchTopK comes back in its inference form, which has no k.
  want = ("jumprelu", None) if kind == "batchtopk" else (kind, k)
  assert (meta["kind"], meta["k"], meta["site"]) == (*want, site)
  assert (meta["d_in"], meta["d_sae"]) == params["w_enc"].shape
  assert meta["metadata"]["model_name"] == "toy"


def test_the_files_hold_saelens_names_and_layout(tmp_path):
  """The cfg.json and tensors SAELens 6 reads (its StandardSAE/TopKSAE
  configs and state dict), spelled out."""
  params = _params(0)
  saelens.save_saelens(tmp_path, params, kind="topk", k=3, site=Z_SITE,
                       metadata={"model_name": "toy", "context_size": 16})
  cfg = json.loads((tmp_path / "cfg.json").read_text())
  assert cfg == {
      "architecture": "topk", "d_in": 8, "d_sae": 24, "dtype": "float32",
      "device": "cpu", "apply_b_dec_to_input": True,
      "normalize_activations": "none", "reshape_activations": "hook_z",
      "k": 3, "rescale_acts_by_decoder_norm": False,
      "metadata": {"model_name": "toy", "context_size": 16,
                   "hook_name": "blocks.1.attn.hook_z",
                   "hook_head_index": None, "sae_lens_version": "6.0.0",
                   "sae_lens_training_version": None}}
  tensors = safetensors.numpy.load_file(tmp_path / "sae_weights.safetensors")
  # The same layout as ours (x @ W_enc in both): no transposes.
  for ours, theirs in (("w_enc", "W_enc"), ("b_enc", "b_enc"),
                       ("w_dec", "W_dec"), ("b_dec", "b_dec")):
    np.testing.assert_array_equal(tensors.pop(theirs), params[ours])
  assert not tensors
  saelens.save_saelens(tmp_path, params, kind="relu", site="blocks.0.mlp_out")
  cfg = json.loads((tmp_path / "cfg.json").read_text())
  assert (cfg["architecture"], cfg["reshape_activations"]) == ("standard",
                                                               "none")
  assert "k" not in cfg


def test_scale_is_folded_into_the_weights(tmp_path):
  """An SAE trained on `scale * x` gives, folded, the same features on x,
  and its reconstruction in x's units."""
  params, x, s = _params(1), _x(1), 3.7
  saelens.save_saelens(tmp_path, params, kind="relu", site=Z_SITE, scale=s)
  folded, _ = saelens.load_saelens(tmp_path)
  np.testing.assert_allclose(sae.encode(folded, x, kind="relu"),
                             sae.encode(params, s * x, kind="relu"),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
      sae.reconstruct(folded, x, kind="relu"),
      sae.reconstruct(params, s * x, kind="relu") / s, rtol=1e-5, atol=1e-5)


SAVE_REFUSALS = [
    (dict(kind="gated"),
     "sae kind: expected one of ('relu', 'topk', 'batchtopk', 'jumprelu'), "
     "got 'gated'"),
    (dict(kind="jumprelu"),
     "save_saelens: `params`: expected the keys ['b_dec', 'b_enc', "
     "'threshold', 'w_dec', 'w_enc'], got ['b_dec', 'b_enc', 'w_dec', "
     "'w_enc']"),
    (dict(kind="batchtopk", k=0),
     "sae kind 'batchtopk': `k` must be a positive int, got 0"),
    (dict(kind="topk"),
     "sae kind 'topk': `k` must be a positive int, got None"),
    (dict(site="blocks.1.attn.q"),
     "saelens: `site` must be blocks.{l}.attn.z or blocks.{l}.<resid_pre|"
     "resid_mid|resid_post|attn_out|mlp_out> (SAELens flattens heads only "
     "for hook_z), got 'blocks.1.attn.q'"),
    (dict(scale=0.0),
     "save_saelens: `scale` must be a positive finite number, got 0.0"),
    (dict(metadata={"hook_name": "x"}),
     "save_saelens: `metadata` may not set 'hook_name' (written from `site` "
     "and the format), got 'x'"),
    (dict(metadata={"seen": {1, 2}}),
     "save_saelens: `metadata` must hold JSON values, got {'seen': {1, 2}} "
     "(Object of type set is not JSON serializable)"),
    (dict(params={"w_enc": np.zeros((8, 24), np.float32)}),
     "save_saelens: `params`: expected the keys ['b_dec', 'b_enc', 'w_dec', "
     "'w_enc'], got ['w_enc']"),
    (dict(params={**_params(0), "w_dec": np.zeros((8, 24), np.float32)}),
     "save_saelens: `params`: `w_dec` (W_dec) must be [F, D] = [24, 8], got "
     "[8, 24]"),
    (dict(params={**_params(0), "b_dec": np.zeros(8, np.float16)}),
     "save_saelens: `params`: `b_dec` (b_dec) must be float32, got float16"),
]


@pytest.mark.parametrize("change,message", SAVE_REFUSALS,
                         ids=[str(i) for i in range(len(SAVE_REFUSALS))])
def test_save_refuses_what_saelens_cannot_hold(tmp_path, change, message):
  args = {"params": _params(0), "kind": "relu", "site": Z_SITE, **change}
  with pytest.raises(ValueError) as e:
    saelens.save_saelens(tmp_path, args.pop("params"), **args)
  assert str(e.value) == message
  assert not list(tmp_path.iterdir())  # refused before writing anything


def _edited(tmp_path, cfg_change=None, meta_change=None, tensors=None):
  """A folder written here, then its cfg.json or tensors edited."""
  saelens.save_saelens(tmp_path, _params(0), kind="topk", k=3, site=Z_SITE)
  cfg = json.loads((tmp_path / "cfg.json").read_text())
  cfg.update(cfg_change or {})
  cfg["metadata"].update(meta_change or {})
  (tmp_path / "cfg.json").write_text(json.dumps(cfg))
  if tensors is not None:
    safetensors.numpy.save_file(tensors, tmp_path / "sae_weights.safetensors")
  return tmp_path


LOAD_REFUSALS = [
    (dict(cfg_change={"architecture": "gated"}),
     "<CFG> `architecture`: expected 'standard' (our 'relu'), 'topk' or "
     "'jumprelu', got 'gated'"),
    (dict(cfg_change={"architecture": "jumprelu"}),
     "<WEIGHTS>: expected the tensors ['W_dec', 'W_enc', 'b_dec', 'b_enc', "
     "'threshold'], got ['W_dec', 'W_enc', 'b_dec', 'b_enc']"),
    (dict(cfg_change={"apply_b_dec_to_input": False}),
     "<CFG> `apply_b_dec_to_input`: expected true (our encoder subtracts "
     "b_dec from its input), got false"),
    (dict(cfg_change={"normalize_activations": "expected_average_only_in"}),
     "<CFG> `normalize_activations`: expected \"none\" (fold a scaling "
     "factor into the weights first; per-input normalisation has no "
     "counterpart here), got \"expected_average_only_in\""),
    (dict(cfg_change={"rescale_acts_by_decoder_norm": True}),
     "<CFG> `rescale_acts_by_decoder_norm`: expected false (our TopK ranks "
     "the pre-activations as they are), got true"),
    (dict(cfg_change={"dtype": "bfloat16"}),
     "<CFG> `dtype`: expected \"float32\" (the project's SAEs are float32), "
     "got \"bfloat16\""),
    (dict(cfg_change={"k": 0}),
     "sae kind 'topk': `k` must be a positive int, got 0"),
    (dict(meta_change={"hook_head_index": 1}),
     "<CFG> `hook_head_index`: expected null (our sites hold every head), "
     "got 1"),
    (dict(meta_change={"sae_lens_version": "5.9.1"}),
     "<CFG>: expected a config of SAELens 6 or later "
     "(metadata.sae_lens_version), got 5.9.1; load it with SAELens and "
     "save_model it to rewrite it"),
    (dict(meta_change={"hook_name": "blocks.1.attn.hook_q"}),
     "saelens: `hook_name` must be blocks.{l}.attn.hook_z or "
     "blocks.{l}.hook_<resid_pre|resid_mid|resid_post|attn_out|mlp_out>, "
     "got 'blocks.1.attn.hook_q'"),
    (dict(meta_change={"hook_name": "blocks.1.hook_resid_pre"}),
     "<CFG> `reshape_activations`: expected one of ('none',) for hook "
     "blocks.1.hook_resid_pre, got 'hook_z'"),
    (dict(tensors={**{n: np.zeros(s, np.float32) for n, s in (
        ("W_enc", (8, 24)), ("b_enc", (24,)), ("W_dec", (24, 8)),
        ("b_dec", (8,)))}, "threshold": np.zeros(24, np.float32)}),
     "<WEIGHTS>: expected the tensors ['W_dec', 'W_enc', "
     "'b_dec', 'b_enc'], got ['W_dec', 'W_enc', 'b_dec', 'b_enc', "
     "'threshold']"),
    (dict(tensors={"W_enc": np.zeros((24, 8), np.float32),
                   "b_enc": np.zeros(24, np.float32),
                   "W_dec": np.zeros((24, 8), np.float32),
                   "b_dec": np.zeros(8, np.float32)}),
     "<WEIGHTS>: `w_enc` (W_enc) must be [D, F] = [8, 24], "
     "got [24, 8]"),
]


@pytest.mark.parametrize("edit,message", LOAD_REFUSALS,
                         ids=[str(i) for i in range(len(LOAD_REFUSALS))])
def test_load_refuses_what_has_no_counterpart(tmp_path, edit, message):
  path = _edited(tmp_path, **edit)
  with pytest.raises(ValueError) as e:
    saelens.load_saelens(path)
  message = message.replace(
      "<CFG>", f"load_saelens: {path / 'cfg.json'}").replace(
          "<WEIGHTS>", f"load_saelens: {path / 'sae_weights.safetensors'}")
  assert str(e.value) == message


def test_load_names_a_missing_file(tmp_path):
  (tmp_path / "cfg.json").write_text("{}")
  with pytest.raises(FileNotFoundError) as e:
    saelens.load_saelens(tmp_path)
  assert str(e.value) == (f"load_saelens: expected sae_weights.safetensors "
                          f"in {tmp_path}, found ['cfg.json']")


# --- With SAELens: the same features on the same activations. ---


def _sae_lens():
  """SAELens's SAE class and torch. Where SAELens is missing the test
  skips, or fails under CI (CI set), where the `test` extra installs it:
  an agreement test that skipped there would pass without running."""
  reason = "SAELens is not installed (pip install -e '.[test]')"
  with warnings.catch_warnings():
    # transformer_lens 3.x warns on its own deprecated `utils`, which
    # SAELens imports; it is theirs, not ours.
    warnings.simplefilter("ignore", DeprecationWarning)
    if not os.environ.get("CI"):
      mod = pytest.importorskip("sae_lens", reason=reason)
    else:
      try:
        mod = importlib.import_module("sae_lens")
      except ImportError as e:
        pytest.fail(f"{e}: {reason} (CI is set, so this fails instead of "
                    "skipping)", pytrace=False)
  import torch  # pylint: disable=g-import-not-at-top
  return mod.SAE, torch


KINDS = [("relu", None), ("topk", 5), ("batchtopk", 5), ("jumprelu", None)]


@pytest.mark.parametrize("kind,k", KINDS)
def test_written_here_encodes_the_same_in_saelens(tmp_path, kind, k):
  SAE, torch = _sae_lens()
  params, x = _params(2, kind=kind), _x(2)
  saelens.save_saelens(tmp_path, params, kind=kind, k=k, site=Z_SITE)
  theirs = SAE.load_from_disk(tmp_path)
  assert theirs.cfg.architecture() == {
      "relu": "standard", "topk": "topk", "batchtopk": "jumprelu",
      "jumprelu": "jumprelu"}[kind]
  # TransformerLens's hook_z as it comes, [B, T, H, Dv]: SAELens flattens
  # the heads itself, and must do it in buffer.flatten_site's order.
  z = x.reshape(4, -1, H, DV)  # [B, T, H, Dv]
  with torch.no_grad():
    f_theirs = theirs.encode(torch.tensor(z)).numpy()  # [B, T, F]
    recon_theirs = theirs(torch.tensor(z)).numpy()  # [B, T, H, Dv]
  flat = buffer.flatten_site(z)  # [B * T, H * Dv]
  f_ours = np.asarray(sae.encode(params, flat, kind=kind, k=k))
  f_theirs = f_theirs.reshape(f_ours.shape)
  assert ((f_theirs > 0) == (f_ours > 0)).all()
  if kind == "topk":
    assert ((f_ours > 0).sum(-1) <= k).all()
  if kind in sae.THRESHOLDED:  # the thresholds drew the line somewhere
    pre = np.asarray(sae.pre_acts(params, flat))
    assert ((pre > 0) & (f_ours == 0)).any() and (f_ours > 0).any()
  np.testing.assert_allclose(f_theirs, f_ours, rtol=1e-5, atol=1e-5)
  assert recon_theirs.shape == z.shape
  np.testing.assert_allclose(buffer.flatten_site(recon_theirs),
                             sae.reconstruct(params, flat, kind=kind, k=k),
                             rtol=1e-5, atol=1e-5)


# SAELens saves its BatchTopK SAEs as JumpReLU, so "jumprelu" is theirs.
@pytest.mark.parametrize("kind,k", [c for c in KINDS if c[0] != "batchtopk"])
def test_saved_by_saelens_loads_here_and_encodes_the_same(tmp_path, kind, k):
  SAE, torch = _sae_lens()
  # pylint: disable=g-import-not-at-top
  import sae_lens
  from sae_lens.saes import sae as sae_lens_sae
  cfg_cls = {"relu": sae_lens.StandardSAEConfig,
             "topk": sae_lens.TopKSAEConfig,
             "jumprelu": sae_lens.JumpReLUSAEConfig}[kind]
  cfg = cfg_cls(d_in=D, d_sae=F, reshape_activations="hook_z",
                metadata=sae_lens_sae.SAEMetadata(
                    hook_name="blocks.1.attn.hook_z", model_name="toy"),
                **({"k": k} if k else {}))
  torch.manual_seed(0)
  theirs = {"relu": sae_lens.StandardSAE, "topk": sae_lens.TopKSAE,
            "jumprelu": sae_lens.JumpReLUSAE}[kind](cfg)
  with torch.no_grad():  # their init leaves both biases at zero
    theirs.b_enc.normal_(0, 0.5)
    theirs.b_dec.normal_()
    if kind == "jumprelu":  # ... and the thresholds
      theirs.threshold.uniform_(0.5, 2.5)
  theirs.save_model(tmp_path)
  params, meta = saelens.load_saelens(tmp_path)
  assert (meta["kind"], meta["k"], meta["site"]) == (kind, k, Z_SITE)
  assert meta["metadata"]["model_name"] == "toy"
  pairs = [("w_enc", theirs.W_enc), ("b_enc", theirs.b_enc),
           ("w_dec", theirs.W_dec), ("b_dec", theirs.b_dec)]
  if kind == "jumprelu":
    pairs.append(("threshold", theirs.threshold))
  assert set(params) == {ours for ours, _ in pairs}
  for ours, t in pairs:
    assert np.asarray(params[ours]).tobytes() == t.detach().numpy().tobytes()
  x = _x(3)
  with torch.no_grad():
    f_theirs = theirs.encode(torch.tensor(x.reshape(-1, H, DV))).numpy()
  f_ours = np.asarray(sae.encode(params, x, kind=kind, k=k))
  assert ((f_theirs > 0) == (f_ours > 0)).all()
  np.testing.assert_allclose(f_ours, f_theirs, rtol=1e-5, atol=1e-5)
