"""The SAE experiment's smoke config end to end (about 50 s, most of it
compiling), so it runs in the heavy tier: MHA_JAX_REAL_MODELS=1, as
`make test-real` sets it. Checks that the report regenerates from
results.json, that the loss-recovered numbers are the ratios of the CE
values beside them, that a second run resumes every SAE from its
checkpoint and reproduces the numbers, and that the feature page exists."""

import json
import os

import pytest

from configs import sae as sae_config
from experiments.sae import __main__ as entry
from experiments.sae import report
from mha_jax.measure import report as report_lib

pytestmark = pytest.mark.skipif(
    os.environ.get("MHA_JAX_REAL_MODELS") != "1",
    reason="heavy tier (MHA_JAX_REAL_MODELS=1): the smoke run compiles for "
    "about 50 s")


def test_smoke_run_end_to_end(tmp_path):
  config = sae_config.get_config("smoke")
  first = entry.run(config, tmp_path)
  saved = json.loads((tmp_path / "results.json").read_text())
  assert saved == first
  assert report_lib.regenerate(tmp_path, report.render) == (
      tmp_path / "report.md").read_text()
  e = config.experiment
  for r in saved["runs"] + saved["resid_pre"]["runs"]:
    for lo in (r["loss"], r["loss_repeated"]):
      assert lo["recovered_zero"] == pytest.approx(
          (lo["zero"] - lo["splice"]) / (lo["zero"] - lo["clean"]))
      assert lo["recovered_mean"] == pytest.approx(
          (lo["mean"] - lo["splice"]) / (lo["mean"] - lo["clean"]))
    assert 0 <= r["dead"] <= 1 and 0 <= r["dense"] <= 1
  assert {(r["kind"], r["seed"]) for r in saved["runs"]} == {
      (k, s) for k in e.kinds for s in e.seeds}
  # The second site: its own SAEs, not the z ones measured again.
  assert {(r["kind"], r["seed"]) for r in saved["resid_pre"]["runs"]} == {
      (k, s) for k in e.resid_pre_kinds for s in e.resid_pre_seeds}
  assert (tmp_path / f"resid_pre_topk_seed{e.resid_pre_seeds[0]}").is_dir()
  assert saved["resid_pre"]["data"]["scale"] != saved["data"]["scale"]
  # The controls: each has its own SAEs (the untrained one none), the
  # sweep's counts, and the KL beside the loss.
  assert set(saved["controls"]) == set(e.controls)
  # The smoke config gives the re-initialised model its own seed list.
  assert tuple(e.reinit_seeds) != tuple(e.control_seeds)
  sets = {"layer0": (e.control_kinds, e.control_seeds),
          "reinit": (e.control_kinds, e.reinit_seeds),
          "untrained": (e.kinds, e.seeds)}
  for name, c in saved["controls"].items():
    trained = name != "untrained"
    kinds, seeds = sets[name]
    assert {(r["kind"], r["seed"]) for r in c["runs"]} == {
        (k, s) for k in kinds for s in seeds}
    for s in (0, 1):
      assert (tmp_path / f"control_{name}_topk_seed{s}").is_dir() == (
          trained and s in seeds)
    assert not (tmp_path / f"control_{name}_relu_seed0").exists()
    assert all((r["train_s"] is None) != trained for r in c["runs"])
  assert saved["controls"]["layer0"]["layer"] == e.control_layer
  for r in saved["runs"]:
    assert len(r["induction"]["sweep"]) == sum(
        len(e[f"sweep_{n}"]) for n in ("second_rate", "second_ratio",
                                       "dfa_share"))
    assert r["loss"]["kl_splice"] >= 0 and r["loss"]["kl_zero"] > 0
  assert "feature " in (tmp_path / "view.html").read_text()
  assert '"sae"' in (tmp_path / "explorer.html").read_text()
  # Again in the same folder: every SAE restores, nothing retrains, and
  # every SAE's measures are read back, none measured again ...
  from experiments.sae import per_sae  # pylint: disable=g-import-not-at-top
  def measured(*args):
    raise AssertionError(f"measured again: {args[4].kind} {args[4].seed}")
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(per_sae, "_standard", measured)
    mp.setattr(per_sae, "_measure_sae", measured)
    second = entry.run(config, tmp_path)
  strip = lambda res: [{k: v for k, v in r.items()
                        if k not in ("train_s", "steps_per_s")}
                       for r in res["runs"] + res["resid_pre"]["runs"] + [
                           r for c in res["controls"].values()
                           for r in c["runs"]]]
  assert strip(second) == strip(first)
  assert len(list((tmp_path / "measures").glob("*.json"))) == len(
      strip(first))
  # ... and measured again without the saved ones, the numbers come out
  # the same.
  config.experiment.cache_measures = False
  assert strip(entry.run(config, tmp_path)) == strip(first)
