"""The explorer's SAE features panel: the page an SAE run writes beside its
report (experiments/sae/view.py's `write_explorer`), its data and what a
reader sees in a real browser, against a hand-built feature dict whose
shading, bar lengths and numbers are worked out here by hand.

The model is the SAE smoke config's induction model at initialisation:
the panel shows the features it is given, so no training is needed.
"""

from __future__ import annotations

import json
import pathlib
import re

from flax import nnx
import numpy as np
import pytest

from configs import sae as sae_config
from experiments.sae import view as sae_view
from mha_jax.interp import explorer
from mha_jax.interp import show
from mha_jax.sae import attribution
from mha_jax.training import config as config_lib

import chromium

HOSTILE = "</script><b>x"
# Two features of an SAE on layer 1 of a 2 x 2-head model. Feature 7's
# activations peak at 4.0 (context 1), the scale of both its contexts.
FEATURES = [
    {"id": 7, "title": "induction feature",
     "heads": [("L1H0", 0.75), ("L1H1", 0.25)],
     "contexts": [
         {"tokens": ["a", HOSTILE, "c", "d"], "acts": [0.0, 2.0, 1.0, 0.5],
          "at": 1, "source": [0.5, -0.25, 0.0, 0.125],
          "by_head": [("L1H0", 0.3), ("L1H1", -0.6)]},
         {"tokens": [" x", "y"], "acts": [4.0, 1.0], "at": 0,
          "source": [1.0, -2.0], "by_head": [("L1H0", 1.5), ("L1H1", 0.5)]}]},
    {"id": 3, "title": "", "heads": [("L1H0", -0.2), ("L1H1", 0.1)],
     "contexts": []},
]


# The features each head writes most, largest share first. L1H1 lists
# feature 3 (index 1 of FEATURES) before 7 (index 0), so a button that
# opened its position in the head's list would open the wrong one. The
# page shows the shares it is given (FEATURES' bars are their own).
HEAD_FEATURES = {"L1H1": [(3, 0.625), (7, 0.25)], "L1H0": [(7, 0.75)]}


def _pairs(rows):
  return [{"name": n, "head": int(n[-1]), "value": v} for n, v in rows]


# What the page's JSON must hold: the same dicts, pairs named.
PANEL = {"layer": 1, "features": [
    {"id": 7, "title": "induction feature",
     "heads": _pairs(FEATURES[0]["heads"]),
     "contexts": [dict(c, by_head=_pairs(c["by_head"]))
                  for c in FEATURES[0]["contexts"]]},
    {"id": 3, "title": "", "heads": _pairs(FEATURES[1]["heads"]),
     "contexts": []}],
    # By head; "feature" is the index in "features" a button opens.
    "head_features": [
        {"name": "L1H0", "head": 0, "features": [
            {"id": 7, "share": 0.75, "feature": 0}]},
        {"name": "L1H1", "head": 1, "features": [
            {"id": 3, "share": 0.625, "feature": 1},
            {"id": 7, "share": 0.25, "feature": 0}]}]}


def _data(page: str) -> dict:
  found = re.search(r'<script type="application/json" id="data">(.*?)'
                    r"</script>", page, re.S)
  return json.loads(found.group(1).replace("<\\/", "</"))


@pytest.fixture(scope="module")
def model():
  return config_lib.build_model(sae_config.get_config("smoke").model,
                                nnx.Rngs(params=0))


TOKENS = np.asarray([[3, 4, 5, 3, 4, 5], [6, 7, 3, 6, 7, 3]], np.int32)


@pytest.fixture(scope="module")
def page(model, tmp_path_factory):
  """The page `experiments.sae.view` writes, on a tiny model."""
  path = tmp_path_factory.mktemp("sae") / "explorer.html"
  return sae_view.write_explorer(
      path, model, TOKENS, lambda ids: [f"t{int(i)}" for i in ids], FEATURES,
      layer=1, full=True, title="SAE", info=[("run", "here")],
      head_features=HEAD_FEATURES)


def test_page_holds_the_features_and_the_heads_of_the_tokens(page):
  data = _data(page.read_text())
  assert data["sae"] == PANEL
  (kind,) = data["kinds"]
  assert kind["query_labels"] == ["t3", "t4", "t5", "t3", "t4", "t5"]
  assert (kind["num_layers"], kind["num_heads"]) == (2, 2)
  # `full`: the next-token loss's ablation column, and Treescope's panel.
  assert "ablation" in [c["key"] for c in kind["table"]["columns"]]
  assert '<div class="raw" data-kind="0">' in page.read_text()
  assert HOSTILE not in page.read_text()


def _data_of_shape(num_layers, num_heads):
  """`explore`'s data for a page with no numbers but its shape."""
  t = 3
  return {"kinds": [{"key": "self", "title": "self", "causal": True,
                     "weights": np.zeros((num_layers, num_heads, t, t)),
                     "query_labels": list("abc"), "key_labels": list("abc"),
                     "scores": {}, "floors": {}}],
          "example": 0, "num_examples": 1}


def test_render_adds_the_panel_and_without_features_adds_nothing():
  data = _data_of_shape(2, 2)
  assert "sae" not in _data(explorer.render(data, raw_arrays=False))
  page = explorer.render(data, raw_arrays=False, sae_features=FEATURES,
                         sae_layer=1, sae_head_features=HEAD_FEATURES)
  assert _data(page)["sae"] == PANEL
  # Without the heads' lists, the panel has none.
  page = explorer.render(data, raw_arrays=False, sae_features=FEATURES,
                         sae_layer=1)
  assert "head_features" not in _data(page)["sae"]
  # The heads are the page's: a 1-head model has no L1H1.
  with pytest.raises(ValueError, match=r"render: `sae_features\[0\]\['heads'"
                     r"\]\[1\]` names head 'L1H1', which is not a head of "
                     r"layer `sae_layer`=1: expected L1H0 to L1H0"):
    explorer.render(_data_of_shape(2, 1), sae_features=FEATURES, sae_layer=1)


def _with(path, value):
  """FEATURES with the entry at `path` (keys and indices) set to `value`
  (or removed, for `del`)."""
  features = json.loads(json.dumps(FEATURES))
  *parents, last = path
  box = features
  for key in parents:
    box = box[key]
  if value == "del":
    del box[last]
  else:
    box[last] = value
  return features


@pytest.mark.parametrize("features, layer, message", [
    (FEATURES, None, r"`sae_features` needs `sae_layer`, the layer whose z"),
    (None, 1, r"`sae_layer`=1 was given without `sae_features`"),
    (FEATURES, 2, r"`sae_layer` must be a layer of the model, an integer in "
     r"\[0, 2\), got 2"),
    (FEATURES[0], 1, r"`sae_features` must be a list of feature dicts, got "
     r"one dict"),
    (_with([1, "heads"], "del"), 1,
     r"`sae_features\[1\]`: each feature needs 'heads'"),
    (_with([0, "heads", 0, 0], "L0H0"), 1,
     r"`sae_features\[0\]\['heads'\]\[0\]` names head 'L0H0', which is not "
     r"a head of layer `sae_layer`=1: expected L1H0 to L1H1"),
    (_with([0, "contexts", 1, "acts"], [4.0]), 1,
     r"`sae_features\[0\]\['contexts'\]\[1\]\['acts'\]` has 1 values for 2 "
     r"tokens"),
    (_with([0, "contexts", 0, "at"], 4), 1,
     r"`sae_features\[0\]\['contexts'\]\[0\]\['at'\]` must be the position "
     r"of the context's top token, an integer in \[0, 4\), got 4"),
    (_with([0, "contexts", 0, "source", 2], float("nan")), 1,
     r"`sae_features\[0\]\['contexts'\]\[0\]\['source'\]\[2\]` must be a "
     r"finite number, got nan"),
    (_with([0, "contexts", 0, "tokens"], "abcd"), 1,
     r"`sae_features\[0\]\['contexts'\]\[0\]\['tokens'\]` must be a list of "
     r"token strings, got str"),
    (_with([0, "contexts", 0, "by_head"], "del"), 1,
     r"`sae_features\[0\]\['contexts'\]\[0\]`: each context needs tokens, "
     r"acts, at, source, by_head"),
], ids=["no-layer", "no-features", "layer-range", "one-dict", "no-heads",
        "other-layer", "acts-length", "at-range", "nan", "tokens-str",
        "no-by_head"])
def test_bad_features_are_refused_before_anything_is_measured(
    model, features, layer, message):
  batch = {"inputs": TOKENS}
  with pytest.raises(ValueError, match=r"^explore: " + message):
    explorer.explore(model, batch, sae_features=features, sae_layer=layer)


@pytest.mark.parametrize("tops, message", [
    ({"L0H1": [(7, 0.5)]},
     r"`sae_head_features\['L0H1'\]` names head 'L0H1', which is not a "
     r"head of layer `sae_layer`=1: expected L1H0 to L1H1"),
    ({"L1H0": [(7, 1.5)]},
     r"`sae_head_features\['L1H0'\]\[0\]\[1\]` must be a decoder share, "
     r"a number in \[0, 1\], got 1.5"),
    ({"L1H0": [(7.0, 0.5)]},
     r"`sae_head_features\['L1H0'\]\[0\]\[0\]` must be a feature's id, "
     r"an integer in \[0, \d+\), got 7.0"),
    ({"L1H0": [("7", 0.5)]},
     r"`sae_head_features\['L1H0'\]\[0\]\[0\]` must be a feature's id, "
     r"an integer in \[0, \d+\), got '7'"),
    ({"L1H0": [(9, 0.5)]},
     r"`sae_head_features\['L1H0'\]\[0\]\[0\]` is feature 9, which "
     r"`sae_features` does not hold: add its dict"),
    ({"L1H0": [(3, 0.25), (7, 0.75)]},
     r"`sae_head_features\['L1H0'\]` must list the features the head "
     r"writes most first \(shares not increasing\); got 0.25 then 0.75"),
    ({"L1H0": [7]},
     r"`sae_head_features\['L1H0'\]\[0\]` must be a \(feature id, "
     r"decoder share\) pair"),
    ([("L1H0", [(7, 0.5)])],
     r"`sae_head_features` must be a dict \{head name: \[\(feature id, "
     r"decoder share\)\]\}"),
], ids=["other-layer", "share-range", "id-float", "id-str", "id-absent",
        "ascending", "not-a-pair", "not-a-dict"])
def test_bad_head_features_are_refused(model, tops, message):
  with pytest.raises(ValueError, match=r"^explore: " + message):
    explorer.explore(model, {"inputs": TOKENS}, sae_features=FEATURES,
                     sae_layer=1, sae_head_features=tops)
  with pytest.raises(ValueError, match=r"^explore: `sae_head_features` was "
                     r"given without `sae_features`"):
    explorer.explore(model, {"inputs": TOKENS}, sae_head_features=tops)


# A decoder of 5 features over 2 heads of Dh = 3 columns: `[F, H * Dh]`.
W_DEC = np.array([
    [1, 0, 0, 0, 0, 0],  # 0: all in head 0
    [1, 1, 0, 1, 1, 0],  # 1: half in each
    [0, 0, 0, 0, 2, 0],  # 2: all in head 1
    [1, 0, 0, 1, 1, 1],  # 3: 1/4 in head 0, 3/4 in head 1
    [0, 0, 0, 5, 0, 0],  # 4: all in head 1, but dead
], np.float32)


def test_each_heads_top_features_by_hand():
  shares = attribution.head_shares(W_DEC, 2)
  tops = attribution.head_top_features(shares, live=[0, 1, 2, 3], k=2)
  # By hand: head 0 holds all of 0 and half of 1; head 1 all of 2 and
  # 3/4 of 3 (feature 4, dead, is not listed though it is all head 1's).
  want = [[(0, 1.0), (1, 0.5)], [(2, 1.0), (3, 0.75)]]
  # The same in NumPy, each head's block sliced out of the rows.
  dh = 3
  sq = np.stack([(W_DEC[:, h * dh:(h + 1) * dh] ** 2).sum(1)
                 for h in range(2)], 1)
  share = sq / sq.sum(1, keepdims=True)
  by_numpy = [sorted(((f, share[f, h]) for f in range(4)),
                     key=lambda p: -p[1])[:2] for h in range(2)]
  for got in (want, by_numpy):
    assert [[f for f, _ in h] for h in tops] == [[f for f, _ in h]
                                                 for h in got]
    np.testing.assert_allclose([[s for _, s in h] for h in tops],
                               [[s for _, s in h] for h in got], atol=1e-6)
  # Without `live`, the dead feature 4 ties feature 2: the lower first.
  assert [f for f, _ in attribution.head_top_features(shares, k=3)[1]] == [
      2, 4, 3]
  with pytest.raises(ValueError, match=r"`k` must be a positive integer, "
                     r"got 0"):
    attribution.head_top_features(shares, k=0)


def test_the_writer_gives_every_listed_feature_a_dict_once():
  # Feature 2 is listed by both heads, 7 is picked already.
  tops = {"L1H0": [(7, 0.9), (2, 0.5)], "L1H1": [(2, 0.8), (4, 0.1)]}
  assert sae_view.with_head_tops([(7, "induction feature")], tops) == [
      (7, "induction feature"), (2, "written most by L1H0, L1H1"),
      (4, "written most by L1H1")]


def _rgba(style: str) -> tuple[float, ...]:
  """(r, g, b, a) of a CSS colour as Chrome writes it."""
  nums = [float(x) for x in re.findall(r"[\d.]+", style)]
  return tuple(nums + [1.0] * (4 - len(nums)))


def _diverging(v: float, top: float) -> tuple[float, ...]:
  """The page's signed scale, by hand: white at 0 to blue (33, 102, 172)
  above and red (178, 24, 43) below, linear in |v| / top."""
  end = (33, 102, 172) if v >= 0 else (178, 24, 43)
  x = min(abs(v) / top, 1)
  return tuple(float(np.floor(255 + x * (c - 255) + 0.5)) for c in end) + (
      1.0,)


def _open(browser, path) -> str:
  """Open the page at `path` and wait until its script is done; its URL."""
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.support.ui import WebDriverWait  # pylint: disable=g-import-not-at-top
  url = pathlib.Path(path).resolve().as_uri()
  browser.get(url)
  WebDriverWait(browser, chromium.WAIT_S).until(
      lambda d: d.find_element(By.TAG_NAME, "body").get_attribute(
          "data-ready") == "true")
  return url


def test_features_panel_in_a_real_browser(browser, page):
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  url = _open(browser, page)
  css = lambda sel: browser.find_element(By.CSS_SELECTOR, sel)
  all_css = lambda sel: browser.find_elements(By.CSS_SELECTOR, sel)
  style = lambda e, prop: browser.execute_script(
      f"return arguments[0].style.{prop}", e)

  def bars(box):
    """(name, value text, bar width in %, drawn red) of each row of
    `box`."""
    return [(r.get_attribute("data-name"),
             r.find_element(By.CSS_SELECTOR, ".num").text,
             float(style(r.find_element(By.CSS_SELECTOR, ".fill"),
                         "width").rstrip("%")),
             "neg" in r.find_element(By.CSS_SELECTOR, ".fill").get_attribute(
                 "class"))
            for r in all_css(f"{box} .hrow")]

  def tokens(box):
    """(text, value, outlined) of each token in `box`, and its shade."""
    toks = all_css(f"{box} .tok")
    return ([(t.text, t.get_attribute("data-value"),
              "at" in t.get_attribute("class")) for t in toks],
            [_rgba(style(t, "backgroundColor")) for t in toks])

  assert css("#sae-heading").text == "SAE features of layer 1's z"
  # The first feature is chosen.
  items = all_css("#sae-list button")
  assert [b.text for b in items] == ["feature 7 induction feature",
                                     "feature 3"]
  assert [b.get_attribute("aria-pressed") for b in items] == ["true",
                                                              "false"]
  assert css("#sae-title").text == "Feature 7: induction feature"
  # Decoder share: bars at 0.75 and 0.25 of the largest.
  assert bars("#sae-heads") == [("L1H0", "0.750", 100.0, False),
                                ("L1H1", "0.250", 33.3, False)]
  # Top contexts shaded on one scale, the feature's largest activation 4.
  rows = all_css("#sae-contexts .ctx")
  assert len(rows) == 2
  texts, shades = tokens("#sae-contexts .ctx[data-context='0']")
  assert texts == [("a", "0.000", False), (HOSTILE, "2.000", True),
                   ("c", "1.000", False), ("d", "0.500", False)]
  assert [s[3] for s in shades] == [0, 0.5, 0.25, 0.125]
  assert all(s[:3] == (255, 140, 0) for s in shades)
  texts, shades = tokens("#sae-contexts .ctx[data-context='1']")
  assert texts == [(" x", "4.000", True), ("y", "1.000", False)]
  assert [s[3] for s in shades] == [1, 0.25]
  # Context 0 is chosen: its top token's DFA by source token, red below 0
  # and blue above on a scale of its largest |value| 0.5, and by head.
  assert [r.get_attribute("aria-pressed") for r in rows] == ["true", "false"]
  texts, shades = tokens("#sae-source")
  assert texts == [("a", "0.500", False), (HOSTILE, "-0.250", True),
                   ("c", "0.000", False), ("d", "0.125", False)]
  assert shades == [_diverging(v, 0.5) for v in (0.5, -0.25, 0.0, 0.125)]
  assert bars("#sae-dfa-heads") == [("L1H0", "0.300", 50.0, False),
                                    ("L1H1", "-0.600", 100.0, True)]
  # Choosing context 1 shows its attribution instead.
  rows[1].click()
  assert [r.get_attribute("aria-pressed") for r in rows] == ["false", "true"]
  texts, shades = tokens("#sae-source")
  assert texts == [(" x", "1.000", True), ("y", "-2.000", False)]
  assert shades == [_diverging(1.0, 2.0), _diverging(-2.0, 2.0)]
  assert bars("#sae-dfa-heads") == [("L1H0", "1.500", 100.0, False),
                                    ("L1H1", "0.500", 33.3, False)]

  # A head's name selects that head in the grid, the heatmap and the table.
  css("#sae-heads .hrow[data-name='L1H1'] button").click()
  assert css(".thumb[data-layer='1'][data-head='1']").get_attribute(
      "aria-pressed") == "true"
  assert css("#heatmap-title").text.startswith("Layer 1, head 1")
  assert css("#scores tbody tr.current").get_attribute("data-head") == "1"

  # Feature 3: never fires, a negative decoder share.
  items[1].click()
  assert [b.get_attribute("aria-pressed") for b in items] == ["false",
                                                              "true"]
  assert css("#sae-title").text == "Feature 3"
  assert bars("#sae-heads") == [("L1H0", "-0.200", 100.0, True),
                                ("L1H1", "0.100", 50.0, False)]
  assert not all_css("#sae-contexts .ctx") and not all_css("#sae-source .tok")
  assert "never fires" in css("#sae-contexts").text

  assert not chromium.console_errors(browser)
  assert [u for u in chromium.requests(browser)
          if u != url and not u.startswith("data:")] == []


def _buttons(browser, box):
  """(feature id, share text, pressed) of each feature button in `box`."""
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  return [(b.get_attribute("data-id"),
           b.find_element(By.CSS_SELECTOR, ".num").text,
           b.get_attribute("aria-pressed"))
          for b in browser.find_elements(By.CSS_SELECTOR, f"{box} button")]


def test_a_head_lists_the_features_it_writes_in_a_real_browser(browser,
                                                               page):
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  url = _open(browser, page)
  css = lambda sel: browser.find_element(By.CSS_SELECTOR, sel)
  # The page opens on L0H0, a head of another layer: a note, no list.
  assert css("#head-features-title").text == "SAE features L0H0 writes most"
  assert css("#head-features-note").text == (
      "The SAE reads layer 1's z; this head is in layer 0.")
  assert not _buttons(browser, "#head-features")
  # L1H1: its features in its order, with their shares; feature 7 (the
  # panel's first) is the one open.
  css(".thumb[data-layer='1'][data-head='1']").click()
  assert css("#head-features-title").text == "SAE features L1H1 writes most"
  assert _buttons(browser, "#head-features") == [("3", "0.625", "false"),
                                                 ("7", "0.250", "true")]
  # Its first button opens feature 3 in the panel, as its list item does.
  browser.find_elements(By.CSS_SELECTOR, "#head-features button")[0].click()
  assert css("#sae-title").text == "Feature 3"
  assert [b.get_attribute("aria-pressed") for b in browser.find_elements(
      By.CSS_SELECTOR, "#sae-list button")] == ["false", "true"]
  assert "never fires" in css("#sae-contexts").text
  assert _buttons(browser, "#head-features") == [("3", "0.625", "true"),
                                                 ("7", "0.250", "false")]
  # Its second opens feature 7: title and contexts.
  browser.find_elements(By.CSS_SELECTOR, "#head-features button")[1].click()
  assert css("#sae-title").text == "Feature 7: induction feature"
  assert len(browser.find_elements(By.CSS_SELECTOR, "#sae-contexts .ctx")
             ) == 2
  css(".thumb[data-layer='1'][data-head='0']").click()
  assert _buttons(browser, "#head-features") == [("7", "0.750", "true")]
  assert not chromium.console_errors(browser)
  assert [u for u in chromium.requests(browser)
          if u != url and not u.startswith("data:")] == []


def test_the_notebook_view_lists_every_heads_features(browser, tmp_path):
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  view = show.sae_features(FEATURES, layer=1, head_features=HEAD_FEATURES)
  assert _data(view.page)["sae"] == PANEL
  with pytest.raises(ValueError, match=r"^show.sae_features: "
                     r"`head_features` needs `layer`"):
    show.sae_features(FEATURES, head_features=HEAD_FEATURES)
  path = tmp_path / "view.html"
  path.write_text(view.page)
  url = _open(browser, path)
  # No heads to select: every head's list, above the features.
  rows = browser.find_elements(By.CSS_SELECTOR,
                               "#sae-head-tops .head-tops-row")
  assert [r.get_attribute("data-name") for r in rows] == ["L1H0", "L1H1"]
  assert _buttons(browser, ".head-tops-row[data-name='L1H1']") == [
      ("3", "0.625", "false"), ("7", "0.250", "true")]
  rows[1].find_elements(By.CSS_SELECTOR, "button")[0].click()
  assert browser.find_element(By.CSS_SELECTOR, "#sae-title").text == (
      "Feature 3")
  assert not chromium.console_errors(browser)
  assert [u for u in chromium.requests(browser)
          if u != url and not u.startswith("data:")] == []
