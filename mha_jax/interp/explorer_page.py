"""The explorer's page: `explore`'s numbers as JSON, and the HTML around it.

Shape letters: L layers, H heads, K kv heads, Tq query length, Tk key
length.

Kept apart from measuring so that the page changes (a column, a note, the
template in `explorer_static/`) without touching a number, and so that
`interp/show.py` can wrap its own payloads in the same page. Weights
travel as base64 float32, so the page shows exactly the values measured.

The SAE features panel reads the feature dicts `mha_jax/sae/view.py`
documents (its docstring is the reference; `sae_panel` checks them here,
as the interp layer may not import the sae layer).
"""

from __future__ import annotations

import base64
import html
import json
import math
import numbers
import pathlib
import re

import numpy as np
import treescope

from mha_jax import hooks

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


# ------------------------------------------------------- SAE features


def _number(x, fn: str, where: str) -> float:
  if (isinstance(x, bool) or not isinstance(x, numbers.Real)
      or not math.isfinite(float(x))):
    raise ValueError(f"{fn}: `{where}` must be a finite number, got {x!r}")
  return float(x)


def _index(x, fn: str, where: str, stop: int, what: str) -> int:
  if (isinstance(x, bool) or not isinstance(x, numbers.Integral)
      or not 0 <= int(x) < stop):
    raise ValueError(f"{fn}: `{where}` must be {what}, an integer in "
                     f"[0, {stop}), got {x!r}")
  return int(x)


def _items(x, fn: str, where: str, what: str) -> list:
  """`x` as a list: a list, tuple or 1-D array, never a string or dict."""
  if isinstance(x, np.ndarray) and x.ndim == 1:
    return x.tolist()
  if not isinstance(x, (list, tuple)):
    raise ValueError(f"{fn}: `{where}` must be a list of {what}, got "
                     f"{type(x).__name__}")
  return list(x)


def _head_rows(rows, fn: str, where: str, layer, layer_arg: str,
               num_heads) -> list[dict]:
  """`[(head name, value)]` as `{"name", "head", "value"}`; given `layer`,
  every name must be one of its heads (`head_name(layer, h)`), and "head"
  is h, which the page links to its grid."""
  out = []
  for k, row in enumerate(_items(rows, fn, where, "(head name, value) "
                                 "pairs")):
    w = f"{where}[{k}]"
    if (not isinstance(row, (list, tuple)) or len(row) != 2
        or not isinstance(row[0], str)):
      raise ValueError(f"{fn}: `{w}` must be a (head name, value) pair, "
                       f"e.g. ('L1H0', 0.5), got {row!r}")
    head = None
    if layer is not None:
      found = re.fullmatch(rf"L{layer}H(\d+)", row[0])
      head = int(found.group(1)) if found else None
      if head is None or (num_heads is not None and head >= num_heads):
        names = (f"{head_name(layer, 0)} to {head_name(layer, num_heads - 1)}"
                 if num_heads else f"{head_name(layer, 0)}, "
                 f"{head_name(layer, 1)}, ...")
        raise ValueError(f"{fn}: `{w}` names head {row[0]!r}, which is not "
                         f"a head of layer `{layer_arg}`={layer}: expected "
                         f"{names}")
    out.append({"name": row[0], "head": head,
                "value": _number(row[1], fn, f"{w}[1]")})
  return out


_CONTEXT_KEYS = ("tokens", "acts", "at", "source", "by_head")


def _sae_context(ctx, fn: str, where: str, heads: dict) -> dict:
  if not isinstance(ctx, dict) or any(k not in ctx for k in _CONTEXT_KEYS):
    got = sorted(ctx) if isinstance(ctx, dict) else type(ctx).__name__
    raise ValueError(f"{fn}: `{where}`: each context needs "
                     f"{', '.join(_CONTEXT_KEYS)} (mha_jax.sae.view); got "
                     f"{got}")
  tokens = _items(ctx["tokens"], fn, f"{where}['tokens']", "token strings")
  if not tokens or not all(isinstance(t, str) for t in tokens):
    raise ValueError(f"{fn}: `{where}['tokens']` must be a non-empty list "
                     f"of token strings, got {tokens!r}")
  out = {"tokens": tokens,
         "at": _index(ctx["at"], fn, f"{where}['at']", len(tokens),
                      "the position of the context's top token")}
  for key in ("acts", "source"):
    values = _items(ctx[key], fn, f"{where}[{key!r}]", "numbers")
    if len(values) != len(tokens):
      raise ValueError(f"{fn}: `{where}[{key!r}]` has {len(values)} values "
                       f"for {len(tokens)} tokens; expected one per token")
    out[key] = [_number(v, fn, f"{where}[{key!r}][{i}]")
                for i, v in enumerate(values)]
  out["by_head"] = _head_rows(ctx["by_head"], fn, f"{where}['by_head']",
                              **heads)
  return out


def sae_panel(features, *, layer, fn: str, num_layers: int | None = None,
              num_heads: int | None = None, arg: str = "sae_features",
              layer_arg: str = "sae_layer") -> dict:
  """The page's SAE features panel: `{"layer", "features"}`, each feature
  `{"id", "title", "heads", "contexts"}` as `mha_jax/sae/view.py`
  documents it, with every (head name, value) pair as `{"name", "head",
  "value"}` ("head": its index in `layer`, None without a layer).

  `features`: that module's feature dicts; `layer`: the layer whose z the
  SAE reads; with `num_layers` (an explorer page: its model's) it is
  required and every head name must be `head_name(layer, h)` with h below
  `num_heads`, so the panel's heads are the grid's. Raises ValueError
  naming `fn`, the argument (`arg`, `layer_arg`) and the entry at fault.
  """
  if features is None:
    raise ValueError(f"{fn}: `{layer_arg}`={layer!r} was given without "
                     f"`{arg}`; pass both or neither")
  if layer is None and num_layers is not None:
    raise ValueError(f"{fn}: `{arg}` needs `{layer_arg}`, the layer whose z "
                     "the SAE reads, so that its heads (L1H0, ...) are "
                     "this model's")
  if layer is not None and num_layers is not None:
    layer = _index(layer, fn, layer_arg, num_layers, "a layer of the model")
  elif layer is not None:  # no model to bound it: a notebook's features
    layer = _index(layer, fn, layer_arg, 2 ** 31, "a layer")
  if isinstance(features, dict):
    raise ValueError(f"{fn}: `{arg}` must be a list of feature dicts, got "
                     "one dict (wrap it in a list)")
  heads = dict(layer=layer, layer_arg=layer_arg, num_heads=num_heads)
  out = []
  for i, f in enumerate(_items(features, fn, arg, "feature dicts")):
    where = f"{arg}[{i}]"
    for key in ("id", "heads", "contexts"):
      if not isinstance(f, dict) or key not in f:
        got = sorted(f) if isinstance(f, dict) else type(f).__name__
        raise ValueError(f"{fn}: `{where}`: each feature needs {key!r} "
                         f"(mha_jax.sae.view); got {got}")
    title = f.get("title", "")
    if not isinstance(title, str):
      raise ValueError(f"{fn}: `{where}['title']` must be a string, got "
                       f"{title!r}")
    fid = _index(f["id"], fn, f"{where}['id']", 2 ** 63, "the feature's id")
    contexts = _items(f["contexts"], fn, f"{where}['contexts']",
                      "context dicts")
    out.append({
        "id": fid, "title": title,
        "heads": _head_rows(f["heads"], fn, f"{where}['heads']", **heads),
        "contexts": [_sae_context(c, fn, f"{where}['contexts'][{j}]", heads)
                     for j, c in enumerate(contexts)]})
  return {"layer": layer, "features": out}


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
           sae_layer: int | None = None) -> str:
  """The self-contained HTML page of `explore`'s `data`.

  `info`: (label, value) pairs shown under the title (the run, its
  config); `circuits`: `{"source": file, "columns": {name: [L, H]}}`,
  extra per-head columns (e.g. `experiments.saved_patching.beside`);
  `raw_arrays`: add the Treescope panel of every view; `sae_features`
  (with `sae_layer`, the layer whose z the SAE reads): the SAE features
  panel (`sae_panel`), in place of any `explore` was given.
  """
  if sae_features is not None or sae_layer is not None:
    self_kind = next((k for k in data["kinds"] if k["key"] == "self"),
                     data["kinds"][0])
    num_layers, num_heads = self_kind["weights"].shape[:2]
    data = dict(data, sae=sae_panel(
        sae_features, layer=sae_layer, num_layers=num_layers,
        num_heads=num_heads, fn="render"))
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
