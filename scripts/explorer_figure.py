"""docs/figures/explorer.png: the explorer page of experiment 1, as a reader
first sees it with one head and one query chosen.

    .venv/bin/python scripts/explorer_figure.py \
        [runs/induction/explorer.html] [docs/figures/explorer.png]

Opens the page in headless Chromium (the browser tests' set-up: Selenium
and the system's chromedriver), chooses layer 1, head 2 in the grid and
query 17, points at the key it attends to most, and saves a 1280 x 987
screenshot. Needs `make run` (or `make results`) first for the page.
"""

from __future__ import annotations

import pathlib
import shutil
import sys

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

LAYER, HEAD, QUERY = 1, 2, 17
SIZE = (1280, 987)


def main(argv) -> None:
  page = pathlib.Path(argv[1] if len(argv) > 1 else
                      "runs/induction/explorer.html").resolve()
  out = pathlib.Path(argv[2] if len(argv) > 2 else "docs/figures/explorer.png")
  if not page.is_file():
    raise SystemExit(f"{page}: no explorer page; run `make run` first")
  binary = shutil.which("chromium") or shutil.which("chromium-browser")
  driver_path = shutil.which("chromedriver")
  if not (binary and driver_path):
    raise SystemExit("needs chromium and chromedriver on the PATH (Debian: "
                     "apt-get install chromium chromium-driver)")
  options = webdriver.ChromeOptions()
  options.binary_location = binary
  for arg in ("--headless=new", "--no-sandbox", "--disable-gpu",
              "--hide-scrollbars", f"--window-size={SIZE[0]},{SIZE[1]}"):
    options.add_argument(arg)
  browser = webdriver.Chrome(options=options, service=Service(driver_path))
  try:
    browser.get(page.as_uri())
    WebDriverWait(browser, 10).until(lambda d: d.find_element(
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
    canvas = css("#heatmap")
    cell = canvas.size["width"] / browser.execute_script(
        "return document.querySelectorAll('#key-labels div').length")
    ActionChains(browser).move_to_element_with_offset(
        canvas, int((key + 0.5) * cell - canvas.size["width"] / 2),
        int((QUERY + 0.5) * cell - canvas.size["height"] / 2)).perform()
    browser.execute_script("window.scrollTo(0, 0)")
    out.parent.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(out))
  finally:
    browser.quit()
  print(f"wrote {out}")


if __name__ == "__main__":
  main(sys.argv)
