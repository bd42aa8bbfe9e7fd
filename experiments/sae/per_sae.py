"""One SAE on one site: the site's activations, the SAE trained (or
resumed) on them, and its measures. `run.py` and `controls.py` call
these for the claim's layer and for the controls alike, so the controls
go through the same path as what they control.

Shape letters: N tokens, D = H * Dv the SAE's input width, F features.

A site's `data` dict (`site_data`) holds its scaled activations, the
model and layer they came from, the folder prefix of its SAEs, its
repeated-token captures and the heads whose DFA the induction criterion
counts, and caches (compiled losses, ablation baselines) shared by the
SAEs measured on it.

Each SAE's measures are saved in `workdir/measures/` under a key of
everything they depend on: the SAE's settings, its parameters and
training seconds, the site's activations, the experiment's settings but
those that only choose which SAEs run (`_NOT_MEASURES`), the model's
config, the library's and these measures' code, and jax's version. A run
that adds SAEs or seeds measures only those; any other change measures
again. `experiment.cache_measures = False` measures everything.
"""

from __future__ import annotations

import functools
import hashlib
import json
import pathlib
import shutil
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.sae import induction
from mha_jax.measure import report as report_lib
from mha_jax.sae import attribution
from mha_jax.sae import buffer
from mha_jax.sae import metrics
from mha_jax.sae import sae as sae_lib
from mha_jax.sae import train

SITES = ("z", "resid_pre")


def sae_config(config, kind: str, seed: int) -> ml_collections.ConfigDict:
  """One SAE's settings; a TopK or BatchTopK SAE's `l1` is 0, since it has
  no L1 term (so its saved config does not change with the ReLU
  coefficient), and only BatchTopK's holds `threshold_lr` (so the saved
  configs of the other kinds, and their resumed runs, are as before)."""
  c = ml_collections.ConfigDict(config.sae.to_dict())
  c.kind, c.seed = kind, seed
  if kind != "batchtopk" and "threshold_lr" in c:
    del c.threshold_lr
  if kind in sae_lib.TOPK_KINDS:
    c.l1 = 0.0
    if c.topk_steps:
      c.num_steps = c.topk_steps
  return c


def _run_dir(workdir, cfg, prefix: str = "") -> pathlib.Path:
  """`workdir/<prefix><kind>_seed<seed>`, emptied if it holds another
  config's run (a resumed run must be the same run)."""
  d = pathlib.Path(workdir) / f"{prefix}{cfg.kind}_seed{cfg.seed}"
  saved = d / "sae_config.json"
  if saved.exists() and json.loads(saved.read_text()) != cfg.to_dict():
    shutil.rmtree(d)
  d.mkdir(parents=True, exist_ok=True)
  saved.write_text(json.dumps(cfg.to_dict(), indent=1))
  return d


def site_name(layer: int, site: str) -> str:
  """The hook site of `site` ("z" or "resid_pre") at `layer`."""
  if site not in SITES:
    raise ValueError(f"site: expected one of {SITES}, got {site!r}")
  return f"blocks.{layer}.attn.z" if site == "z" else f"blocks.{layer}.{site}"


def collect(config, src, workdir, site: str = "z", *, layer: int,
            tag: str = ""):
  """`(train acts [N, D], eval acts, seconds)` of `layer`'s `site` ("z"
  or "resid_pre") in `src`'s model, kept in `workdir/activations.npz`
  (`activations_<tag>_<site>.npz` for another site or a tagged model)
  with the settings that made them, so that a resumed run with the same
  settings does not collect again (the seconds are then the first
  collection's)."""
  e = config.experiment
  fields = [config.source, config.model.to_dict(), layer, e.drop_first,
            e.train_batches, e.eval_batches, e.text_windows, e.eval_windows,
            e.text_len, e.data_seed]
  key = json.dumps(fields + [site, tag] if site != "z" or tag else fields)
  name = ("activations.npz" if site == "z" and not tag else
          f"activations_{tag + '_' if tag else ''}{site}.npz")
  path = pathlib.Path(workdir) / name
  if path.exists():
    saved = np.load(path)
    if "key" in saved.files and str(saved["key"]) == key:
      return saved["acts"], saved["evals"], float(saved["seconds"])
  acts, evals, seconds = _collect(src, site_name(layer, site), e.drop_first)
  path.parent.mkdir(parents=True, exist_ok=True)
  np.savez(path, acts=acts, evals=evals, seconds=seconds, key=key)
  return acts, evals, seconds


def _collect(src, site, drop_first):
  fwd = buffer.collector(src.model, site)
  keep = lambda t: None if not drop_first else np.arange(t.shape[1]) >= 1
  fwd(src.train_tokens[0])  # compile outside the timing
  start = time.perf_counter()
  acts = buffer.collect(fwd, src.train_tokens, keep=keep(
      src.train_tokens[0]))
  seconds = time.perf_counter() - start
  evals = buffer.collect(fwd, [b["inputs"] for b in src.eval_batches],
                         keep=keep(src.eval_batches[0]["inputs"]))
  return acts, evals, seconds


def repeated_tokens(e) -> np.ndarray:
  """`[N, 2 n (+1)]`: the run's repeated random tokens."""
  return buffer.repeated_tokens(e.repeat_inputs, e.repeat_len,
                                tuple(e.token_range), seed=e.data_seed + 1,
                                bos=None if e.bos < 0 else e.bos)


def capture(model, tokens, layer: int) -> dict:
  """`layer`'s z, pattern and v on `tokens [N, T]`, 8 rows at a time."""
  sites = [f"blocks.{layer}.attn.{s}" for s in ("z", "pattern", "v")]
  caps = [model(jnp.asarray(tokens[a:a + 8]), capture=sites)[1]
          for a in range(0, len(tokens), 8)]
  return {s: jnp.concatenate([c[s] for c in caps]) for s in sites}


def repeated_batches(tokens, e, size: int = 8) -> list:
  """The repeated random tokens `[N, T]` as loss batches: the next-token
  loss on the second copy after its first token (the tokens only
  induction predicts: the first copy is random, and the second copy's
  first token follows the first copy's last by chance)."""
  start = (0 if e.bos < 0 else 1) + e.repeat_len  # the second copy
  targets = np.arange(1, tokens.shape[1])  # the position each target is
  mask = (targets > start).astype(np.float32)[None]
  return [{"inputs": tokens[a:a + size, :-1], "targets": tokens[a:a + size,
                                                                1:],
           "loss_mask": np.broadcast_to(mask, (len(tokens[a:a + size]),
                                               mask.shape[1]))}
          for a in range(0, len(tokens), size)]


def trained(config, kind, seed, acts, workdir, prefix=""):
  """`(params, cfg, seconds)`: one SAE trained (or resumed) on `acts`;
  the seconds its training took, over every call that made it."""
  cfg = sae_config(config, kind, seed)
  run_dir = _run_dir(workdir, cfg, prefix)
  state = train.train(cfg, acts, run_dir)
  if train.train_seconds(run_dir) is None:  # saved before its time was
    shutil.rmtree(run_dir)
    return trained(config, kind, seed, acts, workdir, prefix)
  return state["params"], cfg, train.train_seconds(run_dir)


def untrained(config, kind, seed, acts):
  """`(params, cfg, None)`: the SAE `trained` starts from, never trained:
  random unit decoder rows, the encoder their transpose, b_dec at the
  data's mean. A dictionary that learned nothing, the null control."""
  cfg = sae_config(config, kind, seed)
  params = train.init_state(cfg, acts.shape[1], acts.mean(0))["params"]
  return params, cfg, None


# Fields of `experiment` that choose which SAEs a run has, or what its
# pages show, not what one SAE's measures are.
_NOT_MEASURES = frozenset({
    "seeds", "kinds", "resid_pre_kinds", "resid_pre_seeds", "controls",
    "control_seeds", "control_kinds", "reinit_seeds", "reinit_kinds",
    "top_contexts", "view_features", "cache_measures"})
# This experiment's modules that a measure runs (with all of mha_jax).
_MEASURE_CODE = ("per_sae.py", "induction.py", "sources.py", "controls.py")


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
  here = pathlib.Path(__file__).resolve()
  root = here.parents[2]
  h = hashlib.sha256()
  for f in sorted((root / "mha_jax").rglob("*.py")) + [
      here.with_name(n) for n in _MEASURE_CODE]:
    h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
  return h.hexdigest()


def _digest(arrays) -> str:
  h = hashlib.sha256()
  for a in arrays:
    a = np.ascontiguousarray(np.asarray(a))
    h.update(f"{a.dtype}{a.shape}".encode() + a.tobytes())
  return h.hexdigest()


def measure_key(config, data, params, cfg, train_s, what: str) -> str:
  """The key one SAE's measures `what` are saved under (module
  docstring)."""
  if "digest" not in data:  # the site's activations, hashed once
    data["digest"] = _digest([data["acts"], data["evals"]])
  e = config.experiment.to_dict()
  return json.dumps({
      "what": what, "sae": cfg.to_dict(), "train_s": train_s,
      "params": _digest([params[n] for n in sorted(params)]),
      "data": [data["digest"], data["site"], data["layer"], data["prefix"]],
      "heads": [int(h) for h in data.get("induction_heads", [])],
      "experiment": {n: v for n, v in e.items() if n not in _NOT_MEASURES},
      "source": config.source, "model": config.model.to_dict(),
      "code": _code_digest(), "jax": jax.__version__},
                    sort_keys=True, default=str)


def _cached(config, data, params, cfg, train_s, what: str, fn) -> dict:
  """`fn()`'s measures as results.json holds them, read from
  `workdir/measures/` when saved there under the same key."""
  if not config.experiment.get("cache_measures", True):
    return report_lib.saved_results(fn())
  key = measure_key(config, data, params, cfg, train_s, what)
  untrained = "untrained_" if train_s is None else ""
  path = (pathlib.Path(data["workdir"]) / "measures" /
          f"{data['prefix']}{untrained}{cfg.kind}_seed{cfg.seed}_{what}.json")
  if path.exists():
    saved = json.loads(path.read_text())
    if saved["key"] == key:
      return saved["value"]
  value = report_lib.saved_results(fn())
  path.parent.mkdir(parents=True, exist_ok=True)
  # Written whole and then renamed, so a run stopped mid-write leaves the
  # old file or none, never half of one.
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps({"key": key, "value": value}))
  tmp.replace(path)
  return value


def standard(config, src, data, params, cfg, train_s) -> dict:
  """The measures of any site: sparsity, explained variance, and the loss
  and KL with the reconstruction spliced in, on held-out inputs and on
  the repeated random tokens' second copy (saved, `_cached`)."""
  return _cached(config, data, params, cfg, train_s, "standard",
                 lambda: _standard(config, src, data, params, cfg, train_s))


def _standard(config, src, data, params, cfg, train_s) -> dict:
  kind = cfg.kind
  k = cfg.k if kind == "topk" else None
  st = metrics.feature_stats(params, data["evals"], kind=kind, k=k)
  # One compiled loss and KL per kind, and the ablations (which no SAE
  # changes) once per site and evaluation set, kept in `data` for the
  # next SAE.
  if kind not in data["loss_fns"]:
    kw = dict(kind=kind, k=k, keep_first=config.experiment.drop_first)
    data["loss_fns"][kind] = (
        metrics.site_loss_fn(src.model, data["site"], **kw),
        metrics.site_ce_kl_fn(src.model, data["site"], **kw))
  loss_fn, ce_kl_fn = data["loss_fns"][kind]
  args = (params, data["scale"], jnp.asarray(data["mean_site"]))

  def ce(name, batches):
    if name not in data["ablations"]:
      data["ablations"][name] = metrics.baselines(loss_fn, batches, *args,
                                                  ce_kl_fn=ce_kl_fn)
    return metrics.losses(loss_fn, batches, *args, ce_kl_fn=ce_kl_fn,
                          ablations=data["ablations"][name])
  return {"kind": kind, "seed": cfg.seed, "train_s": train_s,
          "steps_per_s": cfg.num_steps / train_s if train_s else None,
          "l0": st["l0"], "dead": st["dead"], "dense": st["dense"],
          "explained_variance": st["explained_variance"],
          "loss": ce("loss", src.eval_batches),
          "loss_repeated": ce("loss_repeated", data["repeat_batches"])}


def measure_sae(config, src, data, params, cfg, train_s) -> dict:
  """`standard` and the induction test of one SAE on `data`'s z: the
  features passing the criterion, the threshold sweep, and how much of
  the induction heads' output they reconstruct (saved, `_cached`)."""
  return _cached(config, data, params, cfg, train_s, "z",
                 lambda: _measure_sae(config, src, data, params, cfg,
                                      train_s))


def _measure_sae(config, src, data, params, cfg, train_s) -> dict:
  e = config.experiment
  kind = cfg.kind
  k = cfg.k if kind == "topk" else None
  out = _standard(config, src, data, params, cfg, train_s)
  heads = data["induction_heads"]
  det = induction.detect(params, data["captured"], data["layer"],
                         e.repeat_len, heads, e, kind=kind, k=k,
                         scale=data["scale"])
  z = data["captured"][f"blocks.{data['layer']}.attn.z"]
  rec = {name: induction.reconstruction(
      params, z, e.repeat_len, heads, det[name], kind=kind, k=k,
      scale=data["scale"], draws=e.random_draws, seed=cfg.seed)
         for name in ("features", "copying")}
  shares = np.asarray(attribution.head_shares(params["w_dec"],
                                              z.shape[2]))
  found = det["features"]
  # The matched-direction null of every copying feature (the induction
  # features are among them), on the first `null_inputs` inputs.
  null = induction.matched_null(
      params, z[:e.null_inputs], e.repeat_len, det["copying"],
      draws=e.null_draws, seed=cfg.seed, scale=data["scale"],
      alpha=e.null_alpha)
  p_of = dict(zip(det["copying"], null["p"]))
  out["induction"] = {
      "count": len(found), "features": found,
      "top_head": [int(np.argmax(shares[f])) for f in found],
      "decoder_share_induction_heads": [
          float(shares[f, heads].sum()) for f in found],
      "head_share": [float(det["head_share"][f]) for f in found],
      "source_share": [float(det["source_share"][f]) for f in found],
      "second_rate": [float(det["second_rate"][f]) for f in found],
      "ratio": [float(det["mean_second"][f] / max(det["mean_first"][f],
                                                  1e-9)) for f in found],
      "copying_count": len(det["copying"]), "copying": det["copying"],
      "sweep": induction.sweep(det, induction.thresholds(e),
                               sweep_grid(e)),
      "reconstruction": rec["features"],
      "copying_reconstruction": rec["copying"],
      "null": {**null, "features": det["copying"],
               "selective_induction": int(sum(p_of[f] <= e.null_alpha
                                              for f in found))}}
  return out


def sweep_grid(e) -> dict:
  """The threshold values the sweep tries, from the config."""
  return {"second_rate": tuple(e.sweep_second_rate),
          "second_ratio": tuple(e.sweep_second_ratio),
          "dfa_share": tuple(e.sweep_dfa_share)}


def site_data(config, src, workdir, site, repeat_batches, *, layer: int,
              tag: str = "", prefix: str = "") -> dict:
  """A site's activations, scaled by one scalar so that E|x|^2 = D (the
  L1 coefficient then means the same on every model, Anthropic's
  normalisation; the splice divides it back), with its mean and pace;
  its SAEs go to `workdir/<prefix><kind>_seed<seed>`."""
  acts, evals, collect_s = collect(config, src, workdir, site, layer=layer,
                                   tag=tag)
  scale = float(np.sqrt(acts.shape[1] / np.mean(np.sum(acts ** 2, -1))))
  return {"acts": acts * scale, "evals": evals * scale, "scale": scale,
          "mean_site": acts.mean(0), "collect_s": collect_s,
          "layer": layer, "prefix": prefix, "workdir": str(workdir),
          "site": site_name(layer, site),
          "repeat_batches": repeat_batches, "loss_fns": {}, "ablations": {}}


def data_summary(data) -> dict:
  n = data["acts"].shape[0]
  return {"train_tokens": int(n), "eval_tokens": int(data["evals"].shape[0]),
          "collect_s": data["collect_s"],
          "collect_tokens_per_s": n / data["collect_s"],
          "scale": data["scale"]}
