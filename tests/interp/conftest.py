"""The `browser` fixture of the page tests (see chromium.py)."""

import pytest

import chromium


@pytest.fixture
def browser():
  driver = chromium.start()
  yield driver
  driver.quit()
