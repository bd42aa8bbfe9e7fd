"""docs/figures/notebook_views.png: the tutorial notebook's inline views,
as a notebook shows them.

    .venv/bin/python scripts/notebook_figure.py

Runs docs/notebooks/tour.ipynb in full (800 training steps, about a
minute on 2 cores) with nbclient, lays three of its displayed cells (the
heads, the loss per token, direct logit attribution) out as notebook
cells, points at a heatmap cell in headless Chromium (the tests' set-up,
tests/interp/chromium.py) and saves the screenshot. `--smoke` runs the
notebook's smoke setting instead (seconds; for checking the script),
writing runs/notebook_views.png.
"""

from __future__ import annotations

import base64
import html
import json
import os
import pathlib
import re
import sys

import nbclient
import nbformat
import numpy as np
import PIL.Image

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "interp"))
import chromium  # pylint: disable=g-import-not-at-top,wrong-import-position

NOTEBOOK = ROOT / "docs" / "notebooks" / "tour.ipynb"
OUT = ROOT / "docs" / "figures" / "notebook_views.png"
# (index among the displayed views, the code line shown above it).
CELLS = ((0, 'show.heads(list(pattern), labels, scores=...)  # L x [H, T, T]'),
         (1, 'show.tokens(labels, token_loss)          # [T]'),
         (4, 'show.heads_bar(dla["heads"])             # [L, H]'))


def displayed_views(nb) -> list[str]:
  """The text/html of every `show` view the notebook displayed."""
  return [o["data"]["text/html"] for c in nb.cells
          for o in c.get("outputs", [])
          if 'class="mha-jax-view"' in o.get("data", {}).get("text/html", "")]


def page_data(cell_html: str) -> dict:
  """The JSON the page inside a cell's iframe reads."""
  page = html.unescape(re.search(r'srcdoc="([^"]*)"', cell_html).group(1))
  return json.loads(re.search(r'<script type="application/json" id="data">'
                              r"(.*?)</script>", page, re.S).group(1))


def main(smoke: bool) -> None:
  nb = nbformat.read(NOTEBOOK, as_version=4)
  out = ROOT / "runs" / OUT.name if smoke else OUT
  if smoke:
    os.environ["MHA_JAX_TOUR_SMOKE"] = "1"
  nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={
      "metadata": {"path": str(NOTEBOOK.parent)}}).execute()
  views = displayed_views(nb)
  cells = "".join(
      f'<div class="cell"><pre>In [{i + 3}]: {html.escape(code)}</pre>'
      f"{views[i]}</div>" for i, code in CELLS)
  page = ROOT / "runs" / "notebook_figure.html"
  page.parent.mkdir(exist_ok=True)
  page.write_text(
      "<!doctype html><html><head><meta charset='utf-8'><style>"
      "body{margin:0;padding:8px 16px;font-family:sans-serif}"
      ".cell{border-left:3px solid #d9dee7;margin:0 0 6px;padding-left:8px}"
      "pre{margin:4px 0;color:#303f9f;font-size:13px}</style></head>"
      f"<body>{cells}</body></html>")
  driver = chromium.start(window="1100,3000")
  try:
    from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
    from selenium.webdriver.support.ui import WebDriverWait  # pylint: disable=g-import-not-at-top
    driver.get(page.resolve().as_uri())
    frames = driver.find_elements(By.TAG_NAME, "iframe")
    for f in frames:
      driver.switch_to.frame(f)
      WebDriverWait(driver, 10).until(lambda d: d.find_element(
          By.TAG_NAME, "body").get_attribute("data-ready") == "true")
      driver.switch_to.default_content()
    # Point at the last query's strongest key in layer 1, head 0.
    kind = page_data(views[0])["kinds"][0]
    t = kind["tq"]
    weights = np.frombuffer(base64.b64decode(kind["weights"]), "<f4")
    q, k = t - 1, int(np.argmax(weights.reshape(
        kind["num_layers"], kind["num_heads"], t, t)[1, 0, t - 1]))
    driver.switch_to.frame(frames[0])
    driver.find_element(By.CSS_SELECTOR,
                        ".thumb[data-layer='1'][data-head='0']").click()
    chromium.point_at_cell(
        driver, driver.find_element(By.CSS_SELECTOR, "#heatmap"), q, k, t, t)
    driver.switch_to.default_content()
    # The body's own box (scrollHeight is never less than the window).
    height = driver.execute_script(
        "return Math.ceil(document.body.getBoundingClientRect().bottom)")
    # The window is taller than its viewport: grow it, then crop.
    driver.set_window_size(1100, height + 200)
    out.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(out))
    with PIL.Image.open(out) as im:
      cropped = im.crop((0, 0, im.width, min(im.height, height + 8)))
    cropped.save(out, optimize=True)
  finally:
    driver.quit()
  print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
  main(smoke="--smoke" in sys.argv[1:])
