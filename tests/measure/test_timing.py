"""`timing.interleaved_times`: one timing of each per round, the order
rotating by one each round, untimed setups, blocks timed per call;
`timing.wall_times`: the warm-up left out, feed-back, and a slow first
call timed alone."""

import time

import pytest

from mha_jax.measure import timing


def test_interleaved_times_rotates_the_order_each_round():
  order = []
  calls = {name: (lambda name=name: order.append(name)) for name in "abc"}
  times = timing.interleaved_times(calls, rounds=4)
  assert order == list("abc" "bca" "cab" "abc")
  assert {name: len(ts) for name, ts in times.items()} == {
      "a": 4, "b": 4, "c": 4}
  assert all(t >= 0 for ts in times.values() for t in ts)


def test_wall_times_leaves_out_the_warmup_and_feeds_back():
  seen = []
  times, out = timing.wall_times(lambda x: seen.append(x) or x + 1, (0,),
                                 warmup=2, repeats=3,
                                 feed_back=lambda args, out: (out,))
  assert seen == [0, 1, 2, 3, 4] and out == 5 and len(times) == 3


def test_a_slow_first_call_is_timed_alone():
  calls = []
  slow = lambda: calls.append(time.sleep(0.02))
  times, _ = timing.wall_times(slow, (), warmup=1, repeats=5, slow_s=0.01)
  assert len(times) == 1 and len(calls) == 2 and times[0] >= 0.02
  times, _ = timing.wall_times(slow, (), warmup=0, repeats=3, slow_s=10.0)
  assert len(times) == 3


def test_interleaved_setups_run_untimed_and_blocks_are_per_call():
  log = []
  calls = {"fast": lambda: log.append("fast"),
           "slow": lambda: log.append(time.sleep(0.01) or "slow")}
  setups = {"fast": lambda: log.append(time.sleep(0.05) or "setup")}
  times = timing.interleaved_times(
      calls, rounds=2, setups=setups, repeat={"slow": 3},
      on_round=lambda r: log.append(f"round {r}"))
  assert log == ["round 0", "setup", "fast", "slow", "slow", "slow",
                 "round 1", "slow", "slow", "slow", "setup", "fast"]
  # The 50 ms setup is not in fast's time; slow's is per call, not per
  # block of three.
  assert all(t < 0.04 for t in times["fast"])
  assert all(0.01 <= t < 0.025 for t in times["slow"])


def test_spread_is_the_median_and_range_of_the_rounds():
  assert timing.spread([3, 1.0, 2.0, 10.0]) == {"median": 2.5, "min": 1.0,
                                                "max": 10.0}
  with pytest.raises(ValueError, match="at least one value, got none"):
    timing.spread([])
