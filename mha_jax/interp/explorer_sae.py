"""The explorer's SAE features panel: feature dicts checked for the page.

The dicts are those `mha_jax/sae/view.py` documents (its docstring is the
reference); they are checked here, in the interp layer, because interp
may not import the sae layer. `sae_panel` returns the panel's data, which
`explorer_page` puts in the payload and `explorer_static/page.js` draws.
"""

from __future__ import annotations

import math
import numbers
import re

import numpy as np

from mha_jax import hooks

head_name = hooks.head_name


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
    head = (None if layer is None else
            _head_of(row[0], fn, w, layer, layer_arg, num_heads))
    out.append({"name": row[0], "head": head,
                "value": _number(row[1], fn, f"{w}[1]")})
  return out


def _head_of(name: str, fn: str, where: str, layer: int, layer_arg: str,
             num_heads) -> int:
  """h of `name` = `head_name(layer, h)`, h below `num_heads` (if known)."""
  found = re.fullmatch(rf"L{layer}H(\d+)", name)
  head = int(found.group(1)) if found else None
  if head is None or (num_heads is not None and head >= num_heads):
    names = (f"{head_name(layer, 0)} to {head_name(layer, num_heads - 1)}"
             if num_heads else f"{head_name(layer, 0)}, "
             f"{head_name(layer, 1)}, ...")
    raise ValueError(f"{fn}: `{where}` names head {name!r}, which is not "
                     f"a head of layer `{layer_arg}`={layer}: expected "
                     f"{names}")
  return head


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


def _head_tops(tops, fn: str, where: str, ids: dict, arg: str, layer,
               layer_arg: str, num_heads) -> list[dict]:
  """`{head name: [(feature id, share)]}` as one `{"name", "head",
  "features": [{"id", "share", "feature"}]}` per head, by head; "feature"
  is the id's index in the panel's features (`ids`: id -> index)."""
  if layer is None:
    raise ValueError(f"{fn}: `{where}` needs `{layer_arg}`, the layer whose "
                     "z the SAE reads: its keys are that layer's heads")
  if not isinstance(tops, dict):
    raise ValueError(f"{fn}: `{where}` must be a dict {{head name: "
                     f"[(feature id, decoder share)]}}, e.g. {{'L1H0': "
                     f"[(7, 0.9)]}}, got {type(tops).__name__}")
  out = []
  for name, rows in tops.items():
    w = f"{where}[{name!r}]"
    if not isinstance(name, str):
      raise ValueError(f"{fn}: `{where}` must be keyed by head names "
                       f"(e.g. 'L1H0'), got the key {name!r}")
    head = _head_of(name, fn, w, layer, layer_arg, num_heads)
    listed = []
    for k, row in enumerate(_items(rows, fn, w, "(feature id, decoder "
                                   "share) pairs")):
      wk = f"{w}[{k}]"
      if not isinstance(row, (list, tuple)) or len(row) != 2:
        raise ValueError(f"{fn}: `{wk}` must be a (feature id, decoder "
                         f"share) pair, e.g. (7, 0.9), got {row!r}")
      fid = _index(row[0], fn, f"{wk}[0]", 2 ** 63, "a feature's id")
      share = _number(row[1], fn, f"{wk}[1]")
      if not 0 <= share <= 1:
        raise ValueError(f"{fn}: `{wk}[1]` must be a decoder share, a "
                         f"number in [0, 1], got {row[1]!r}")
      if listed and share > listed[-1]["share"]:
        raise ValueError(f"{fn}: `{w}` must list the features the head "
                         f"writes most first (shares not increasing); got "
                         f"{listed[-1]['share']!r} then {share!r}")
      # Every listed feature opens in the panel: its dict must be there.
      if fid not in ids:
        raise ValueError(f"{fn}: `{wk}[0]` is feature {fid}, which `{arg}` "
                         "does not hold: add its dict, so that the page "
                         "can open it")
      listed.append({"id": fid, "share": share, "feature": ids[fid]})
    out.append({"name": name, "head": head, "features": listed})
  return sorted(out, key=lambda r: r["head"])


def sae_panel(features, *, layer, fn: str, num_layers: int | None = None,
              num_heads: int | None = None, arg: str = "sae_features",
              layer_arg: str = "sae_layer", head_features=None,
              head_arg: str = "sae_head_features") -> dict:
  """The page's SAE features panel: `{"layer", "features"}`, each feature
  `{"id", "title", "heads", "contexts"}` as `mha_jax/sae/view.py`
  documents it, with every (head name, value) pair as `{"name", "head",
  "value"}` ("head": its index in `layer`, None without a layer); given
  `head_features`, also "head_features" (`_head_tops`).

  `features`: that module's feature dicts; `layer`: the layer whose z the
  SAE reads; with `num_layers` (an explorer page: its model's) it is
  required and every head name must be `head_name(layer, h)` with h below
  `num_heads`, so the panel's heads are the grid's. `head_features`:
  `{head name: [(feature id, decoder share)]}`, for heads of `layer`, the
  features each head writes most, largest share first, every share in
  [0, 1] (`mha_jax.sae.attribution.head_top_features` ranks them) and
  every id one of `features`', so that each listed feature opens in the
  panel. Raises ValueError naming `fn`, the argument (`arg`, `layer_arg`,
  `head_arg`) and the entry at fault.
  """
  if features is None and head_features is not None:
    raise ValueError(f"{fn}: `{head_arg}` was given without `{arg}`, the "
                     "features it lists")
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
  panel = {"layer": layer, "features": out}
  if head_features is not None:
    ids = {}
    for i, f in enumerate(out):
      ids.setdefault(f["id"], i)
    panel["head_features"] = _head_tops(
        head_features, fn, head_arg, ids, arg, **heads)
  return panel
