"""Reading a circuits run's per-head patching numbers back for the explorer."""

import json

import numpy as np

from experiments import saved_patching


def test_circuit_numbers_beside_a_run(tmp_path):
  run = tmp_path / "seed0"
  run.mkdir()
  assert saved_patching.beside(run, 2, 2) is None
  # Another experiment's layout beside the run: no circuit numbers.
  (tmp_path / "results.json").write_text(json.dumps({"runs": [{"a": 1}]}))
  assert saved_patching.beside(run, 2, 2) is None
  heads = {"noise": {"activation": [[0.1, 0.2], [0.3, 0.4]],
                     "attribution": [[1, 2], [3, 4]]}}
  (tmp_path / "results.json").write_text(json.dumps(
      {"runs": {"seed0": {"heads": heads}}}))
  got = saved_patching.beside(run, 2, 2)
  np.testing.assert_array_equal(got["columns"]["noise activation patching"],
                                heads["noise"]["activation"])
  assert got["source"] == str(tmp_path / "results.json")
  assert saved_patching.beside(run, 2, 3) is None  # not this model's
