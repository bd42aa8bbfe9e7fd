"""The attention explorer: its numbers, its entry point and the page in a
real browser.

The browser test drives the written page in headless Chromium through
Selenium and Debian's chromedriver (no browser download at run time): one
page load, then the interactions a reader makes, each checked against the
weights computed here in Python. Without a browser it skips and says how
to install one (`.ci/run` installs it, so CI always runs it).
"""

from __future__ import annotations

import base64
import importlib
import importlib.util
import json
import pathlib
import re

from flax import nnx
import numpy as np
import pytest

from mha_jax.training import checkpoint
from mha_jax.training import config as config_lib
from mha_jax.interp import explorer
from mha_jax.interp import survey as head_survey
from mha_jax.training import held_out
from mha_jax.interp import interventions
from mha_jax.training import saved_run
from mha_jax.training import train_state
from mha_jax.models import transformer

import chromium
import entry_points

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _smoke_config(name="default"):
  return importlib.import_module(f"configs.{name}").get_config("smoke")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  """A run folder as `train.train_and_evaluate` leaves it (config.json
  and an orbax checkpoint) of the smoke induction model, saved at
  initialisation: the explorer reads any checkpoint the same way, and
  skipping the training step's compile saves most of this test's time."""
  config = _smoke_config()
  workdir = tmp_path_factory.mktemp("run")
  (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
  state = train_state.create_train_state(config)
  manager = checkpoint.make_manager(workdir, 1, 1)
  checkpoint.save(manager, state, force=True)
  checkpoint.close(manager)
  return workdir


@pytest.fixture(scope="module")
def explored(run_dir):
  """`experiments.explore.run` on the run's held-out task batch."""
  return entry_points.load("explore").run(run_dir, batch_from_task=True)


def _page_data(path) -> dict:
  """The JSON the page's script reads, weights decoded to `[L, H, Tq, Tk]`."""
  text = pathlib.Path(path).read_text()
  found = re.search(r'<script type="application/json" id="data">(.*?)'
                    r"</script>", text, re.S)
  data = json.loads(found.group(1))
  for k in data["kinds"]:
    flat = np.frombuffer(base64.b64decode(k["weights"]), "<f4")
    k["weights"] = flat.reshape(k["num_layers"], k["num_heads"], k["tq"],
                                k["tk"])
  return data


def _pattern(model, tokens, layer):
  """Layer `layer`'s weights `[B, H, T, T]` read through the hook API (a
  path independent of `held_out.weights_of`, which the page uses)."""
  site = f"blocks.{layer}.attn.pattern"
  return np.asarray(model(tokens, capture=[site])[1][site])


# ------------------------------------------------------------ pure parts


def test_token_labels_name_special_ids_and_positions():
  assert explorer.token_labels([1, 5, 2, 0]) == ["BOS", "5", "SEP", "PAD"]
  assert explorer.token_labels([1, 5], specials=False) == ["1", "5"]
  assert explorer.token_labels(np.zeros((3, 4))) == ["@0", "@1", "@2"]


def test_parse_tokens_accepts_ids_and_names_and_names_each_problem():
  got = explorer.parse_tokens("sep 5, 7  BOS", vocab_size=8, max_len=6)
  np.testing.assert_array_equal(got, [2, 5, 7, 1])
  kw = dict(vocab_size=8, max_len=4)
  with pytest.raises(ValueError, match=r"token 9 at position 1 is outside "
                     r"the model's vocabulary \[0, 8\)"):
    explorer.parse_tokens("3 9", **kw)
  with pytest.raises(ValueError, match=r"has 5 tokens, more than the "
                     r"model's max_len=4"):
    explorer.parse_tokens("3 4 5 6 7", **kw)
  with pytest.raises(ValueError, match=r"'x' at position 0 is not a token"):
    explorer.parse_tokens("x", **kw)
  with pytest.raises(ValueError, match="is empty"):
    explorer.parse_tokens("  ", **kw)
  with pytest.raises(ValueError, match=r"'SEP' at position 0 is not"):
    explorer.parse_tokens("SEP", specials=False, **kw)


def test_decoder_text_batch_has_the_task_targets():
  b = explorer.decoder_text_batch([3, 4, 5, 6], "induction", 8)
  np.testing.assert_array_equal(b["targets"], [[4, 5, 6, 0]])
  np.testing.assert_array_equal(b["loss_mask"], [[1, 1, 1, 0]])
  # The two-offset pair class x_{t-1} * V + x_{t-3}, counted from t = 3.
  b = explorer.decoder_text_batch([1, 2, 3, 4, 5], "two_offset_token", 8)
  assert b["targets"][0, 3] == 3 * 8 + 1 and b["targets"][0, 4] == 4 * 8 + 2
  np.testing.assert_array_equal(b["loss_mask"], [[0, 0, 0, 1, 1]])


def test_uniform_floor_is_the_survey_floor():
  """Causal and unpadded, the floor is `survey.uniform_floor`."""
  batch = {"inputs": np.asarray([[3, 4, 3, 4, 5], [5, 5, 6, 5, 5]])}
  kind = explorer.DECODER_KINDS[0]
  got = explorer.floor_scores(explorer.visible_keys(kind, batch),
                              batch["inputs"])
  assert got == pytest.approx(head_survey.uniform_floor(batch), abs=1e-6)


# ----------------------------------------------------------- entry point


def test_explore_batch_page_holds_the_models_numbers(run_dir, explored):
  """The page's weights and scores are the model's own, as the analysis
  functions and results.json compute them."""
  model, config = saved_run.load_model(run_dir)
  batch = explored["batch"]
  # The experiments' analysis batch: same size and seed.
  want = held_out.analysis_batch(config, config.task.batch_size,
                                 seed=held_out.ANALYSIS_SEED)
  np.testing.assert_array_equal(batch["inputs"], want["inputs"])
  page = _page_data(explored["path"])
  assert explored["path"] == run_dir / "explorer.html"
  (kind,) = page["kinds"]
  assert kind["query_labels"] == explorer.token_labels(batch["inputs"][0])
  np.testing.assert_array_equal(
      kind["weights"], held_out.weights_of(model, batch)["self"][:, 0])
  for layer in range(config.model.num_layers):  # eager vs jitted: 1 ulp
    np.testing.assert_allclose(
        kind["weights"][layer], _pattern(model, batch["inputs"], layer)[0],
        atol=1e-6)
  table = kind["table"]
  cols = [c["key"] for c in table["columns"]]
  values = np.asarray([r["values"] for r in table["rows"]])  # [L*H, N]
  assert [(r["layer"], r["head"]) for r in table["rows"]] == [
      (l, h) for l in range(2) for h in range(2)]
  survey = head_survey.survey(model, batch, "xent", ablate=False,
                              init_model=train_state.create_train_state(
                                  config).model())
  for name in ("previous_token", "induction", "duplicate_token", "entropy"):
    np.testing.assert_allclose(values[:, cols.index(name)],
                               survey["metrics"][name].ravel(), rtol=1e-6)
  np.testing.assert_allclose(
      values[:, cols.index("ablation")],
      interventions.zero_ablation(model, batch, "xent").ravel(), rtol=1e-5)
  uniform, init = table["floors"]
  assert uniform["values"][cols.index("induction")] == pytest.approx(
      survey["floors"]["uniform"]["induction"])
  assert init["values"][cols.index("entropy")] == pytest.approx(
      float(np.mean(survey["floors"]["init"]["metrics"]["entropy"])))
  assert page["info"][0] == ["run", str(run_dir)]


def test_explore_text_page(run_dir, tmp_path):
  model, _ = saved_run.load_model(run_dir)
  out = entry_points.load("explore").run(run_dir, text="BOS 3 4 5 3 4 SEP",
                              output=tmp_path / "text.html", ablate=False)
  (kind,) = _page_data(out["path"])["kinds"]
  assert kind["query_labels"] == ["BOS", "3", "4", "5", "3", "4", "SEP"]
  tokens = np.asarray([[1, 3, 4, 5, 3, 4, 2]])
  np.testing.assert_allclose(kind["weights"][1],
                             _pattern(model, tokens, 1)[0], atol=1e-6)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(text="3 4 99"), ValueError,
     r"token 99 at position 2 is outside the model's vocabulary \[0, 8\)"),
    (dict(text=" ".join(["3"] * 13)), ValueError,
     r"has 13 tokens, more than the model's max_len=12"),
    (dict(), ValueError, r"exactly one input"),
    (dict(text="3", batch_from_task=True), ValueError, r"exactly one input"),
])
def test_explore_bad_text(run_dir, kwargs, error, message):
  with pytest.raises(error, match=message):
    entry_points.load("explore").run(run_dir, **kwargs)


def test_explore_bad_workdir(tmp_path):
  explore = entry_points.load("explore")
  with pytest.raises(FileNotFoundError, match="no such directory"):
    explore.run(tmp_path / "missing", text="3")
  (tmp_path / "seed0").mkdir()
  (tmp_path / "seed0" / "config.json").write_text("{}")
  with pytest.raises(FileNotFoundError, match=r"no config\.json.*sub-folders "
                     r"seed0"):
    explore.run(tmp_path, text="3")
  with pytest.raises(FileNotFoundError, match="no checkpoint in"):
    explore.run(tmp_path / "seed0", text="3")
  assert not (tmp_path / "seed0" / "checkpoints").exists()  # nothing made


def test_encoder_decoder_views(tmp_path):
  """Three views, cross-attention with target queries and source keys."""
  config = _smoke_config("cross_attention")
  model = config_lib.build_model(config, nnx.Rngs(params=0))
  assert isinstance(model, transformer.EncoderDecoder)
  batch = explorer.text_batch(model, config, "5 6 7 | 7 6 5")
  np.testing.assert_array_equal(batch["decoder_inputs"], [[1, 7, 6]])
  data = explorer.explore(model, batch, loss="xent")
  assert [k["key"] for k in data["kinds"]] == ["encoder", "self", "cross"]
  cross = data["kinds"][2]
  assert cross["query_labels"] == ["BOS", "7", "6"]
  assert cross["key_labels"] == ["5", "6", "7"]
  w = held_out.weights_of(model, batch)["cross"][:, 0]
  np.testing.assert_array_equal(cross["weights"], w)
  assert cross["scores"]["ablation"].shape == (1, 2)
  # Two sequences: no token score, no offset between positions.
  assert sorted(cross["scores"]) == ["ablation", "confidence", "entropy"]
  assert sorted(cross["floors"]["uniform"]) == ["confidence", "entropy"]
  # Without a target the model's own greedy output is the decoder side.
  greedy = explorer.text_batch(model, config, "5 6 7")
  assert greedy["decoder_inputs"][0, 0] == 1
  page = explorer.render(data, raw_arrays=False)
  assert "cross-attention (target queries x source keys)" in page
  continuous = _smoke_config("two_offsets")
  abstract = nnx.eval_shape(  # its config is all text_batch reads
      lambda: config_lib.build_model(continuous, nnx.Rngs(params=0)))
  with pytest.raises(ValueError, match="takes continuous inputs"):
    explorer.text_batch(abstract, continuous, "3 4")


def test_refresh_pages_rewraps_an_old_page_into_the_one_written_now(
    explored, tmp_path):
  """scripts/refresh_pages.py on a page whose script is out of date gives
  back exactly the page the explorer writes now (title, JSON and Treescope
  panels kept byte for byte); a current page is left as it is, and a file
  that is no page fails by name."""
  spec = importlib.util.spec_from_file_location(
      "refresh_pages", ROOT / "scripts" / "refresh_pages.py")
  refresh_pages = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(refresh_pages)
  now = explored["path"].read_text()
  script = (ROOT / "mha_jax" / "interp" / "explorer_static" / "page.js"
            ).read_text()
  assert now.count(script) == 1
  old = tmp_path / "old.html"
  old.write_text(now.replace(script, "/* an older page script */"))
  assert refresh_pages.refresh(old)
  assert old.read_text() == now
  assert not refresh_pages.refresh(old)
  (tmp_path / "other.html").write_text("<html><title>x</title></html>")
  with pytest.raises(ValueError, match="expected a page written by "
                     "explorer.page_html, with its data"):
    refresh_pages.refresh(tmp_path / "other.html")


# --------------------------------------------------------------- browser


def test_a_missing_test_extra_skips_here_and_fails_under_ci(monkeypatch):
  missing = "mha_jax_no_such_module"
  monkeypatch.delenv("CI", raising=False)
  with pytest.raises(pytest.skip.Exception, match="the hint"):
    chromium.import_or_skip(missing, "the hint")
  monkeypatch.setenv("CI", "true")
  # Any outcome caught, so that a skip here fails this test, not skips it.
  with pytest.raises(BaseException, match=f"{missing}.*the hint") as err:
    chromium.import_or_skip(missing, "the hint")
  assert err.type is pytest.fail.Exception, err.type
  assert chromium.import_or_skip("json", "the hint") is json


def test_page_in_a_real_browser(browser, run_dir, explored, tmp_path):
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.support.ui import WebDriverWait  # pylint: disable=g-import-not-at-top
  model, _ = saved_run.load_model(run_dir)
  # [L, H, T, T] of the example shown, by the same compiled program as the
  # page's (the hook path may differ in the last bit, which can move a
  # third decimal; the test above compares the two paths).
  weights = held_out.weights_of(model, explored["batch"])["self"][:, 0]
  t = weights.shape[-1]
  url = explored["path"].resolve().as_uri()
  browser.get(url)
  WebDriverWait(browser, chromium.WAIT_S).until(
      lambda d: d.find_element(By.TAG_NAME, "body").get_attribute(
          "data-ready") == "true")
  css = lambda sel: browser.find_element(By.CSS_SELECTOR, sel)
  js = browser.execute_script

  # Choosing a head in the grid changes the heatmap.
  before = js("return document.getElementById('heatmap').toDataURL()")
  css(".thumb[data-layer='1'][data-head='1']").click()
  assert css("#heatmap-title").text.startswith("Layer 1, head 1")
  assert css(".thumb[data-layer='1'][data-head='1']").get_attribute(
      "aria-pressed") == "true"
  assert js("return document.getElementById('heatmap').toDataURL()") != before

  # The value under the pointer is the weight computed here.
  q = t - 2
  k = int(np.argmax(weights[1, 1, q]))
  chromium.point_at_cell(browser, css("#heatmap"), q, k, t, t)
  readout = css("#readout")
  assert (readout.get_attribute("data-query"),
          readout.get_attribute("data-key")) == (str(q), str(k))
  assert css("#readout-value").text == chromium.fixed3(weights[1, 1, q, k])

  # Choosing a query token highlights, per head, the keys it attends to.
  q = t // 2
  css(f"#query-tokens button[data-index='{q}']").click()
  assert css(f"#query-tokens button[data-index='{q}']").get_attribute(
      "aria-pressed") == "true"
  for h in range(2):
    row = css(f".hv-row[data-head='{h}']")
    keys = row.find_elements(By.CSS_SELECTOR, ".key")
    assert [e.get_attribute("data-weight") for e in keys] == [
        chromium.fixed3(w) for w in weights[1, h, q]]
    top = row.find_element(By.CSS_SELECTOR, ".key.top")
    assert top.get_attribute("data-index") == str(
        int(np.argmax(weights[1, h, q])))
    assert row.find_elements(By.CSS_SELECTOR, ".key.future") == keys[q + 1:]

  # Sorting the table by a score puts the largest first.
  css("#scores th[data-col='previous_token'] button").click()
  table = _page_data(explored["path"])["kinds"][0]["table"]
  col = [c["key"] for c in table["columns"]].index("previous_token")
  first = css("#scores tbody tr")
  best = max(table["rows"], key=lambda r: r["values"][col])
  assert (first.get_attribute("data-layer"),
          first.get_attribute("data-head")) == (str(best["layer"]),
                                                str(best["head"]))

  # Treescope's raw-array panel renders once opened, with no scrolling: the
  # click scrolls the summary up to the window's bottom edge, the panel
  # opens just below it, and the page must bring it into view itself.
  js("window.scrollTo(0, 0)")
  css("#raw-details summary").click()
  WebDriverWait(browser, chromium.WAIT_S).until(lambda d: js(
      "return document.querySelector('.raw treescope-container')"
      ".shadowRoot.querySelector('canvas') !== null;"))

  errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
  assert not errors
  # The page itself and inline data: URLs only; nothing from a network.
  assert [u for u in chromium.requests(browser)
          if u != url and not u.startswith("data:")] == []
  browser.save_screenshot(str(tmp_path / "explorer.png"))
  assert (tmp_path / "explorer.png").read_bytes()[:4] == b"\x89PNG"
