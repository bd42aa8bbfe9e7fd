"""The notebook views' pages hold the arrays they were given, exactly,
refuse bad input by naming the argument, and window long patterns.

What the pages show in a browser is checked on the tutorial notebook's own
outputs (tests/interp/test_tour.py)."""

from __future__ import annotations

import base64
import html
import json
import re

import jax.numpy as jnp
import numpy as np
import pytest

import mha_jax
from mha_jax.interp import show

HOSTILE = "</script><b>x"


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _causal_pattern(shape, seed=0):
  """Random `[..., T, T]` weights, 0 above the diagonal."""
  x = np.random.default_rng(seed).normal(size=shape)
  t = shape[-1]
  return _softmax(np.where(np.tril(np.ones((t, t), bool)), x, -np.inf))


def page_data(page: str) -> dict:
  """The JSON the page's script reads."""
  found = re.search(r'<script type="application/json" id="data">(.*?)'
                    r"</script>", page, re.S)
  return json.loads(found.group(1))


def floats(b64: str) -> np.ndarray:
  return np.frombuffer(base64.b64decode(b64), "<f4")


def test_heads_page_holds_the_pattern_labels_and_scores():
  w = _causal_pattern((2, 3, 5, 5)).astype(np.float32)
  labels = [HOSTILE, "a", "b", "c", "d"]
  dla = np.arange(6.0).reshape(2, 3)
  view = show.heads(list(w), labels,
                    scores={"dla": dla, "induction": dla / 10})
  (kind,) = page_data(view.page)["kinds"]
  np.testing.assert_array_equal(floats(kind["weights"]).reshape(w.shape), w)
  assert kind["query_labels"] == kind["key_labels"] == labels
  assert kind["causal"] and (kind["q0"], kind["k0"], kind["note"]) == (0, 0,
                                                                       "")
  table = kind["table"]
  assert [c["key"] for c in table["columns"]] == ["dla", "induction"]
  assert table["columns"][1]["label"] == "induction"  # the explorer's header
  assert [r["values"][0] for r in table["rows"]] == list(dla.ravel())
  # One layer [H, Tq, Tk] is a page of one layer.
  one = page_data(show.heads(w[1], labels).page)["kinds"][0]
  assert one["num_layers"] == 1 and one["table"]["columns"] == []
  np.testing.assert_array_equal(floats(one["weights"]), w[1].ravel())


def test_pages_embed_everything_and_never_a_raw_token():
  w = _causal_pattern((1, 2, 3, 3))
  views = [show.heads(w[0], [HOSTILE, "a", "b"]),
           show.tokens([HOSTILE, "a"], [0.5, -0.25]),
           show.heads_bar(np.ones((2, 2)), name=HOSTILE),
           show.sae_features(_sae_features(HOSTILE))]
  for view in views:
    # The only "</script>" sequences close the page's own two scripts.
    assert view.page.count("</script>") == 2, view.kind
    assert HOSTILE not in view.page
    # Nothing to fetch: no src or href but the empty inline icon.
    assert re.findall(r'(?:src|href)="([^"]*)"', view.page) == ["data:,"]
    inline = view._repr_html_()  # pylint: disable=protected-access
    srcdoc = re.search(r'srcdoc="([^"]*)"', inline).group(1)
    assert html.unescape(srcdoc) == view.page
    assert f'data-view="{view.kind}"' in inline


def _sae_features(token="a"):
  """One feature as mha_jax/sae/view.py documents it."""
  return [{"id": 5, "title": "t", "heads": [("L1H0", 0.5), ("L1H1", -0.5)],
           "contexts": [{"tokens": [token, "b"], "acts": [1.0, 3.0], "at": 1,
                         "source": [0.25, 0.0],
                         "by_head": [("L1H0", 0.75), ("L1H1", 0.0)]}]}]


def test_sae_features_page_holds_the_features():
  view = show.sae_features(_sae_features(), layer=1)
  assert view.kind == "sae_features"
  data = page_data(view.page)
  pairs = lambda rows: [{"name": n, "head": int(n[-1]), "value": v}
                        for n, v in rows]
  assert data["kinds"] == [] and data["sae"] == {"layer": 1, "features": [{
      "id": 5, "title": "t", "heads": pairs([("L1H0", 0.5), ("L1H1", -0.5)]),
      "contexts": [{"tokens": ["a", "b"], "acts": [1.0, 3.0], "at": 1,
                    "source": [0.25, 0.0],
                    "by_head": pairs([("L1H0", 0.75), ("L1H1", 0.0)])}]}]}
  # Without a layer, head names are shown as they are, linked to nothing.
  plain = page_data(show.sae_features(_sae_features()).page)["sae"]
  assert plain["layer"] is None
  assert [h["head"] for h in plain["features"][0]["heads"]] == [None, None]
  with pytest.raises(ValueError, match=r"show.sae_features: "
                     r"`features\[0\]\['heads'\]\[0\]` names head 'L1H0', "
                     r"which is not a head of layer `layer`=2"):
    show.sae_features(_sae_features(), layer=2)


def test_tokens_and_heads_bar_hold_their_values():
  v = np.asarray([0.25, -1.5, 3.0], np.float32)
  tv = page_data(show.tokens([1, 2, 3], v, name="loss").page)["token_values"]
  assert tv["labels"] == ["1", "2", "3"] and tv["name"] == "loss"
  np.testing.assert_array_equal(floats(tv["values"]), v)
  bars = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
  hv = page_data(show.heads_bar(bars).page)["head_values"]
  assert (hv["num_layers"], hv["num_heads"]) == (3, 4)
  np.testing.assert_array_equal(floats(hv["values"]), bars.ravel())
  assert mha_jax.show is show  # the name the issue and notebooks use


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16,
                                   jnp.float8_e4m3fn])
def test_low_precision_floats_are_shown_as_their_float32_cast(dtype):
  """Models run and capture in bfloat16; numpy does not count ml_dtypes'
  floats (bfloat16, float8_*) as numbers, so they need their own check."""
  w = jnp.asarray(_causal_pattern((2, 2, 3, 3)), dtype)
  v = jnp.asarray([0.25, -1.5, 3.0], dtype)
  bars = jnp.asarray(np.arange(6.0).reshape(2, 3) / 7, dtype)
  as32 = lambda x: np.asarray(x).astype(np.float32)
  kind = page_data(show.heads(list(w), list("abc"),
                              scores={"s": bars[:, :2]}).page)["kinds"][0]
  np.testing.assert_array_equal(floats(kind["weights"]), as32(w).ravel())
  assert [r["values"][0] for r in kind["table"]["rows"]] == list(
      as32(bars[:, :2]).ravel())
  tv = page_data(show.tokens(list("abc"), v).page)["token_values"]
  np.testing.assert_array_equal(floats(tv["values"]), as32(v))
  hv = page_data(show.heads_bar(bars).page)["head_values"]
  np.testing.assert_array_equal(floats(hv["values"]), as32(bars).ravel())


def test_long_pattern_is_windowed_and_says_so():
  t = 40
  w = _causal_pattern((1, 2, t, t)).astype(np.float32)
  labels = [f"t{i}" for i in range(t)]
  kind = page_data(show.heads(w[0], labels, max_tokens=16).page)["kinds"][0]
  assert (kind["q0"], kind["k0"], kind["tq"], kind["tk"]) == (24, 24, 16, 16)
  np.testing.assert_array_equal(
      floats(kind["weights"]).reshape(1, 2, 16, 16), w[:, :, 24:, 24:])
  assert kind["query_labels"] == labels[24:]
  assert "Showing queries 24\u201339 of 40" in kind["note"]
  # A chosen window; the weight budget shrinks it too (2 heads x 10 x 10).
  kind = page_data(show.heads(w[0], labels, window=(5, 30),
                              max_cells=200).page)["kinds"][0]
  assert (kind["q0"], kind["tq"], kind["k0"], kind["tk"]) == (5, 10, 5, 10)
  np.testing.assert_array_equal(
      floats(kind["weights"]).reshape(1, 2, 10, 10), w[:, :, 5:15, 5:15])


def test_cross_attention_pattern_takes_key_labels():
  w = _softmax(np.random.default_rng(2).normal(size=(2, 3, 4)))
  kind = page_data(show.heads(w, list("abc"), key_tokens=list("wxyz")
                              ).page)["kinds"][0]
  assert (kind["tq"], kind["tk"], kind["causal"]) == (3, 4, False)
  assert kind["key_labels"] == list("wxyz")


W4 = _causal_pattern((2, 2, 3, 3))                   # [L, H, T, T]
W = list(W4)                                        # L x [H, T, T]
NAN = W4.copy()
NAN[1, 0, 2, 1] = np.nan


@pytest.mark.parametrize("call, message", [
    (lambda: show.heads(W, ["a", "b"]),
     r"`tokens` has 2 labels but `pattern` \[2, 2, 3, 3\] has Tq=3"),
    (lambda: show.heads(list(NAN), list("abc")),
     r"`pattern\[1\]` has 1 non-finite values \(first at \[0, 2, 1\]: "
     r"nan\)"),
    (lambda: show.heads(np.zeros((2, 0, 0)), []), r"`pattern` is empty"),
    (lambda: show.heads(W, []), r"`tokens` is empty"),
    (lambda: show.heads(list(W4[..., :2]), list("abc")),
     r"Tk=2 keys; pass `key_tokens`"),
    (lambda: show.heads(list(W4[..., :2]), list("abc"),
                        key_tokens=list("xyz")),
     r"`key_tokens` has 3 labels but `pattern` \[2, 2, 3, 2\] has Tk=2"),
    (lambda: show.heads(W, list("abc"), scores={"dla": np.ones(4)}),
     r"`scores\['dla'\]` has shape \[4\]; expected \[L, H\] = \[2, 2\]"),
    (lambda: show.heads(W, list("abc"), window=(2, 9)),
     r"`window`=\(2, 9\) must satisfy 0 <= start < stop <= 3"),
    (lambda: show.heads(W, "abc"), r"`tokens` must be a sequence of token "
     r"labels, one per position, got one string"),
    (lambda: show.tokens(list("abc"), [1.0, 2.0]),
     r"`values` has shape \[2\]; expected \[T\] = \[3\]"),
    (lambda: show.tokens(list("ab"), [1.0, np.inf]),
     r"`values` has 1 non-finite values \(first at \[1\]: inf\)"),
    (lambda: show.tokens([], []), r"`tokens` is empty"),
    (lambda: show.tokens([["a", "b"]], [1.0, 2.0]),
     r"`tokens` must be \[T\], one label per position, got shape \[1, 2\]"),
    (lambda: show.heads_bar(np.ones((2, 2, 2))),
     r"`values` must be \[L, H\] or \[H\], got shape \[2, 2, 2\]"),
    (lambda: show.heads_bar(np.zeros((3, 0))), r"`values` is empty"),
    (lambda: show.heads_bar(["a"]),
     r"`values` must be a real numeric array \[L, H\] or \[H\], got dtype "
     r"<U1"),
    (lambda: show.tokens(list("ab"), np.ones(2, np.complex64)),
     r"`values` must be a real numeric array .*, got dtype complex64"),
])
def test_bad_input_names_the_argument(call, message):
  with pytest.raises((ValueError, TypeError), match=message):
    call()


SCORES_HINT = "`blocks.{l}.attn.scores` capture is -inf at masked keys"
NEG_INF = np.where(np.isnan(NAN), -np.inf, NAN)  # -inf at [1, 0, 2, 1]


@pytest.mark.parametrize("call, name, hint", [
    # Pre-softmax scores passed as the pattern: the hint says what to pass.
    (lambda: show.heads(list(NEG_INF), list("abc")),
     "show.heads: `pattern[1]`", True),
    (lambda: show.heads(NEG_INF[1], list("abc")), "show.heads: `pattern`",
     True),
    (lambda: show.heads(list(NAN), list("abc")), "show.heads: `pattern[1]`",
     False),
    (lambda: show.heads(W, list("abc"), scores={"dla": NEG_INF[:, :, 2, 1]}),
     "show.heads: `scores['dla']`", False),
    (lambda: show.tokens(list("abc"), NEG_INF[1, 0, 2]),
     "show.tokens: `values`", False),
    (lambda: show.heads_bar(NEG_INF[:, :, 2, 1]), "show.heads_bar: `values`",
     False),
], ids=["pattern-inf", "one-layer-inf", "pattern-nan", "scores-table",
        "tokens", "heads_bar"])
def test_non_finite_error_names_the_argument_and_hints_only_where_it_applies(
    call, name, hint):
  """-inf in `pattern` is most likely the masked scores capture; the same
  hint on per-token or per-head values, or on a NaN, would mislead."""
  with pytest.raises(ValueError) as err:
    call()
  message = str(err.value)
  assert message.startswith(f"{name} has 1 non-finite values"), message
  assert (SCORES_HINT in message) == hint, message


def test_long_inputs_in_a_real_browser(browser, tmp_path):
  """3000 tokens: the heads page holds a window and reads positions in the
  whole sequence under the pointer; the token page holds every value."""
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.support.ui import WebDriverWait  # pylint: disable=g-import-not-at-top
  import chromium  # pylint: disable=g-import-not-at-top
  t, side = 3000, 48
  rng = np.random.default_rng(3)
  w = _softmax(rng.normal(size=(1, 2, t, t)).astype(np.float32))
  labels = [f"t{i}" for i in range(t)]
  css = lambda sel: browser.find_element(By.CSS_SELECTOR, sel)
  ready = lambda d: d.find_element(By.TAG_NAME, "body").get_attribute(
      "data-ready") == "true"
  path = show.heads(w[0], labels, window=(1000, 2000),
                    max_tokens=side).save(
      tmp_path / "heads.html")
  browser.get(path.resolve().as_uri())
  WebDriverWait(browser, chromium.WAIT_S).until(ready)
  assert css("#window-note").text.startswith(
      "Showing queries 1000\u20131047 of 3000 and keys 1000\u20131047")
  # Cell (40, 7) of the window: positions 1040 and 1007.
  chromium.point_at_cell(browser, css("#heatmap"), 40, 7, side, side)
  assert (css("#readout").get_attribute("data-query"),
          css("#readout").get_attribute("data-key")) == ("1040", "1007")
  assert css("#readout-value").text == chromium.fixed3(w[0, 0, 1040, 1007])
  assert not chromium.console_errors(browser)
  values = rng.normal(size=t).astype(np.float32)
  path = show.tokens(labels, values).save(tmp_path / "tokens.html")
  browser.get(path.resolve().as_uri())
  WebDriverWait(browser, chromium.WAIT_S).until(ready)
  toks = browser.find_elements(By.CSS_SELECTOR, ".tv")
  assert len(toks) == t
  assert toks[2999].get_attribute("data-value") == chromium.fixed3(
      values[2999])
  assert not chromium.console_errors(browser)


def test_score_table_in_a_real_browser(browser, tmp_path):
  """Every cell of the heads page's table is its array's value to 3
  decimals, in the row of its head; a click on a header puts the largest
  first."""
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.support.ui import WebDriverWait  # pylint: disable=g-import-not-at-top
  import chromium  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(5)
  css = lambda sel: browser.find_element(By.CSS_SELECTOR, sel)
  dla = rng.normal(size=(2, 3)).astype(np.float32)
  patching = rng.uniform(size=(2, 3)).astype(np.float32)
  path = show.heads(list(_causal_pattern((2, 3, 4, 4))), list("abcd"),
                    scores={"dla": dla, "patching": patching}).save(
                        tmp_path / "scores.html")
  browser.get(path.resolve().as_uri())
  WebDriverWait(browser, chromium.WAIT_S).until(
      lambda d: d.find_element(By.TAG_NAME, "body").get_attribute(
          "data-ready") == "true")
  assert [e.get_attribute("data-col") for e in browser.find_elements(
      By.CSS_SELECTOR, "#scores thead th[data-col]")] == ["dla", "patching"]
  expected = [[f"L{l}H{h}", chromium.fixed3(dla[l, h]),
               chromium.fixed3(patching[l, h])]
              for l in range(2) for h in range(3)]
  cells = lambda: [
      [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
      for tr in browser.find_elements(By.CSS_SELECTOR, "#scores tbody tr")]
  assert cells() == expected
  css("#scores th[data-col='patching'] button").click()
  order = np.argsort(-patching.ravel(), kind="stable")
  assert cells() == [expected[i] for i in order]
  assert not chromium.console_errors(browser)
