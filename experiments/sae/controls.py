"""Controls for the induction-feature claims: the same criterion, the
same SAE settings and seeds, where the layer holds no learned induction.

  * "layer0": the same model's layer 0, whose heads are not induction
    heads (its induction scores are reported beside it);
  * "reinit": the claim's layer of the same architecture freshly
    initialised and never trained (`sources.reinitialised`);
  * "untrained": the claim's layer and activations, with each SAE's
    starting point never trained (`per_sae.untrained`): a random
    dictionary, no learning.

Each control's SAEs are trained on its own z from the same token batches
(the untrained one trains none), for the seeds of
`experiment.control_seeds` and kinds of `experiment.control_kinds`; the
re-initialised model's for `reinit_seeds` and `reinit_kinds` where they
are set (None: the same as the others); the untrained one for every seed
and kind of the claim. The criterion counts
DFA from the heads the claim's layer calls induction heads, by index, in
every control: on the induction model's layer 1 every head is one, so
"from the induction heads" holds of every feature there, and counting
the same heads in the controls keeps the other three criteria (the rate,
the second/first ratio and the induction source) the only ones that can
separate them. The layer's own
induction heads by the threshold are reported too; where there are none,
the criterion with them finds nothing by construction.
"""

from __future__ import annotations

from experiments.sae import per_sae
from experiments.sae import sources
from experiments.sae import summaries

CONTROLS = ("layer0", "reinit", "untrained")


def _setting(name, config, src, workdir, main):
  """`(src, data)` of one control: its model and its site's data."""
  e = config.experiment
  if name == "untrained":
    return src, main
  if name == "layer0":
    layer, csrc = e.control_layer, src
  else:
    layer, csrc = e.layer, sources.reinitialised(config, src, e.reinit_seed)
  data = per_sae.site_data(config, csrc, workdir, "z", main["repeat_batches"],
                           layer=layer, tag=f"control_{name}",
                           prefix=f"control_{name}_")
  return csrc, data


def trained_sets(name: str, e) -> tuple[tuple, tuple]:
  """`(kinds, seeds)` of control `name`'s SAEs (`e`: the experiment
  config). The untrained control costs no training, so it keeps every
  seed and kind of the claim."""
  if name == "untrained":
    return tuple(e.kinds), tuple(e.seeds)
  if name == "reinit":
    return (tuple(e.get("reinit_kinds") or e.control_kinds),
            tuple(e.get("reinit_seeds") or e.control_seeds))
  return tuple(e.control_kinds), tuple(e.control_seeds)


def measure(config, src, workdir, main: dict, tokens) -> dict:
  """Per control of `experiment.controls`: its model and layer, that
  layer's induction scores on the repeated `tokens`, its SAEs' runs
  (`per_sae.measure_sae`) and their summaries over seeds, the sweep's
  included. `main`: the claim's site data (`per_sae.site_data`, with
  its captures and induction heads)."""
  e = config.experiment
  for field in ("control_kinds", "reinit_kinds"):
    if not set(e.get(field) or ()) <= set(e.kinds):
      raise ValueError(f"experiment.{field}: expected kinds the claim "
                       f"trains {tuple(e.kinds)}, got {tuple(e[field])}")
  out = {}
  for name in e.controls:
    if name not in CONTROLS:
      raise ValueError(f"experiment.controls: expected names from "
                       f"{CONTROLS}, got {name!r}")
    csrc, data = _setting(name, config, src, workdir, main)
    if data is not main:
      data["captured"] = per_sae.capture(csrc.model, tokens, data["layer"])
      data["induction_heads"] = main["induction_heads"]
    scores, own = sources.induction_heads_of(
        data["captured"][f"blocks.{data['layer']}.attn.pattern"], tokens,
        e.induction_threshold)
    runs = []
    kinds, seeds = trained_sets(name, e)
    for kind in kinds:
      for seed in seeds:
        made = (per_sae.untrained(config, kind, seed, data["acts"])
                if name == "untrained" else
                per_sae.trained(config, kind, seed, data["acts"], workdir,
                                data["prefix"]))
        runs.append(per_sae.measure_sae(config, csrc, data, *made))
    out[name] = {"model": csrc.label, "layer": data["layer"],
                 "induction_scores": [float(s) for s in scores],
                 "own_induction_heads": own,
                 "heads_counted": list(main["induction_heads"]),
                 "data": per_sae.data_summary(data), "runs": runs,
                 "summary": summaries.per_kind(runs),
                 "sweep": summaries.sweep_per_kind(runs)}
  return out
