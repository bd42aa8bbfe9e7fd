"""The SAE benchmark's rounds: speeds are medians over rounds and the
ratio is taken per round, mha_jax's speed over torch's."""

import jax.numpy as jnp
import numpy as np
import pytest

from configs import sae as sae_config
from experiments.sae import bench
from mha_jax.core import flops
from mha_jax.measure import timing
from mha_jax.sae import train


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


def test_rounds_give_each_librarys_share_of_the_yardstick(monkeypatch):
  """Per round: the measure's FLOPs per second over the yardstick's, for
  both libraries; the yardstick timed in blocks after a pause."""
  times = {"jax": [2.0, 1.0, 4.0], "torch": [1.0, 2.0, 2.0],
           "yardstick": [10.0, 10.0, 20.0]}
  seen = {}

  def fake(fns, rounds, setups, repeat):
    seen.update(names=set(fns), setups=set(setups), repeat=repeat)
    return times
  monkeypatch.setattr(timing, "interleaved_times", fake)
  out = bench._rounds(lambda: None, lambda: None, 3,  # pylint: disable=protected-access
                      roof=(lambda: None, 1000.0, 100.0))
  assert seen == {"names": {"jax", "torch", "yardstick"},
                  "setups": {"yardstick"},
                  "repeat": {"yardstick": bench.YARD_REPEAT}}
  roof = out["roofline"]
  assert roof["yardstick_flops_per_s"] == [100.0, 100.0, 50.0]
  # jax: 50, 100, 25 FLOP/s over 100, 100, 50: 0.5, 1.0, 0.5.
  assert roof["share"]["jax"] == {"median": 0.5, "min": 0.5, "max": 1.0}
  # torch: 100, 50, 50 over the same: 1.0, 0.5, 1.0.
  assert roof["share"]["torch"] == {"median": 1.0, "min": 0.5, "max": 1.0}


@pytest.mark.parametrize("kind", ["relu", "topk"])
def test_the_steps_matmul_work_is_the_compiled_programs(kind):
  """Six 2 B d m products a step (the bench's docstring), counted in the
  compiled step; TopK with AuxK off, as no feature is dead in the bench's
  steps."""
  c = sae_config.get_config(None).sae
  c.kind, c.batch_size, c.d_sae, c.k, c.aux_k = kind, 32, 48, 4, 0
  d_in = 8
  step, _ = train.compiled(train.hyper(c), 1e-3, 0.999)
  state = train.init_state(c, d_in, np.zeros(d_in, np.float32))
  compiled = step.lower(state, jnp.ones((32, d_in))).compile()
  assert flops.compiled_matmul_flops(compiled) == bench.step_matmul_flops(
      32, d_in, 48) == 12 * 32 * 8 * 48
