"""Role claims of experiment 6: a named head against the best other one.

Known answers: a hand-made pair of seeds for the paired lead, and the
committed results, where the best other head the report's role table
finds among all of a seed's paths must be the floor the survey recorded
while measuring (two code paths: `survey._resolve` at run time,
`roles._best_other` at render time).
"""

import json
import pathlib

import numpy as np
import pytest

from experiments.circuits import roles
from experiments.circuits import run

RESULTS = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "results"
           / "circuits" / "results.json")


@pytest.fixture(scope="module")
def saved():
  return json.loads(RESULTS.read_text())


def test_lead_is_the_paired_difference_and_its_share_of_chance():
  c = [{"value": 0.5, "floor": 0.1}, {"value": 0.3, "floor": 0.4}]
  rs = [{"claims": {"reference": {"key": [-0.2, -7.2]}}},
        {"claims": {"reference": {"key": [-1.0, -4.0]}}}]
  out = run._lead(c, rs, "key", -3.2)
  np.testing.assert_allclose(out["lead"]["values"], [0.4, -0.1])
  # (m_clean - m_corrupt) / (m_clean - chance): 7 / 3 and 3 / 2.2.
  np.testing.assert_allclose(out["lead_vs_chance"]["values"],
                             [0.4 * 7 / 3, -0.1 * 3 / 2.2])
  assert out["lead"]["mean"] == pytest.approx(0.15)


@pytest.mark.parametrize("ci, said", [
    ([0.01, 0.3], "separated from the best other"),
    ([-0.06, 0.45], "NOT separated from the best other"),
    ([-0.5, -0.1], "another layer-0 head feeds the values more"),
])
def test_verdict_follows_the_lead_interval(ci, said):
  claim = {"lead": {"ci95": ci, "values": [0.2, -0.1, 0.3]}}
  text = roles.verdict(claim, "values", "current-token")
  assert said in text and text.endswith("ahead in 2 of 3 seeds")


def test_best_other_head_is_the_floor_the_survey_recorded(saved):
  seeds = saved["config"]["experiment"]["seeds"]
  for key, _, _ in roles.ROLE_CLAIMS:
    c = saved["claims"][key]
    for i, s in enumerate(seeds):
      name, floor = roles._best_other(saved["runs"][f"seed{s}"], key,
                                      c["sets"][i])
      assert name != c["sets"][i] and name.split(":")[1] == (
          c["sets"][i].split(":")[1])
      assert floor == pytest.approx(c["floor"]["values"][i], abs=1e-12)
      assert c["lead"]["values"][i] == pytest.approx(
          c["values"][i] - floor, abs=1e-12)


def test_the_query_role_is_not_separated_in_the_committed_run(saved):
  # The numbers: per seed 0.41, 0.03, 0.33, 0.26, -0.07.
  lead = saved["claims"]["sc_cur_q_noise"]["lead"]
  np.testing.assert_allclose(lead["values"],
                             [0.41, 0.03, 0.33, 0.26, -0.07], atol=0.005)
  assert lead["ci95"][0] < 0 < lead["ci95"][1]
