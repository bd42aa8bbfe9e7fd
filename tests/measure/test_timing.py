"""`timing.interleaved_times`: one call of each per round, the order
rotating by one each round, a time per call."""

from mha_jax.measure import timing


def test_interleaved_times_rotates_the_order_each_round():
  order = []
  calls = {name: (lambda name=name: order.append(name)) for name in "abc"}
  times = timing.interleaved_times(calls, rounds=4)
  assert order == list("abc" "bca" "cab" "abc")
  assert {name: len(ts) for name, ts in times.items()} == {
      "a": 4, "b": 4, "c": 4}
  assert all(t >= 0 for ts in times.values() for t in ts)
