"""An offline page of SAE features: top contexts with per-token
activation, and each feature's attribution to heads and source tokens.

`feature_html(features)` returns one self-contained HTML string (inline
CSS, no script, nothing fetched), so it opens from disk, in a notebook
(`IPython.display.HTML(feature_html(...))`) or as a file
(`write_page(path, features)`). The head explorer shows the same feature
dicts in its features panel, linked to its heads
(`explorer.write_explorer(..., sae_features=, sae_layer=)`), and a
notebook inline with `mha_jax.show.sae_features(features, layer=)`; that
panel checks every field below (interp/explorer_sae.py `sae_panel`),
so this docstring is the format's one description.

Each feature is a dict:
  "id": int, "title": str (optional: a line under the id),
  "heads": [(head name, decoder share)], head names `hooks.head_name`'s
     (L1H0: layer 1, head 0), the explorer's,
  "contexts": [{"tokens": [str], "acts": [float], "at": int (the
     position shown), "source": [float] (DFA of that position's
     pre-activation by source token, summed over heads), "by_head":
     [(head name, float)] (the same DFA by head, summed over sources)}].

Beside the list, the explorer (`sae_head_features=`) and the notebook view
(`head_features=`) take the features each head writes most: `{head name:
[(feature id, decoder share)]}`, largest share first
(`attribution.head_top_features`), every id one of the list's, so that
each opens.
"""

from __future__ import annotations

import html
import pathlib

_CSS = """
body { font-family: sans-serif; margin: 1.5em; max-width: 70em; }
.feature { border-top: 1px solid #999; padding: .5em 0 1em; }
.ctx { font-family: monospace; margin: .3em 0; line-height: 1.9; }
.ctx span { padding: 1px 2px; border-radius: 2px; white-space: pre; }
.at { outline: 2px solid #000; }
.bar { display: inline-block; height: .8em; background: #4a7; }
.neg { background: #c55; }
table { border-collapse: collapse; font-size: 90%; }
td { padding: 0 .5em; }
.label { color: #555; font-size: 85%; }
"""


def _shade(value: float, top: float, rgb=(255, 140, 0)) -> str:
  a = 0.0 if top <= 0 else max(0.0, min(1.0, value / top))
  return f"background: rgba({rgb[0]}, {rgb[1]}, {rgb[2]}, {a:.2f})"


def _tokens(tokens, values, top, at=None, rgb=(255, 140, 0)) -> str:
  out = []
  for i, (t, v) in enumerate(zip(tokens, values)):
    cls = ' class="at"' if i == at else ""
    out.append(f'<span{cls} style="{_shade(v, top, rgb)}" '
               f'title="{v:.3g}">{html.escape(t) or "&nbsp;"}</span>')
  return "".join(out)


def _bars(rows) -> str:
  top = max([abs(v) for _, v in rows] + [1e-12])
  cells = []
  for name, v in rows:
    width = 12 * abs(v) / top
    neg = " neg" if v < 0 else ""
    cells.append(f"<tr><td>{html.escape(name)}</td><td>{v:.3g}</td><td>"
                 f'<span class="bar{neg}" style="width: {width:.2f}em">'
                 "</span></td></tr>")
  return "<table>" + "".join(cells) + "</table>"


def _context(ctx) -> str:
  acts, source = ctx["acts"], ctx["source"]
  top = max(acts + [1e-12])
  src_top = max([abs(v) for v in source] + [1e-12])
  return (
      '<div class="ctx">' + _tokens(ctx["tokens"], acts, top, ctx["at"])
      + "</div>"
      + '<div class="label">DFA of the outlined token by source token '
      "(green):</div>"
      + '<div class="ctx">' + _tokens(ctx["tokens"], source, src_top,
                                      rgb=(60, 170, 110)) + "</div>"
      + '<div class="label">and by head:</div>' + _bars(ctx["by_head"]))


def _feature(f) -> str:
  ctxs = "".join(_context(c) for c in f["contexts"]) or "<p>never fires</p>"
  return (f'<div class="feature"><h2>feature {int(f["id"])}</h2>'
          f'<p>{html.escape(f.get("title", ""))}</p>'
          '<div class="label">decoder share by head:</div>'
          + _bars(f["heads"]) + ctxs + "</div>")


def feature_html(features, *, title: str = "SAE features") -> str:
  """The page for `features` (see the module docstring), as a string."""
  for f in features:
    for key in ("id", "heads", "contexts"):
      if key not in f:
        raise ValueError(f"feature_html: each feature needs {key!r}; got "
                         f"keys {sorted(f)}")
  body = "".join(_feature(f) for f in features)
  return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>"
          f"{html.escape(title)}</title><style>{_CSS}</style></head><body>"
          f"<h1>{html.escape(title)}</h1>"
          "<p>Orange: the feature's activation on each token (hover for the "
          "value); the outlined token is the context's largest.</p>"
          f"{body}</body></html>")


def write_page(path, features, *, title: str = "SAE features"
               ) -> pathlib.Path:
  """Write `feature_html(features)` to `path`; returns the path."""
  path = pathlib.Path(path)
  path.write_text(feature_html(features, title=title), encoding="utf-8")
  return path
