"""Headless Chromium for the page tests (the explorer's and the notebook
views'): Selenium and Debian's chromedriver, nothing downloaded at run
time. `tests/interp/conftest.py` makes `start` the `browser` fixture."""

from __future__ import annotations

import decimal
import importlib
import json
import os
import shutil

import pytest

# How long a page may take to get ready or to render a panel. A wait, not
# a tolerance: on two loaded cores Treescope's panel once took over 10 s.
WAIT_S = 60

INSTALL_HINT = ("no headless Chromium found: install it with `apt-get "
                "install chromium chromium-driver` (Debian; .ci/run does) "
                "and Selenium with `pip install -e '.[test]'`, or point "
                "CHROMIUM and CHROMEDRIVER at the binaries")


def import_or_skip(module: str, reason: str):
  """`module`, imported; when it is missing, the test skips, or fails
  under CI (CI set in the environment), where .ci/run installs the test
  extras: a page test that skipped there would pass without running."""
  if not os.environ.get("CI"):
    return pytest.importorskip(module, reason=reason)
  try:
    return importlib.import_module(module)
  except ImportError as e:
    pytest.fail(f"{e}: {reason} (CI is set, so this fails instead of "
                "skipping)", pytrace=False)


def browser_paths():
  """(chromium, chromedriver) from CHROMIUM / CHROMEDRIVER or the PATH."""
  browser = os.environ.get("CHROMIUM") or next(
      filter(None, map(shutil.which, ("chromium", "chromium-browser",
                                      "google-chrome"))), None)
  driver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
  return browser, driver


def start(window: str = "1280,1000"):
  """Headless Chromium driven by Selenium through the system chromedriver
  (given both paths, Selenium downloads nothing), logging the console and
  every network request; skips (fails under CI) without one."""
  webdriver = import_or_skip("selenium.webdriver", INSTALL_HINT)
  from selenium.webdriver.chrome.service import Service  # pylint: disable=g-import-not-at-top
  binary, driver_path = browser_paths()
  if not (binary and driver_path):
    if os.environ.get("CI"):  # .ci/run installs it: missing is a failure
      pytest.fail(INSTALL_HINT)
    pytest.skip(INSTALL_HINT)
  options = webdriver.ChromeOptions()
  options.binary_location = binary
  for arg in ("--headless=new", "--no-sandbox", "--disable-gpu",
              "--disable-dev-shm-usage", f"--window-size={window}"):
    options.add_argument(arg)
  options.set_capability("goog:loggingPrefs",
                         {"browser": "ALL", "performance": "ALL"})
  return webdriver.Chrome(options=options, service=Service(driver_path))


def fixed3(x) -> str:
  """`x` to 3 decimals as JavaScript's toFixed(3) writes it: correctly
  rounded, exact ties up (Python's format rounds ties to even, and a
  weight can be exactly 0.0625)."""
  return str(decimal.Decimal(float(x)).quantize(
      decimal.Decimal("0.001"), rounding=decimal.ROUND_HALF_UP))


def requests(driver) -> list[str]:
  """URLs of every request since the last call (Chrome's DevTools log)."""
  events = [json.loads(e["message"])["message"]
            for e in driver.get_log("performance")]
  return [e["params"]["request"]["url"] for e in events
          if e["method"] == "Network.requestWillBeSent"]


def console_errors(driver) -> list[dict]:
  """The console's SEVERE entries since the last call."""
  return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def point_at_cell(driver, canvas, q: int, k: int, tq: int, tk: int):
  """Move the pointer to the centre of cell (query q, key k) of a heatmap
  `canvas` that draws `[tq, tk]` cells over its whole box."""
  from selenium.webdriver.common.action_chains import ActionChains  # pylint: disable=g-import-not-at-top
  width, height = driver.execute_script(
      "const r = arguments[0].getBoundingClientRect();"
      "return [r.width, r.height];", canvas)
  # Offsets are from the element's centre.
  ActionChains(driver).move_to_element_with_offset(
      canvas, int((k + 0.5) * width / tk - width / 2),
      int((q + 0.5) * height / tq - height / 2)).perform()
