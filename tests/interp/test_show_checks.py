"""What the notebook views draw is named and shaped as given, checked in
Python, without a browser.

The head names a reader sees in the score table and the bars travel in
the page's JSON, so a name off by one, or layers and heads swapped, fails
here on a non-square grid (L=2, H=3) wherever Chromium is missing. The
expected names and values are written out by hand. Every array argument's
rank is checked, with the whole message matched.
"""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest

from mha_jax.interp import explorer_page
from mha_jax.interp import show

# Head (l, h) of the L=2, H=3 grid scores 10 * l + h.
SCORES = np.asarray([[0.0, 1.0, 2.0], [10.0, 11.0, 12.0]])  # [L, H]
# (name, layer, head, score) in the page's order: layer-major.
BY_HAND = [("L0H0", 0, 0, 0.0), ("L0H1", 0, 1, 1.0), ("L0H2", 0, 2, 2.0),
           ("L1H0", 1, 0, 10.0), ("L1H1", 1, 1, 11.0), ("L1H2", 1, 2, 12.0)]


def page_data(page: str) -> dict:
  """The JSON the page's script reads."""
  found = re.search(r'<script type="application/json" id="data">(.*?)'
                    r"</script>", page, re.S)
  return json.loads(found.group(1))


def floats(b64: str) -> np.ndarray:
  return np.frombuffer(base64.b64decode(b64), "<f4")


def _uniform(heads: int, t: int) -> np.ndarray:
  """`[H, T, T]`: every query spreads its weight evenly over all keys."""
  return np.full((heads, t, t), 1.0 / t, np.float32)


def _rows(table: dict) -> list[tuple]:
  return [(r["name"], r["layer"], r["head"], *r["values"])
          for r in table["rows"]]


def test_score_table_names_each_head_by_its_layer_and_head():
  layers = [_uniform(3, 4), _uniform(3, 4)]  # L=2 x [H=3, T, T]
  (kind,) = page_data(show.heads(layers, list("abcd"),
                                 scores={"s": SCORES}).page)["kinds"]
  assert (kind["num_layers"], kind["num_heads"]) == (2, 3)
  assert _rows(kind["table"]) == BY_HAND


def test_explorer_table_names_each_head_by_its_layer_and_head():
  """The standalone explorer's table, built by `page_json`, likewise."""
  data = {"kinds": [{"key": "self", "title": "self-attention",
                     "causal": False,
                     "weights": np.stack([_uniform(3, 4)] * 2),
                     "query_labels": list("abcd"),
                     "key_labels": list("abcd"),
                     "scores": {"induction": SCORES}, "floors": {}}],
          "example": 0, "num_examples": 1}
  (kind,) = explorer_page.page_json(data)["kinds"]
  assert _rows(kind["table"]) == BY_HAND


def test_heads_bar_names_each_value_by_its_layer_and_head():
  hv = page_data(show.heads_bar(SCORES).page)["head_values"]
  assert (hv["num_layers"], hv["num_heads"]) == (2, 3)
  assert list(zip(hv["names"], floats(hv["values"]))) == [
      (name, score) for name, _, _, score in BY_HAND]
  one = page_data(show.heads_bar(SCORES[1]).page)["head_values"]
  assert list(zip(one["names"], floats(one["values"]))) == [
      ("L0H0", 10.0), ("L0H1", 11.0), ("L0H2", 12.0)]


def test_a_list_of_layers_keeps_their_order():
  """Layer l of the page is the list's entry l, whatever the sequence."""
  first = np.zeros((3, 2, 2), np.float32)
  first[..., 0] = 1.0  # every query on key 0
  second = np.zeros((3, 2, 2), np.float32)
  second[..., 1] = 1.0  # every query on key 1
  for layers in ([first, second], (first, second)):
    (kind,) = page_data(show.heads(layers, ["a", "b"],
                                   key_tokens=["x", "y"]).page)["kinds"]
    w = floats(kind["weights"]).reshape(2, 3, 2, 2)
    assert (w[0, :, :, 0] == 1).all() and (w[1, :, :, 1] == 1).all()


P = _uniform(2, 3)                                           # [H, T, T]
FOUR_D = ("show.heads: `pattern` has shape {}: a 4-D array may be "
          "[L, H, Tq, Tk] or a capture's [B, H, Tq, Tk] (its examples shown "
          "as layers), so it is not read; pass one layer's [H, Tq, Tk] or a "
          "list of them, one per layer: "
          "[acts[f'blocks.{{l}}.attn.pattern'][b] for l in range(L)], or "
          "list(w) of an [L, H, Tq, Tk] array w")
RANK = ("show.heads: `pattern` must be one layer's [H, Tq, Tk], or a list of "
        "them, one per layer, got shape {}")


@pytest.mark.parametrize("call, message", [
    # A capture [B, H, T, T] would be read as layers: refused, B=1 as well.
    (lambda: show.heads(np.stack([P, P]), list("abc")),
     FOUR_D.format("[2, 2, 3, 3]")),
    (lambda: show.heads(P[None], list("abc")), FOUR_D.format("[1, 2, 3, 3]")),
    (lambda: show.heads(P[0], list("abc")), RANK.format("[3, 3]")),
    (lambda: show.heads(P[None, None], list("abc")),
     RANK.format("[1, 1, 2, 3, 3]")),
    (lambda: show.heads([P[None], P[None]], list("abc")),
     "show.heads: `pattern[0]` must be layer 0's [H, Tq, Tk] (a list holds "
     "one layer per entry), got shape [1, 2, 3, 3]; a capture is "
     "[B, H, Tq, Tk]: index one example, acts[site][b]"),
    (lambda: show.heads([P, P[0]], list("abc")),
     "show.heads: `pattern[1]` must be layer 1's [H, Tq, Tk] (a list holds "
     "one layer per entry), got shape [3, 3]"),
    (lambda: show.heads([P, P[:1]], list("abc")),
     "show.heads: `pattern[1]` has shape [1, 3, 3] but `pattern[0]` "
     "[2, 3, 3]; every layer must be [H, Tq, Tk] of the same example"),
    (lambda: show.heads([], list("abc")),
     "show.heads: `pattern` is an empty list; expected one [H, Tq, Tk] per "
     "layer"),
    # Scores [H, L] for a [L=1, H=2] pattern: the swapped axes are named.
    (lambda: show.heads(P, list("abc"), scores={"s": np.ones((2, 1))}),
     "show.heads: `scores['s']` has shape [2, 1]; expected [L, H] = [1, 2], "
     "as `pattern`"),
    (lambda: show.heads(P, list("abc"), scores={"s": np.ones((1, 1, 2))}),
     "show.heads: `scores['s']` has shape [1, 1, 2]; expected [L, H] = "
     "[1, 2], as `pattern`"),
    (lambda: show.tokens(list("abc"), np.ones((1, 3))),
     "show.tokens: `values` has shape [1, 3]; expected [T] = [3], one per "
     "token of `tokens`"),
    (lambda: show.tokens(["a"], 1.0),
     "show.tokens: `values` has shape []; expected [T] = [1], one per token "
     "of `tokens`"),
    (lambda: show.heads_bar(np.ones((1, 2, 3))),
     "show.heads_bar: `values` must be [L, H] or [H], got shape [1, 2, 3]"),
    (lambda: show.heads_bar(1.0),
     "show.heads_bar: `values` must be [L, H] or [H], got shape []"),
], ids=["capture-B2", "capture-B1", "2-D", "5-D", "list-of-captures",
        "list-entry-2-D", "list-entries-differ", "empty-list",
        "scores-swapped", "scores-3-D", "tokens-2-D", "tokens-0-D",
        "heads_bar-3-D", "heads_bar-0-D"])
def test_rank_errors_say_what_came_and_what_to_pass(call, message):
  with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
    call()
