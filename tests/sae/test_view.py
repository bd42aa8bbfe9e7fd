"""The offline feature page: escaped tokens, shading by activation."""

import pytest

from mha_jax.sae import view


def _feature(tokens=("a", "<b>", "c")):
  return {"id": 7, "title": "x & y", "heads": [("L1H0", 0.75),
                                              ("L1H1", 0.25)],
          "contexts": [{"tokens": list(tokens), "acts": [0.0, 2.0, 1.0],
                        "at": 1, "source": [0.5, -0.1, 0.0],
                        "by_head": [("L1H0", 0.3), ("L1H1", -0.1)]}]}


def test_page_escapes_tokens_and_shades_by_activation():
  page = view.feature_html([_feature()], title="t<1>")
  assert "<b>" not in page and "&lt;b&gt;" in page and "x &amp; y" in page
  assert "t&lt;1&gt;" in page and "<script" not in page and "http" not in page
  # Activations 0, 2, 1 of a top of 2: alphas 0, 1, 0.5; the top one
  # outlined.
  assert 'class="at" style="background: rgba(255, 140, 0, 1.00)"' in page
  assert "rgba(255, 140, 0, 0.50)" in page
  # A negative DFA bar is drawn red, at its share of the largest |value|.
  assert 'class="bar neg" style="width: 4.00em"' in page


def test_missing_field_is_named():
  f = _feature()
  del f["heads"]
  with pytest.raises(ValueError, match="each feature needs 'heads'"):
    view.feature_html([f])
