"""The SAE experiment, measuring: collect a layer's z, train the SAEs,
measure them, find their induction features.

Shape letters: N tokens, D = H * Dv the SAE's input width, F features.

`measure(config, workdir)` returns results.json's contents: the model and
data sizes, the collection's pace, and per (kind, seed) run the SAE's L0,
dead and dense fractions, explained variance on held-out tokens, the
model's loss clean / spliced / zero- / mean-ablated with loss recovered,
its induction features and how much of the induction heads' output they
reconstruct, with summaries over seeds per kind.
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
from mha_jax.measure import stats
from mha_jax.sae import attribution
from mha_jax.sae import buffer
from mha_jax.sae import metrics
from mha_jax.sae import train


def sae_config(config, kind: str, seed: int) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict(config.sae.to_dict())
  c.kind, c.seed = kind, seed
  if kind == "topk" and c.topk_steps:
    c.num_steps = c.topk_steps
  return c


def _run_dir(workdir, cfg) -> pathlib.Path:
  """`workdir/<kind>_seed<seed>`, emptied if it holds another config's
  run (a resumed run must be the same run)."""
  d = pathlib.Path(workdir) / f"{cfg.kind}_seed{cfg.seed}"
  saved = d / "sae_config.json"
  if saved.exists() and json.loads(saved.read_text()) != cfg.to_dict():
    shutil.rmtree(d)
  d.mkdir(parents=True, exist_ok=True)
  saved.write_text(json.dumps(cfg.to_dict(), indent=1))
  return d


def collect(config, src, workdir):
  """`(train acts [N, D], eval acts, seconds)` of the layer's z, kept in
  `workdir/activations.npz` with the settings that made them, so that a
  resumed run with the same settings does not collect again (the seconds
  are then the first collection's)."""
  e = config.experiment
  key = json.dumps([config.source, config.model.to_dict(), e.layer,
                    e.drop_first, e.train_batches, e.eval_batches,
                    e.text_windows, e.eval_windows, e.text_len,
                    e.data_seed])
  path = pathlib.Path(workdir) / "activations.npz"
  if path.exists():
    saved = np.load(path)
    if "key" in saved.files and str(saved["key"]) == key:
      return saved["acts"], saved["evals"], float(saved["seconds"])
  acts, evals, seconds = _collect(src, f"blocks.{e.layer}.attn.z",
                                  e.drop_first)
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


def measure_sae(config, src, data, kind, seed, workdir) -> dict:
  """Train (or resume) one SAE and measure it."""
  e = config.experiment
  cfg = sae_config(config, kind, seed)
  k = cfg.k if kind == "topk" else None
  start = time.perf_counter()
  state = train.train(cfg, data["acts"], _run_dir(workdir, cfg))
  train_s = time.perf_counter() - start
  params = state["params"]
  st = metrics.feature_stats(params, data["evals"], kind=kind, k=k)
  loss_fn = metrics.site_loss_fn(src.model, data["site"], kind=kind, k=k,
                                 keep_first=e.drop_first)
  ce = metrics.losses(loss_fn, src.eval_batches, params, data["scale"],
                      jnp.asarray(data["mean_site"]))
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
  return {
      "kind": kind, "seed": seed, "train_s": train_s,
      "steps_per_s": cfg.num_steps / train_s,
      "l0": st["l0"], "dead": st["dead"], "dense": st["dense"],
      "explained_variance": st["explained_variance"], "loss": ce,
      "induction": {
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
          "copying_reconstruction": rec["copying"]}}


def _summaries(runs: list) -> dict:
  """Per kind, `stats.summary` over seeds of the headline numbers."""
  out = {}
  for kind in sorted({r["kind"] for r in runs}):
    rs = [r for r in runs if r["kind"] == kind]
    pick = {"l0": lambda r: r["l0"], "dead": lambda r: r["dead"],
            "dense": lambda r: r["dense"],
            "explained_variance": lambda r: r["explained_variance"],
            "recovered_zero": lambda r: r["loss"]["recovered_zero"],
            "recovered_mean": lambda r: r["loss"]["recovered_mean"],
            "ce_splice": lambda r: r["loss"]["splice"],
            "induction_count": lambda r: r["induction"]["count"],
            "copying_count": lambda r: r["induction"]["copying_count"],
            "steps_per_s": lambda r: r["steps_per_s"]}
    out[kind] = {n: stats.summary([float(f(r)) for r in rs])
                 for n, f in pick.items()}
  return out


def measure(config, workdir) -> dict:
  e = config.experiment
  start = time.perf_counter()
  src = sources.load(config, workdir)
  site = f"blocks.{e.layer}.attn.z"
  acts, evals, collect_s = collect(config, src, workdir)
  # One scalar makes E|x|^2 = D, so the L1 coefficient means the same on
  # every model (Anthropic's normalisation); the splice divides it back.
  scale = float(np.sqrt(acts.shape[1] / np.mean(np.sum(acts ** 2, -1))))
  mean_site = acts.mean(0)
  tokens, captured = _repeated(src, e)
  ind_scores, ind_heads = sources.induction_heads_of(
      captured[f"blocks.{e.layer}.attn.pattern"], tokens,
      e.induction_threshold)
  data = {"acts": acts * scale, "evals": evals * scale, "scale": scale,
          "mean_site": mean_site, "site": site, "captured": captured,
          "induction_heads": ind_heads}
  runs = [measure_sae(config, src, data, kind, seed, workdir)
          for kind in e.kinds for seed in e.seeds]
  c = src.model.config
  return {
      "model": {"label": src.label, "layer": e.layer,
                "heads": c.num_heads, "kv_heads": c.num_kv_heads or
                c.num_heads, "width": int(acts.shape[1]),
                "model_wall_s": src.model_wall_s},
      "data": {"train_tokens": int(acts.shape[0]),
               "eval_tokens": int(evals.shape[0]),
               "collect_s": collect_s,
               "collect_tokens_per_s": acts.shape[0] / collect_s,
               "scale": scale},
      "induction_scores": [float(s) for s in ind_scores],
      "induction_heads": ind_heads,
      "runs": runs, "summary": _summaries(runs),
      "wall_s": time.perf_counter() - start}
