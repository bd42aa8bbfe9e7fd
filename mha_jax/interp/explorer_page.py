"""The explorer's page: `explore`'s numbers as JSON, and the HTML around it.

Shape letters: L layers, H heads, K kv heads, Tq query length, Tk key
length.

Kept apart from measuring so that the page changes (a column, a note, the
template in `explorer_static/`) without touching a number, and so that
`interp/show.py` can wrap its own payloads in the same page. Weights
travel as base64 float32, so the page shows exactly the values measured.

The SAE features panel's data come checked from `explorer_sae.sae_panel`
and travel in the payload as they are.
"""

from __future__ import annotations

import base64
import html
import json
import pathlib
import re

import numpy as np
import treescope

from mha_jax import hooks
from mha_jax.interp import explorer_sae

_STATIC = pathlib.Path(__file__).parent / "explorer_static"

# The table's columns: (key, header, digits, what it measures). Scores of
# `head_metrics.head_metrics` first, then the ablation; absent keys are skipped.
SCORE_COLUMNS = (
    ("previous_token", "previous-token", 3,
     "mean weight on the key one position back"),
    ("induction", "induction", 3,
     "mean weight on the token after an earlier copy of the query's token"),
    ("duplicate_token", "duplicate-token", 3,
     "mean weight on earlier copies of the query's own token"),
    ("entropy", "entropy (nats)", 3,
     "mean entropy of the rows; log(n) is uniform over n keys"),
    ("confidence", "confidence", 3, "mean largest weight of a row"),
    ("mean_distance", "mean distance", 2,
     "expected |query position - key position|"),
    ("positional_offset", "argmax offset", 0,
     "most common offset of the argmax key (1 = previous token)"),
    ("positional_share", "offset share", 3,
     "share of rows whose argmax is at that offset"),
    ("ablation", "ablation effect", 4,
     "loss increase when this head alone is zero-ablated"),
)


def gqa_note(num_heads: int, num_kv_heads: int) -> str:
  """The page's line on grouped-query attention: heads are query heads,
  and which of them share a kv head (e.g. H0-H1 -> kv 0)."""
  groups = ", ".join(
      f"H{g[0]}-H{g[-1]} -> kv {j}" if len(g) > 1 else f"H{g[0]} -> kv {j}"
      for j in range(num_kv_heads)
      for g in [hooks.query_heads(j, num_heads, num_kv_heads)])
  kv = f"{num_kv_heads} kv head" + ("s" if num_kv_heads > 1 else "")
  return (f"{num_heads} query heads on {kv} (grouped-query attention): "
          f"every head here is a query head; {groups}")


# The page shows the names it is given, so Python's tests read every label
# a reader sees.
head_name = hooks.head_name


def score_rows(values, num_layers: int, num_heads: int) -> list[dict]:
  """One table row per head, layer-major: its name, `layer`, `head` and
  `[v[layer, head] for v in values]`, each `v` being `[L, H]`."""
  return [{"name": head_name(l, h), "layer": l, "head": h,
           "values": [float(v[l, h]) for v in values]}
          for l in range(num_layers) for h in range(num_heads)]


def b64_float32(weights) -> str:
  """Little-endian float32 bytes, base64: exact values, a quarter of the
  size of decimal text (the page reads them as a Float32Array)."""
  return base64.b64encode(np.asarray(weights, "<f4").tobytes()).decode()


def _table(kind: dict, circuits) -> dict:
  """The score table of one kind: columns, one row per head, floor rows."""
  scores = kind["scores"]
  num_layers, num_heads = kind["weights"].shape[:2]
  cols = [dict(key=k, label=lab, digits=d, help=h)
          for k, lab, d, h in SCORE_COLUMNS if k in scores]
  values = {k: np.asarray(scores[k], float) for k in scores}
  if circuits and kind["key"] == "self":
    for name, arr in circuits["columns"].items():
      cols.append(dict(key=name, label=name, digits=3, circuit=True,
                       help=f"from {circuits['source']}"))
      values[name] = arr
  rows = score_rows([values[c["key"]] for c in cols], num_layers, num_heads)
  floors = []
  names = {"uniform": "uniform attention (floor)",
           "init": "same model at initialisation (mean over heads)"}
  for name, fl in kind["floors"].items():
    # A mean of argmax offsets is no offset of any head: left blank.
    vals = [None if c["key"] not in fl or c["key"] == "positional_offset"
            else float(np.mean(fl[c["key"]])) for c in cols]
    floors.append({"name": names.get(name, name), "values": vals})
  return {"columns": cols, "rows": rows, "floors": floors}


def _treescope_panel(kind: dict) -> str:
  """Treescope's rendering of the kind's `[L, H, Tq, Tk]` weights."""
  w = kind["weights"]
  fig = treescope.render_array(
      w, rows=[2], columns=[3], sliders=[0, 1], vmin=0.0, vmax=1.0,
      axis_labels={0: "layer", 1: "head", 2: "query", 3: "key"},
      axis_item_labels={2: kind["query_labels"], 3: kind["key_labels"]},
      maximum_size=max(w.size, 10_000), pixels_per_cell=12)
  return fig._repr_html_()  # pylint: disable=protected-access


def page_json(data: dict, *, title: str = "", info=(),
              circuits=None) -> dict:
  """What the page's script reads: labels, weights (base64) and tables,
  and `data["sae"]` (`sae_panel`'s) when there is one."""
  kinds = []
  for kind in data["kinds"]:
    num_layers, num_heads, tq, tk = kind["weights"].shape
    kinds.append({
        "key": kind["key"], "title": kind["title"], "causal": kind["causal"],
        "num_layers": num_layers, "num_heads": num_heads, "tq": tq, "tk": tk,
        "query_labels": kind["query_labels"],
        "key_labels": kind["key_labels"],
        "weights": b64_float32(kind["weights"]),
        "table": _table(kind, circuits)})
  info = list(info) + [("example shown", f"{data['example']} of "
                        f"{data['num_examples']} (scores over all)")]
  h, k = data.get("heads", (0, 0))
  if k < h:
    info.append(("heads", gqa_note(h, k)))
  if "eval" in data:
    info.append(("loss on the batch", " | ".join(
        f"{k} {v:.4f}" for k, v in sorted(data["eval"].items()))))
  payload = {"title": title, "info": [[str(k), str(v)] for k, v in info],
             "kinds": kinds}
  if data.get("sae") is not None:
    payload["sae"] = data["sae"]
  return payload


def render(data: dict, *, title: str = "Attention explorer", info=(),
           circuits=None, raw_arrays: bool = True, sae_features=None,
           sae_layer: int | None = None, sae_head_features=None) -> str:
  """The self-contained HTML page of `explore`'s `data`.

  `info`: (label, value) pairs shown under the title (the run, its
  config); `circuits`: `{"source": file, "columns": {name: [L, H]}}`,
  extra per-head columns (e.g. `experiments.saved_patching.beside`);
  `raw_arrays`: add the Treescope panel of every view; `sae_features`
  (with `sae_layer`, the layer whose z the SAE reads): the SAE features
  panel (`explorer_sae.sae_panel`), in place of any `explore` was given;
  `sae_head_features`: with them, the features each head writes most.
  """
  if (sae_features is not None or sae_layer is not None
      or sae_head_features is not None):
    self_kind = next((k for k in data["kinds"] if k["key"] == "self"),
                     data["kinds"][0])
    num_layers, num_heads = self_kind["weights"].shape[:2]
    data = dict(data, sae=explorer_sae.sae_panel(
        sae_features, layer=sae_layer, num_layers=num_layers,
        num_heads=num_heads, head_features=sae_head_features,
        fn="render"))
  raw = ""
  if raw_arrays:
    raw = "\n".join(
        f'<div class="raw" data-kind="{i}">{_treescope_panel(k)}</div>'
        for i, k in enumerate(data["kinds"]))
  return page_html(page_json(data, title=title, info=info,
                             circuits=circuits), title=title, raw=raw)


def page_html(payload: dict, *, title: str, raw: str = "") -> str:
  """The page (`explorer_static/`) around `payload`, the JSON its script
  reads (`page_json`'s, or a notebook view's from `interp/show.py`);
  `raw`: HTML of the Treescope panels, if any."""
  text = json.dumps(payload, separators=(",", ":"))
  # Inside <script>, "</" could end the element early; JSON allows "<\/".
  text = text.replace("</", "<\\/")
  page = (_STATIC / "page.html").read_text()
  parts = {"TITLE": html.escape(title), "CSS": (_STATIC / "page.css"
                                                ).read_text(),
           "JS": (_STATIC / "page.js").read_text(), "DATA": text,
           "RAW": raw}
  # One pass, so a placeholder inside the substituted text stays as it is.
  return re.sub(r"@@(\w+)@@", lambda m: parts[m.group(1)], page)
