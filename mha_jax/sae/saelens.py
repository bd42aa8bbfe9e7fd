"""SAELens's on-disk format: save an SAE for SAELens (and Neuronpedia, which
reads the same folders), and load one SAELens wrote.

Shape letters: D the SAE's input width (H * Dv for a `z` site), F features.

SAELens 6 keeps an SAE in a folder of two files:
  cfg.json                 {"architecture", "d_in", "d_sae", "dtype",
                            "apply_b_dec_to_input", "normalize_activations",
                            "reshape_activations", ("k",
                            "rescale_acts_by_decoder_norm" for topk),
                            "metadata": {"hook_name", "sae_lens_version",
                            ...}}
  sae_weights.safetensors  W_enc [D, F], b_enc [F], W_dec [F, D], b_dec [D]

The mapping (docs/sae.md has the table):
  - Tensors: ours are the same matrices in the same layout (`x @ w_enc`
    in both), so each is written as it is; no transpose.
  - `kind` "relu" is their "standard": ReLU(pre). "topk" is their "topk"
    with the same `k`. They take the k largest pre-activations and ReLU
    them; we take the k largest of ReLU(pre). The two differ only in which
    entries that end at zero were "kept", so the features are the same.
  - Our encoder centres the input by `b_dec` (sae.py): their
    `apply_b_dec_to_input: true`. Their `false` would be a different
    encoder; it is refused, not folded into `b_enc` (which would not be
    exact in floats).
  - The site is their `metadata.hook_name`, TransformerLens's spelling:
    `blocks.{l}.attn.z` is `blocks.{l}.attn.hook_z`, a block site
    `blocks.{l}.resid_pre` is `blocks.{l}.hook_resid_pre`. A `z` SAE
    reads the heads concatenated, head h in columns h * Dv .. (h + 1) * Dv
    (buffer.flatten_site); SAELens's `reshape_activations: "hook_z"` flattens
    `[..., H, Dv]` in the same order, so its SAE takes TransformerLens's
    `hook_z` as it comes.
  - The experiments train on activations scaled by one number (E|x|^2 =
    D). `scale` folds it into the weights, as SAELens's own
    `fold_activation_norm_scaling_factor` does, so that SAELens reads the
    raw activations: the same features, the reconstruction in raw units.

  - A "batchtopk" SAE is written as their "jumprelu" with its threshold
    on every feature (SAELens's own BatchTopK SAEs are saved so), and a
    "jumprelu" folder (Gemma Scope's, say) loads as our "jumprelu", an
    SAE that encodes but is not trained here.

Refused, by name: other architectures (gated, matryoshka, ...), sites whose
heads SAELens does not flatten (q, k, v, scores, pattern, result), one-head
SAEs (`hook_head_index`), per-input normalisation, decoder-norm rescaling,
dtypes other than float32, and configs from before SAELens 6.
"""

from __future__ import annotations

import json
import math
import pathlib
import re

import jax.numpy as jnp
import numpy as np
import safetensors.numpy

from mha_jax.sae import sae as sae_lib

CFG = "cfg.json"
WEIGHTS = "sae_weights.safetensors"
# The SAELens release whose cfg.json layout is written. SAELens reads a
# config without a version as the older layout (hook_name at the top,
# activation_fn strings), so the version must be there.
FORMAT_VERSION = "6.0.0"
# Our kind -> theirs. A BatchTopK SAE is written in its inference form,
# JumpReLU with its one threshold on every feature, as SAELens writes its
# own BatchTopK SAEs; it loads back as "jumprelu" (same params, same
# encoding; the training-time k is not part of that form).
ARCHITECTURES = {"relu": "standard", "topk": "topk", "batchtopk": "jumprelu",
                 "jumprelu": "jumprelu"}
KINDS = {"standard": "relu", "topk": "topk", "jumprelu": "jumprelu"}
# Our param name -> theirs, with its shape in (D, F).
TENSORS = {"w_enc": ("W_enc", "DF"), "b_enc": ("b_enc", "F"),
           "w_dec": ("W_dec", "FD"), "b_dec": ("b_dec", "D")}
THRESHOLD = {"threshold": ("threshold", "F")}  # ... and the jump's


def _tensors(kind: str) -> dict:
  """The tensors of an SAE of `kind`, ours -> (theirs, dims)."""
  return {**TENSORS, **THRESHOLD} if kind in sae_lib.THRESHOLDED else TENSORS
# Sites read one row per token whose TransformerLens hook SAELens can take
# as it comes: the residual stream and the block outputs, and z (whose
# heads SAELens flattens). q/k/v/result are per head too, but SAELens
# flattens only hook_z.
BLOCK_SITES = ("resid_pre", "resid_mid", "resid_post", "attn_out",
               "mlp_out")
_OURS = re.compile(r"blocks\.(\d+)\.(attn\.z|" + "|".join(BLOCK_SITES) + ")")
_THEIRS = re.compile(r"blocks\.(\d+)\.(attn\.hook_z|hook_(?:"
                     + "|".join(BLOCK_SITES) + "))")
_EXPECTED_SITE = ("blocks.{l}.attn.z or blocks.{l}.<" + "|".join(BLOCK_SITES)
                  + ">")


def hook_name(site: str) -> str:
  """TransformerLens's name of one of our sites (`blocks.1.attn.z` ->
  `blocks.1.attn.hook_z`, `blocks.0.resid_pre` ->
  `blocks.0.hook_resid_pre`)."""
  m = _OURS.fullmatch(site) if isinstance(site, str) else None
  if m is None:
    raise ValueError(f"saelens: `site` must be {_EXPECTED_SITE} (SAELens "
                     f"flattens heads only for hook_z), got {site!r}")
  layer, leaf = m.groups()
  leaf = "attn.hook_z" if leaf == "attn.z" else f"hook_{leaf}"
  return f"blocks.{layer}.{leaf}"


def site_of(name: str) -> str:
  """Our site of a TransformerLens hook name; the inverse of `hook_name`."""
  m = _THEIRS.fullmatch(name) if isinstance(name, str) else None
  if m is None:
    raise ValueError(
        f"saelens: `hook_name` must be blocks.{{l}}.attn.hook_z or "
        f"blocks.{{l}}.hook_<{'|'.join(BLOCK_SITES)}>, got {name!r}")
  layer, leaf = m.groups()
  leaf = "attn.z" if leaf == "attn.hook_z" else leaf[len("hook_"):]
  return f"blocks.{layer}.{leaf}"


def save_saelens(path, params, *, kind: str, site: str,
                 k: int | None = None, scale: float = 1.0,
                 metadata: dict | None = None) -> pathlib.Path:
  """Write the SAE `params` (sae.py's dict) as SAELens's folder `path`.

  `site` is the hook site it reads (`blocks.1.attn.z`); `k` TopK's (and
  BatchTopK's) k. `scale`: the SAE reads `scale * x` (experiments/sae's
  E|x|^2 = D); it is folded in (w_enc * scale, w_dec / scale, b_dec /
  scale: the pre-activations, so the threshold, do not change) so that
  SAELens reads raw activations. At 1 the tensors are written bit for
  bit.
  `metadata`: more of SAELens's metadata fields, JSON values (e.g.
  `model_name`, `context_size`, `prepend_bos`, `dataset_path`,
  `neuronpedia_id`). Returns the folder.
  """
  sae_lib.check_kind(kind, k)
  arrays = _checked_params(params, _tensors(kind))
  if not (isinstance(scale, (int, float)) and math.isfinite(scale)
          and scale > 0):
    raise ValueError(f"save_saelens: `scale` must be a positive finite "
                     f"number, got {scale!r}")
  metadata = dict(metadata or {})
  for key in ("hook_name", "hook_head_index", "sae_lens_version"):
    if key in metadata:
      raise ValueError(f"save_saelens: `metadata` may not set {key!r} "
                       f"(written from `site` and the format), got "
                       f"{metadata[key]!r}")
  name = hook_name(site)
  if scale != 1:
    s = np.float32(scale)
    arrays = {**arrays, "w_enc": arrays["w_enc"] * s,
              "w_dec": arrays["w_dec"] / s, "b_dec": arrays["b_dec"] / s}
  d_in, d_sae = arrays["w_enc"].shape
  cfg = {"architecture": ARCHITECTURES[kind], "d_in": d_in, "d_sae": d_sae,
         "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True,
         "normalize_activations": "none",
         "reshape_activations": "hook_z" if name.endswith("hook_z")
                                else "none",
         "metadata": {**metadata, "hook_name": name, "hook_head_index": None,
                      "sae_lens_version": FORMAT_VERSION,
                      "sae_lens_training_version": None}}
  if kind == "topk":
    cfg.update(k=k, rescale_acts_by_decoder_norm=False)
  if kind == "batchtopk":  # where it came from, for a reader; not loaded
    cfg["metadata"].setdefault("mha_jax_trained_as", f"batchtopk k={k}")
  try:  # before writing anything: a bad `metadata` leaves no half folder
    text = json.dumps(cfg, indent=1)
  except TypeError as e:
    raise ValueError(f"save_saelens: `metadata` must hold JSON values, got "
                     f"{metadata!r} ({e})") from e
  path = pathlib.Path(path)
  path.mkdir(parents=True, exist_ok=True)
  safetensors.numpy.save_file(
      {theirs: np.ascontiguousarray(arrays[ours])
       for ours, (theirs, _) in _tensors(kind).items()}, path / WEIGHTS)
  (path / CFG).write_text(text)
  return path


def load_saelens(path) -> tuple[dict, dict]:
  """`(params, meta)` of SAELens's folder `path`: sae.py's params (float32
  jax arrays, bit for bit the file's) and `meta` {"kind", "k", "site",
  "hook_name", "d_in", "d_sae", "metadata" (SAELens's, as written)}."""
  path = pathlib.Path(path)
  for f in (CFG, WEIGHTS):
    if not (path / f).is_file():
      raise FileNotFoundError(f"load_saelens: expected {f} in {path}, found "
                              f"{sorted(p.name for p in path.glob('*'))}")
  cfg = json.loads((path / CFG).read_text())
  where = f"load_saelens: {path / CFG}"
  meta_in = cfg.get("metadata") or {}
  version = str(meta_in.get("sae_lens_version") or
                cfg.get("sae_lens_version") or "")
  if not re.match(r"([6-9]|\d\d+)\.", version):
    raise ValueError(f"{where}: expected a config of SAELens 6 or later "
                     f"(metadata.sae_lens_version), got "
                     f"{version or 'none'}; load it with SAELens and "
                     f"save_model it to rewrite it")
  arch = cfg.get("architecture")
  if arch not in KINDS:
    raise ValueError(f"{where} `architecture`: expected 'standard' (our "
                     f"'relu'), 'topk' or 'jumprelu', got {arch!r}")
  kind, k = KINDS[arch], cfg.get("k")
  if kind == "topk":
    sae_lib.check_kind(kind, k)
  _expect(where, cfg, "apply_b_dec_to_input", True,
          "our encoder subtracts b_dec from its input")
  _expect(where, cfg, "normalize_activations", "none",
          "fold a scaling factor into the weights first; per-input "
          "normalisation has no counterpart here")
  _expect(where, cfg, "dtype", "float32", "the project's SAEs are float32")
  if kind == "topk":
    _expect(where, cfg, "rescale_acts_by_decoder_norm", False,
            "our TopK ranks the pre-activations as they are")
  _expect(where, meta_in, "hook_head_index", None,
          "our sites hold every head")
  name = meta_in.get("hook_name")
  site = site_of(name)
  reshape = cfg.get("reshape_activations", "none")
  allowed = ("none", "hook_z") if site.endswith("attn.z") else ("none",)
  if reshape not in allowed:
    raise ValueError(f"{where} `reshape_activations`: expected one of "
                     f"{allowed} for hook {name}, got {reshape!r}")
  with safetensors.safe_open(path / WEIGHTS, framework="numpy") as f:
    names = sorted(f.keys())
    want = sorted(t for t, _ in _tensors(kind).values())
    if names != want:
      raise ValueError(f"load_saelens: {path / WEIGHTS}: expected the "
                       f"tensors {want}, got {names}")
    arrays = {ours: f.get_tensor(theirs)
              for ours, (theirs, _) in _tensors(kind).items()}
  params = _checked_params(arrays, _tensors(kind),
                           where=f"load_saelens: {path / WEIGHTS}",
                           d_in=cfg.get("d_in"), d_sae=cfg.get("d_sae"))
  meta = {"kind": kind, "k": k if kind == "topk" else None, "site": site,
          "hook_name": name, "d_in": cfg["d_in"], "d_sae": cfg["d_sae"],
          "metadata": meta_in}
  return {n: jnp.asarray(a) for n, a in params.items()}, meta


def _expect(where: str, cfg: dict, field: str, value, why: str) -> None:
  """Refuse a config field that is not `value` (an absent one is
  SAELens's default, which is `value` for every field checked here)."""
  got = cfg.get(field, value)
  if got != value or type(got) is not type(value):
    raise ValueError(f"{where} `{field}`: expected {json.dumps(value)} "
                     f"({why}), got {json.dumps(got)}")


def _checked_params(params, tensors: dict, *,
                    where: str = "save_saelens: `params`",
                    d_in=None, d_sae=None) -> dict:
  """The arrays of `tensors` (`_tensors(kind)`) as float32 NumPy, checked
  against one (D, F)."""
  if not isinstance(params, dict) or set(params) != set(tensors):
    got = sorted(params) if isinstance(params, dict) else type(params)
    raise ValueError(f"{where}: expected the keys {sorted(tensors)}, got "
                     f"{got}")
  arrays = {n: np.asarray(a) for n, a in params.items()}
  if d_in is None:  # saving: the sizes are the encoder's
    if arrays["w_enc"].ndim != 2:
      raise ValueError(f"{where}: `w_enc` must be [D, F], got "
                       f"{list(arrays['w_enc'].shape)}")
    d_in, d_sae = arrays["w_enc"].shape
  sizes = {"D": d_in, "F": d_sae}
  for ours, (theirs, dims) in tensors.items():
    a = arrays[ours]
    want = [sizes[c] for c in dims]
    if list(a.shape) != want:
      raise ValueError(f"{where}: `{ours}` ({theirs}) must be "
                       f"[{', '.join(dims)}] = {want}, got {list(a.shape)}")
    if a.dtype != np.float32:
      raise ValueError(f"{where}: `{ours}` ({theirs}) must be float32, got "
                       f"{a.dtype}")
  return arrays
