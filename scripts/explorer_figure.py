"""docs/figures/explorer.png: the explorer page of experiment 1, as a reader
first sees it with one head and one query chosen.

    .venv/bin/python scripts/explorer_figure.py \
        [runs/induction/explorer.html] [docs/figures/explorer.png]

Opens the page in headless Chromium (the browser tests' set-up,
tests/interp/chromium.py), chooses layer 1, head 2 in the grid and
query 17, points at the key it attends to most, and saves a 1280 x 987
screenshot. Needs `make run` (or `make results`) first for the page.
"""

from __future__ import annotations

import pathlib
import sys

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "interp"))
import chromium  # pylint: disable=g-import-not-at-top,wrong-import-position

LAYER, HEAD, QUERY = 1, 2, 17
SIZE = (1280, 987)


def main(argv) -> None:
  page = pathlib.Path(argv[1] if len(argv) > 1 else
                      "runs/induction/explorer.html").resolve()
  out = pathlib.Path(argv[2] if len(argv) > 2 else "docs/figures/explorer.png")
  if not page.is_file():
    raise SystemExit(f"{page}: no explorer page; run `make run` first")
  browser = chromium.start(window=f"{SIZE[0]},{SIZE[1]}")
  try:
    browser.get(page.as_uri())
    WebDriverWait(browser, chromium.WAIT_S).until(lambda d: d.find_element(
        By.TAG_NAME, "body").get_attribute("data-ready") == "true")
    css = lambda sel: browser.find_element(By.CSS_SELECTOR, sel)
    css(f".thumb[data-layer='{LAYER}'][data-head='{HEAD}']").click()
    css(f"#query-tokens .tok[data-index='{QUERY}']").click()
    # Point at the cell of the key this query attends to most.
    key = browser.execute_script(
        "const k = document.querySelectorAll('#headview .current .key');"
        "let best = 0, w = -1; k.forEach((e, i) => {"
        "  const v = Number(e.dataset.weight ?? -1);"
        "  if (v > w) { w = v; best = i; } }); return best;")
    t = browser.execute_script(
        "return document.querySelectorAll('#key-labels div').length")
    chromium.point_at_cell(browser, css("#heatmap"), QUERY, key, t, t)
    browser.execute_script("window.scrollTo(0, 0)")
    out.parent.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(out))
  finally:
    browser.quit()
  print(f"wrote {out}")


if __name__ == "__main__":
  main(sys.argv)
