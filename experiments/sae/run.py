"""The SAE experiment, measuring: collect a layer's z, train the SAEs,
measure them, find their induction features; then the same SAEs on the
layer's `resid_pre` (the second site) where the config asks.

Shape letters: N tokens, D = H * Dv the SAE's input width, F features.

`measure(config, workdir)` returns results.json's contents: the model and
data sizes, the collection's pace, and per (kind, seed) run the SAE's L0,
dead and dense fractions, explained variance on held-out tokens, the
model's loss clean / spliced / zero- / mean-ablated with loss recovered
and the KL of each from the clean distribution,
both on held-out inputs (`loss`) and on the second copy of repeated
random tokens (`loss_repeated`, where the layer's induction heads are
what predicts the token, so ablating the layer costs most), its
induction features and how much of the induction heads' output they
reconstruct, the criterion's counts over a threshold sweep, with
summaries over seeds per kind; then the controls (`controls.py`): the
same criterion on SAEs where no learned induction is. With
`experiment.resid_pre_kinds` (and `resid_pre_seeds`), `resid_pre` holds the second site's data,
runs (the same measures but the z-only induction ones) and summaries.
"""

from __future__ import annotations

import time

from experiments.sae import controls
from experiments.sae import per_sae
from experiments.sae import sources
from experiments.sae import summaries


def measure(config, workdir, src: sources.Source | None = None) -> dict:
  """results.json's contents (the module docstring); `src`: the run's
  source if already loaded (`sources.load`)."""
  e = config.experiment
  start = time.perf_counter()
  src = src or sources.load(config, workdir)
  tokens = per_sae.repeated_tokens(e)
  captured = per_sae.capture(src.model, tokens, e.layer)
  # The loss on repeats reads the first `loss_repeats` inputs (0: all);
  # the induction criterion reads them all.
  repeats = per_sae.repeated_batches(tokens[:e.loss_repeats or None], e)
  data = per_sae.site_data(config, src, workdir, "z", repeats, layer=e.layer)
  ind_scores, ind_heads = sources.induction_heads_of(
      captured[f"blocks.{e.layer}.attn.pattern"], tokens,
      e.induction_threshold)
  data.update(captured=captured, induction_heads=ind_heads)
  runs = [per_sae.measure_sae(config, src, data, *per_sae.trained(
      config, kind, seed, data["acts"], workdir))
          for kind in e.kinds for seed in e.seeds]
  out = {}
  if e.resid_pre_kinds:  # the second site: the stream entering the layer
    rdata = per_sae.site_data(config, src, workdir, "resid_pre", repeats,
                              layer=e.layer, prefix="resid_pre_")
    rruns = [per_sae.standard(config, src, rdata, *per_sae.trained(
        config, kind, seed, rdata["acts"], workdir, "resid_pre_"))
             for kind in e.resid_pre_kinds for seed in e.resid_pre_seeds]
    out["resid_pre"] = {"data": per_sae.data_summary(rdata), "runs": rruns,
                        "summary": summaries.per_kind(rruns)}
  if e.controls:
    out["controls"] = controls.measure(config, src, workdir, data, tokens)
  c = src.model.config
  return {
      "model": {"label": src.label, "layer": e.layer,
                "heads": c.num_heads, "kv_heads": c.num_kv_heads or
                c.num_heads, "width": int(data["acts"].shape[1]),
                "model_wall_s": src.model_wall_s},
      "data": per_sae.data_summary(data),
      "induction_scores": [float(s) for s in ind_scores],
      "induction_heads": ind_heads,
      "runs": runs, "summary": summaries.per_kind(runs),
      "sweep": summaries.sweep_per_kind(runs),
      "topk_minus_relu": summaries.topk_minus_relu(runs), **out,
      "wall_s": time.perf_counter() - start}
