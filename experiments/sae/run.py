"""The SAE experiment, measuring: collect a layer's z, train the SAEs,
measure them, find their induction features; then the same SAEs on the
layer's `resid_pre` (the second site) where the config asks.

Shape letters: N tokens, D = H * Dv the SAE's input width, F features.

`measure(config, workdir)` returns results.json's contents: the model and
data sizes, the collection's pace, and per (kind, seed) run the SAE's L0,
dead and dense fractions, explained variance on held-out tokens, the
model's loss clean / spliced / zero- / mean-ablated with loss recovered,
both on held-out inputs (`loss`) and on the second copy of repeated
random tokens (`loss_repeated`, where the layer's induction heads are
what predicts the token, so ablating the layer costs most), its
induction features and how much of the induction heads' output they
reconstruct, with summaries over seeds per kind. With
`experiment.resid_pre_kinds`, `resid_pre` holds the second site's data,
runs (the same measures but the z-only induction ones) and summaries.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import time

import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.sae import induction
from experiments.sae import sources
from experiments.sae import summaries
from mha_jax.sae import attribution
from mha_jax.sae import buffer
from mha_jax.sae import metrics
from mha_jax.sae import train


def sae_config(config, kind: str, seed: int) -> ml_collections.ConfigDict:
  """One SAE's settings; a TopK SAE's `l1` is 0, since it has no L1 term
  (so its saved config does not change with the ReLU coefficient)."""
  c = ml_collections.ConfigDict(config.sae.to_dict())
  c.kind, c.seed = kind, seed
  if kind == "topk":
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


def collect(config, src, workdir, site: str = "z"):
  """`(train acts [N, D], eval acts, seconds)` of the layer's `site` ("z"
  or "resid_pre"), kept in `workdir/activations.npz` (z) or
  `activations_<site>.npz` with the settings that made them, so that a
  resumed run with the same settings does not collect again (the seconds
  are then the first collection's)."""
  e = config.experiment
  fields = [config.source, config.model.to_dict(), e.layer, e.drop_first,
            e.train_batches, e.eval_batches, e.text_windows, e.eval_windows,
            e.text_len, e.data_seed]
  key = json.dumps(fields if site == "z" else fields + [site])
  name = "activations.npz" if site == "z" else f"activations_{site}.npz"
  path = pathlib.Path(workdir) / name
  if path.exists():
    saved = np.load(path)
    if "key" in saved.files and str(saved["key"]) == key:
      return saved["acts"], saved["evals"], float(saved["seconds"])
  acts, evals, seconds = _collect(src, site_name(e.layer, site),
                                  e.drop_first)
  path.parent.mkdir(parents=True, exist_ok=True)
  np.savez(path, acts=acts, evals=evals, seconds=seconds, key=key)
  return acts, evals, seconds


SITES = ("z", "resid_pre")


def site_name(layer: int, site: str) -> str:
  """The hook site of `site` ("z" or "resid_pre") at `layer`."""
  if site not in SITES:
    raise ValueError(f"site: expected one of {SITES}, got {site!r}")
  return f"blocks.{layer}.attn.z" if site == "z" else f"blocks.{layer}.{site}"


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


def _repeated(src, e):
  """The repeated random tokens and the layer's captured z, pattern, v."""
  bos = None if e.bos < 0 else e.bos
  tokens = buffer.repeated_tokens(e.repeat_inputs, e.repeat_len,
                                  tuple(e.token_range), seed=e.data_seed + 1,
                                  bos=bos)
  sites = [f"blocks.{e.layer}.attn.{s}" for s in ("z", "pattern", "v")]
  caps = [src.model(jnp.asarray(tokens[a:a + 8]), capture=sites)[1]
          for a in range(0, len(tokens), 8)]
  return tokens, {s: jnp.concatenate([c[s] for c in caps]) for s in sites}


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


def _trained(config, kind, seed, acts, workdir, prefix=""):
  """`(params, cfg, seconds)`: one SAE trained (or resumed) on `acts`;
  the seconds its training took, over every call that made it."""
  cfg = sae_config(config, kind, seed)
  run_dir = _run_dir(workdir, cfg, prefix)
  state = train.train(cfg, acts, run_dir)
  if train.train_seconds(run_dir) is None:  # saved before its time was
    shutil.rmtree(run_dir)
    return _trained(config, kind, seed, acts, workdir, prefix)
  return state["params"], cfg, train.train_seconds(run_dir)


def _standard(config, src, data, params, cfg, train_s) -> dict:
  """The measures of any site: sparsity, explained variance, and the loss
  with the reconstruction spliced in, on held-out inputs and on the
  repeated random tokens' second copy."""
  kind = cfg.kind
  k = cfg.k if kind == "topk" else None
  st = metrics.feature_stats(params, data["evals"], kind=kind, k=k)
  # One compiled loss per kind, and the ablations (which no SAE changes)
  # once per site and evaluation set, kept in `data` for the next SAE.
  if kind not in data["loss_fns"]:
    data["loss_fns"][kind] = metrics.site_loss_fn(
        src.model, data["site"], kind=kind, k=k,
        keep_first=config.experiment.drop_first)
  loss_fn = data["loss_fns"][kind]
  args = (params, data["scale"], jnp.asarray(data["mean_site"]))

  def ce(name, batches):
    if name not in data["ablations"]:
      data["ablations"][name] = metrics.baselines(loss_fn, batches, *args)
    return metrics.losses(loss_fn, batches, *args,
                          ablations=data["ablations"][name])
  return {"kind": kind, "seed": cfg.seed, "train_s": train_s,
          "steps_per_s": cfg.num_steps / train_s,
          "l0": st["l0"], "dead": st["dead"], "dense": st["dense"],
          "explained_variance": st["explained_variance"],
          "loss": ce("loss", src.eval_batches),
          "loss_repeated": ce("loss_repeated", data["repeat_batches"])}


def measure_sae(config, src, data, kind, seed, workdir) -> dict:
  """Train (or resume) one SAE on z and measure it."""
  e = config.experiment
  params, cfg, train_s = _trained(config, kind, seed, data["acts"], workdir)
  k = cfg.k if kind == "topk" else None
  out = _standard(config, src, data, params, cfg, train_s)
  det = induction.detect(params, data["captured"], e.layer, e.repeat_len,
                         data["induction_heads"], e, kind=kind, k=k,
                         scale=data["scale"])
  z = data["captured"][f"blocks.{e.layer}.attn.z"]
  rec = {name: induction.reconstruction(
      params, z, e.repeat_len, data["induction_heads"], det[name],
      kind=kind, k=k, scale=data["scale"], draws=e.random_draws, seed=seed)
         for name in ("features", "copying")}

  shares = np.asarray(attribution.head_shares(params["w_dec"],
                                              z.shape[2]))
  found = det["features"]
  out["induction"] = {
      "count": len(found), "features": found,
      "top_head": [int(np.argmax(shares[f])) for f in found],
      "decoder_share_induction_heads": [
          float(shares[f, data["induction_heads"]].sum()) for f in found],
      "head_share": [float(det["head_share"][f]) for f in found],
      "source_share": [float(det["source_share"][f]) for f in found],
      "second_rate": [float(det["second_rate"][f]) for f in found],
      "ratio": [float(det["mean_second"][f] / max(det["mean_first"][f],
                                                  1e-9)) for f in found],
      "copying_count": len(det["copying"]), "copying": det["copying"],
      "reconstruction": rec["features"],
      "copying_reconstruction": rec["copying"]}
  return out


def _site_data(config, src, workdir, site, repeat_batches) -> dict:
  """A site's activations, scaled by one scalar so that E|x|^2 = D (the
  L1 coefficient then means the same on every model, Anthropic's
  normalisation; the splice divides it back), with its mean and pace."""
  acts, evals, collect_s = collect(config, src, workdir, site)
  scale = float(np.sqrt(acts.shape[1] / np.mean(np.sum(acts ** 2, -1))))
  return {"acts": acts * scale, "evals": evals * scale, "scale": scale,
          "mean_site": acts.mean(0), "collect_s": collect_s,
          "site": site_name(config.experiment.layer, site),
          "repeat_batches": repeat_batches, "loss_fns": {}, "ablations": {}}


def _data_summary(data) -> dict:
  n = data["acts"].shape[0]
  return {"train_tokens": int(n), "eval_tokens": int(data["evals"].shape[0]),
          "collect_s": data["collect_s"],
          "collect_tokens_per_s": n / data["collect_s"],
          "scale": data["scale"]}


def measure(config, workdir, src: sources.Source | None = None) -> dict:
  """results.json's contents (the module docstring); `src`: the run's
  source if already loaded (`sources.load`)."""
  e = config.experiment
  start = time.perf_counter()
  src = src or sources.load(config, workdir)
  tokens, captured = _repeated(src, e)
  repeats = repeated_batches(tokens, e)
  data = _site_data(config, src, workdir, "z", repeats)
  ind_scores, ind_heads = sources.induction_heads_of(
      captured[f"blocks.{e.layer}.attn.pattern"], tokens,
      e.induction_threshold)
  data.update(captured=captured, induction_heads=ind_heads)
  runs = [measure_sae(config, src, data, kind, seed, workdir)
          for kind in e.kinds for seed in e.seeds]
  out = {}
  if e.resid_pre_kinds:  # the second site: the stream entering the layer
    rdata = _site_data(config, src, workdir, "resid_pre", repeats)
    rruns = [_standard(config, src, rdata, *_trained(
        config, kind, seed, rdata["acts"], workdir, "resid_pre_"))
             for kind in e.resid_pre_kinds for seed in e.seeds]
    out["resid_pre"] = {"data": _data_summary(rdata), "runs": rruns,
                        "summary": summaries.per_kind(rruns)}
  c = src.model.config
  return {
      "model": {"label": src.label, "layer": e.layer,
                "heads": c.num_heads, "kv_heads": c.num_kv_heads or
                c.num_heads, "width": int(data["acts"].shape[1]),
                "model_wall_s": src.model_wall_s},
      "data": _data_summary(data),
      "induction_scores": [float(s) for s in ind_scores],
      "induction_heads": ind_heads,
      "runs": runs, "summary": summaries.per_kind(runs),
      "topk_minus_relu": summaries.topk_minus_relu(runs), **out,
      "wall_s": time.perf_counter() - start}
