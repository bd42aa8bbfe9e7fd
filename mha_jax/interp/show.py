"""Inline views for notebooks: patterns, per-token and per-head values.

Shape letters: L layers, H heads, Tq query length, Tk key length, T
length of a sequence.

    from mha_jax.interp import show
    sites = [f"blocks.{l}.attn.pattern" for l in range(L)]
    _, acts = model(tokens, capture=sites)                  # [B, H, T, T]
    show.heads(acts[sites[0]][0], labels)                   # [H, Tq, Tk]
    show.heads([acts[s][0] for s in sites], labels)         # L x [H, Tq, Tk]
    show.tokens(labels, loss_per_token)                     # [T]
    show.heads_bar(dla, name="direct logit attribution")    # [L, H]
    show.sae_features(features, layer=1)   # mha_jax/sae/view.py's dicts

Each returns a `View`: a notebook displays it inline (`_repr_html_`) and
`.save(path)` writes the same page as a file. The page is the explorer's
(`explorer_static/`, through `explorer.page_html`), holding only the
sections the view has data for: one implementation of the grid, the
heatmap, the head view and the table, in the notebook and in the
standalone explorer alike. Everything is embedded (no network); tokens
are set as text, never as HTML.

In a notebook the page sits in an `<iframe srcdoc>`: its element ids,
styles and script cannot clash with the notebook's or with another view's,
and it grows to its content's height.

Long inputs: a page holds at most `max_cells` weights (4 bytes each,
exact). Beyond that `heads` keeps a window of positions (by default the
last ones; `window=(start, stop)` moves it) and says so on the page.
"""

from __future__ import annotations

import dataclasses
import html
import math
import pathlib

import jax.numpy as jnp
import numpy as np

from mha_jax.interp import explorer
from mha_jax.interp import explorer_page
from mha_jax.interp import explorer_sae

# 2**20 float32 weights: 4 MiB, 5.6 MB as base64 in the notebook.
MAX_CELLS = 2 ** 20


# Each frame's height before its script has measured the page (and where
# a front end runs no script in outputs).
_HEIGHTS = {"heads": 900, "tokens": 220, "heads_bar": 300,
            "sae_features": 700}


@dataclasses.dataclass(frozen=True)
class View:
  """One inline view: `page` is a standalone HTML page."""
  page: str
  kind: str  # "heads", "tokens", "heads_bar" or "sae_features"
  title: str

  def _repr_html_(self) -> str:
    # Same-origin srcdoc, so the notebook may read its height; a resize
    # observer follows it when the page's content changes.
    # The html element's own box, not scrollHeight: that is never less
    # than the frame, so the frame could grow but never shrink.
    fit = ("const f=this,d=f.contentDocument;new ResizeObserver(()=>{"
           "f.style.height=Math.ceil(d.documentElement.getBoundingClientRect()"
           ".height+4)+'px'}).observe(d.documentElement)")
    return (f'<iframe class="mha-jax-view" data-view="{self.kind}" '
            f'title="{html.escape(self.title)}" '
            f'style="width:100%;height:{_HEIGHTS[self.kind]}px;border:none" '
            f'onload="{html.escape(fit)}" '
            f'srcdoc="{html.escape(self.page)}"></iframe>')

  def save(self, path) -> pathlib.Path:
    """Write the page to `path` (it opens from disk); returns the path."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(self.page)
    return path

  def __repr__(self) -> str:
    return (f"<show.View {self.kind} {self.title!r}: {len(self.page)} bytes;"
            " displays in a notebook, .save(path) writes it>")


# ------------------------------------------------------------ checking


def _finite(x, fn: str, name: str, what: str, *,
            inf_hint: str = "") -> np.ndarray:
  """`x` as float32 numpy, refused with a clear error unless numeric,
  non-empty and finite; `inf_hint` is added to that error when `x` holds
  -inf (the argument's likely mistake)."""
  a = np.asarray(x)
  # jnp.issubdtype, not numpy's: numpy does not count ml_dtypes' types
  # (bfloat16, float8_*, int4), which jax arrays come in, as numbers.
  # Complex is refused: the cast below would drop the imaginary part.
  if not (a.dtype == bool or jnp.issubdtype(a.dtype, jnp.floating)
          or jnp.issubdtype(a.dtype, jnp.integer)):
    raise TypeError(f"show.{fn}: `{name}` must be a real numeric array "
                    f"{what}, got dtype {a.dtype}")
  a = a.astype(np.float32)
  if a.size == 0:
    raise ValueError(f"show.{fn}: `{name}` is empty (shape {a.shape}); "
                     f"expected {what}")
  bad = ~np.isfinite(a)
  if bad.any():
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    hint = f". {inf_hint}" if inf_hint and np.isneginf(a).any() else ""
    raise ValueError(
        f"show.{fn}: `{name}` has {int(bad.sum())} non-finite values "
        f"(first at {list(first)}: {a[first]}); expected finite {what}"
        f"{hint}")
  return a


def _labels(tokens, fn: str, name: str) -> list[str]:
  """Token labels as strings (ids print as themselves)."""
  if isinstance(tokens, str):
    raise TypeError(f"show.{fn}: `{name}` must be a sequence of token "
                    "labels, one per position, got one string (split it, "
                    "e.g. list(text) for characters)")
  a = np.asarray(tokens, dtype=object)
  if a.ndim != 1:
    raise ValueError(f"show.{fn}: `{name}` must be [T], one label per "
                     f"position, got shape {list(a.shape)}")
  labels = [str(t) for t in a]
  if not labels:
    raise ValueError(f"show.{fn}: `{name}` is empty: expected one label per "
                     "position")
  return labels


def _per_layer(a: np.ndarray, ndim: int, fn: str, name: str,
               what: str) -> np.ndarray:
  """`a` with a leading layer axis: one layer's array (one axis short)
  becomes `[1, ...]`; any other rank than `ndim` is refused."""
  if a.ndim == ndim - 1:
    a = a[None]
  if a.ndim != ndim:
    raise ValueError(f"show.{fn}: `{name}` must be {what}, got shape "
                     f"{list(a.shape)}")
  return a


_PATTERN = "one layer's [H, Tq, Tk], or a list of them, one per layer"
# -inf is what the pre-softmax capture holds where the mask hides a key.
_SCORES_HINT = ("The `blocks.{l}.attn.scores` capture is -inf at masked "
                "keys: pass `blocks.{l}.attn.pattern` (the weights, 0 there)")


def _layers(pattern) -> np.ndarray:
  """`pattern` as `[L, H, Tq, Tk]`: one layer's `[H, Tq, Tk]` array is
  `L = 1`; a list or tuple holds layer l's `[H, Tq, Tk]` at index l. A 4-D
  array is refused (see `heads`)."""
  if isinstance(pattern, (list, tuple)):
    if not pattern:
      raise ValueError("show.heads: `pattern` is an empty list; expected "
                       "one [H, Tq, Tk] per layer")
    layers = [_finite(p, "heads", f"pattern[{l}]", "[H, Tq, Tk]",
                      inf_hint=_SCORES_HINT) for l, p in enumerate(pattern)]
    for l, p in enumerate(layers):
      if p.ndim != 3:
        # A list of whole captures: each entry still has its batch axis.
        batch = ("; a capture is [B, H, Tq, Tk]: index one example, "
                 "acts[site][b]") if p.ndim == 4 else ""
        raise ValueError(f"show.heads: `pattern[{l}]` must be layer {l}'s "
                         f"[H, Tq, Tk] (a list holds one layer per entry), "
                         f"got shape {list(p.shape)}{batch}")
      if p.shape != layers[0].shape:
        raise ValueError(f"show.heads: `pattern[{l}]` has shape "
                         f"{list(p.shape)} but `pattern[0]` "
                         f"{list(layers[0].shape)}; every layer must be "
                         "[H, Tq, Tk] of the same example")
    return np.stack(layers)
  # What a 4-D array's first axis is cannot be read from its shape: a
  # capture is [B, H, Tq, Tk], a stack of layers [L, H, Tq, Tk].
  if np.ndim(pattern) == 4:
    raise ValueError(
        f"show.heads: `pattern` has shape {list(np.shape(pattern))}: a 4-D "
        "array may be [L, H, Tq, Tk] or a capture's [B, H, Tq, Tk] (its "
        "examples shown as layers), so it is not read; pass one layer's "
        "[H, Tq, Tk] or a list of them, one per layer: "
        "[acts[f'blocks.{l}.attn.pattern'][b] for l in range(L)], or "
        "list(w) of an [L, H, Tq, Tk] array w")
  w = _finite(pattern, "heads", "pattern", _PATTERN, inf_hint=_SCORES_HINT)
  if w.ndim != 3:
    raise ValueError(f"show.heads: `pattern` must be {_PATTERN}, got shape "
                     f"{list(w.shape)}")
  return w[None]


def _window(window, t: int, side: int, fn: str) -> tuple[int, int]:
  """(start, stop) of the positions kept: `window` if given (clipped to
  `side` positions), else the last `side`."""
  if window is None:
    return max(0, t - side), t
  start, stop = window
  if not 0 <= start < stop <= t:
    raise ValueError(f"show.{fn}: `window`={tuple(window)} must satisfy "
                     f"0 <= start < stop <= {t}")
  return start, min(stop, start + side)


# --------------------------------------------------------------- views


def _score_table(scores, num_layers: int, num_heads: int) -> dict:
  """The table of `scores` (name -> `[L, H]`), columns in the given order;
  the explorer's names keep its headers and digits."""
  known = {k: (lab, d, h) for k, lab, d, h in explorer.SCORE_COLUMNS}
  cols, values = [], []
  for name, v in (scores or {}).items():
    v = _finite(v, "heads", f"scores[{name!r}]", "[L, H]")
    if v.shape != (num_layers, num_heads):
      raise ValueError(f"show.heads: `scores[{name!r}]` has shape "
                       f"{list(v.shape)}; expected [L, H] = "
                       f"{[num_layers, num_heads]}, as `pattern`")
    label, digits, help_ = known.get(name, (name, 3, name))
    cols.append(dict(key=name, label=label, digits=digits, help=help_))
    values.append(v)
  rows = explorer_page.score_rows(values, num_layers, num_heads)
  return {"columns": cols, "rows": rows, "floors": [],
          "hint": "Click a column to sort (again to flip), a row to see "
                  "its head."}


def heads(pattern, tokens, *, key_tokens=None, scores=None,
          title: str = "Attention heads", causal: bool | None = None,
          window=None, max_tokens: int = 512,
          max_cells: int = MAX_CELLS) -> View:
  """The layer x head grid, one head's heatmap, where each head sends a
  query, and (given `scores`) a sortable table.

  One example's weights come as one layer's `[H, Tq, Tk]`, as
  circuitsvis's `attention_heads` takes them, or as a list of those, one
  per layer in order: `[acts[f"blocks.{l}.attn.pattern"][0] for l in
  range(L)]` (TransformerLens: `[cache["pattern", l][0] for l in ...]`).
  A 4-D array is refused rather than read: a capture is `[B, H, Tq, Tk]`
  and a stack of layers `[L, H, Tq, Tk]`, and reading one as the other
  shows the batch's examples as layers without any error. `list(w)` of an
  `[L, H, Tq, Tk]` array says which it is.

  Args:
    pattern: `[H, Tq, Tk]` (one layer), or a list or tuple whose entry l
      is layer l's `[H, Tq, Tk]`; the grid names its rows L0, L1, ... in
      that order.
    tokens: `[Tq]` labels of the queries (strings or ids).
    key_tokens: `[Tk]` labels of the keys; default `tokens` (Tq == Tk).
    scores: optional name -> `[L, H]` per-head numbers for the table.
    causal: dash the keys after each query; default: whether every weight
      above the diagonal is 0.
    window: `(start, stop)` query positions to show when the whole
      pattern holds more than `max_cells` weights (default: the last
      ones); self-attention shows the same key positions.
    max_tokens, max_cells: the most positions per side (a heatmap of 512
      rows is already 4000 pixels tall) and weights in the page.

  Raises ValueError naming the argument: a 4-D array (saying what to pass
  instead), an array not 3-D, a list entry not 3-D or shaped unlike the
  first, labels that do not match its sides, an empty sequence, a
  non-finite weight (with a hint where it is the masked scores' -inf).
  """
  w = _layers(pattern)                                      # [L, H, Tq, Tk]
  num_layers, num_heads, tq, tk = w.shape
  q_labels = _labels(tokens, "heads", "tokens")
  if len(q_labels) != tq:
    raise ValueError(f"show.heads: `tokens` has {len(q_labels)} labels but "
                     f"`pattern` {list(w.shape)} has Tq={tq} queries")
  if key_tokens is None:
    if tk != tq:
      raise ValueError(f"show.heads: `pattern` {list(w.shape)} has Tq={tq} "
                       f"queries and Tk={tk} keys; pass `key_tokens` "
                       "(the keys' labels)")
    k_labels = q_labels
  else:
    k_labels = _labels(key_tokens, "heads", "key_tokens")
    if len(k_labels) != tk:
      raise ValueError(f"show.heads: `key_tokens` has {len(k_labels)} labels "
                       f"but `pattern` {list(w.shape)} has Tk={tk} keys")
  if causal is None:
    causal = bool(tq == tk and not np.triu(w, 1).any())
  table = _score_table(scores, num_layers, num_heads)
  # The largest square window of positions that fits the budget.
  side = max(1, min(max_tokens,
                    math.isqrt(max_cells // (num_layers * num_heads))))
  q0, q1 = _window(window, tq, side, "heads")
  if tq == tk and key_tokens is None:
    k0, k1 = q0, q1
  else:
    k0, k1 = max(0, tk - side), tk
  note = ""
  if (q0, q1, k0, k1) != (0, tq, 0, tk):
    note = (f"Showing queries {q0}\u2013{q1 - 1} of {tq} and keys "
            f"{k0}\u2013{k1 - 1} of {tk}: the whole pattern would hold "
            f"{num_layers * num_heads * tq * tk:,} weights (the page holds "
            f"at most {max_tokens} positions a side and {max_cells:,} "
            "weights). Pass window=(start, stop) to move the "
            "window. A row's weights outside it are not shown, so rows "
            "need not sum to 1.")
  kind = {"key": "self", "title": title, "causal": causal,
          "num_layers": num_layers, "num_heads": num_heads,
          "tq": q1 - q0, "tk": k1 - k0, "q0": q0, "k0": k0, "note": note,
          "query_labels": q_labels[q0:q1], "key_labels": k_labels[k0:k1],
          "weights": explorer.b64_float32(w[:, :, q0:q1, k0:k1]),
          "table": table}
  info = [["shape [L, H, Tq, Tk]", str(list(w.shape))]]
  return _view("heads", title, {"kinds": [kind], "info": info})


def tokens(tokens, values, *, name: str = "Values per token",  # pylint: disable=redefined-outer-name
           title: str | None = None) -> View:
  """`tokens [T]` (labels or ids) shaded by `values [T]` (loss, log-prob,
  attribution, ...); the value under the pointer to 3 decimals.

  Non-negative values are shaded from 0 to their maximum; values with
  either sign on a red (below 0) to blue scale centred on 0.
  """
  labels = _labels(tokens, "tokens", "tokens")
  v = _finite(values, "tokens", "values", "[T], one per token")
  if v.ndim != 1 or v.shape[0] != len(labels):
    raise ValueError(f"show.tokens: `values` has shape {list(v.shape)}; "
                     f"expected [T] = [{len(labels)}], one per token of "
                     "`tokens`")
  payload = {"kinds": [], "info": [],
             "token_values": {"name": name, "labels": labels,
                              "values": explorer.b64_float32(v)}}
  return _view("tokens", title or name, payload)


def heads_bar(values, *, name: str = "Values per head",
              title: str | None = None) -> View:
  """`values [L, H]` (or `[H]`, one layer) as one bar per head, rows
  being layers: direct logit attribution, patching or ablation effects.
  Heads are named `L0H3` (layer 0, head 3), as the API counts them; the
  page's `names` hold them in the order of `values`."""
  v = _per_layer(_finite(values, "heads_bar", "values", "[L, H] or [H]"),
                 2, "heads_bar", "values", "[L, H] or [H]")
  num_layers, num_heads = v.shape
  names = [explorer_page.head_name(l, h)
           for l in range(num_layers) for h in range(num_heads)]
  payload = {"kinds": [], "info": [],
             "head_values": {"name": name, "num_layers": num_layers,
                             "num_heads": num_heads, "names": names,
                             "values": explorer.b64_float32(v)}}
  return _view("heads_bar", title or name, payload)


def sae_features(features, *, layer: int | None = None,
                 head_features=None, title: str = "SAE features") -> View:
  """An SAE's features, as the explorer's features panel shows them: the
  feature list; for the chosen one its decoder share by head and its top
  contexts, each token shaded by the feature's activation; for the chosen
  context the DFA of its top token by source token and by head.

  `features`: the feature dicts `mha_jax/sae/view.py` documents (as
  `experiments/sae/view.py` builds them); `layer`: the layer whose z the
  SAE reads, which every head name must then belong to (`L{layer}H{h}`);
  `head_features`: `{head name: [(feature id, decoder share)]}`, the
  features each head writes most (as `explorer.write_explorer`'s
  `sae_head_features`), listed per head above the features, each a
  button that opens its feature.
  Raises ValueError naming the entry at fault (`features[2]['contexts']
  [0]['acts'] has 5 values for 6 tokens`).
  """
  panel = explorer_sae.sae_panel(features, layer=layer,
                                  fn="show.sae_features", arg="features",
                                  layer_arg="layer",
                                  head_features=head_features,
                                  head_arg="head_features")
  # The panel's own heading names the features: no title above it.
  return _view("sae_features", title,
               {"kinds": [], "info": [], "sae": panel,
                "hide_title": title == "SAE features"})


def _view(kind: str, title: str, payload: dict) -> View:
  payload["title"] = title
  # A page of one section named as the view needs no title above it.
  name = payload.get("token_values", payload.get("head_values", {})).get(
      "name")
  payload["hide_title"] = payload.get("hide_title", False) or name == title
  return View(explorer.page_html(payload, title=title), kind, title)
