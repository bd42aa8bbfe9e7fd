"""The SAE benchmark's rounds: speeds are medians over rounds and the
ratio is taken per round, mha_jax's speed over torch's."""

from experiments.sae import bench
from mha_jax.measure import timing


def test_rounds_take_the_ratio_of_speeds_per_round(monkeypatch):
  calls = []
  times = {"jax": [2.0, 1.0, 4.0], "torch": [1.0, 1.0, 2.0]}

  def fake(fns, rounds):
    assert set(fns) == {"jax", "torch"} and rounds == 3
    return times
  monkeypatch.setattr(timing, "interleaved_times", fake)
  out = bench._rounds(lambda: calls.append("jax"),  # pylint: disable=protected-access
                      lambda: calls.append("torch"), 3, work=10.0)
  assert calls == ["jax", "torch"]  # each once untimed, first
  assert out["jax"] == 10.0 / 2.0 and out["torch"] == 10.0 / 1.0
  # Per round: torch's seconds over mha_jax's (speed over speed).
  assert out["ratio"] == 0.5 and out["ratio_range"] == [0.5, 1.0]
