"""The train-step benchmark's host-device option (configs/benchmark.py,
`train_step.host_devices`): mha_jax's step on a data mesh of every device
is the training loop's sharded step, so it trains the same model as the
one-device step, and a device count the process lacks is refused."""

import jax
import numpy as np
import pytest

from configs import benchmark as benchmark_config
from experiments.benchmark import train_step


def _config():
  # Experiment 1's smoke model: batch 8, one row per device.
  return train_step.experiment_config(
      benchmark_config.get_config().train_step.specs.tiny, "einsum")


def test_the_mesh_step_splits_the_batch_and_trains_as_one_device():
  n = jax.device_count()
  one, batch_one, compiled = train_step.jax_step(_config())
  many, batch_many, none = train_step.jax_step(_config(), n)
  assert compiled is not None and none is None
  assert len(batch_many["inputs"].sharding.device_set) == n
  assert len(batch_one["inputs"].sharding.device_set) == 1
  np.testing.assert_array_equal(np.asarray(batch_many["inputs"]),
                                np.asarray(batch_one["inputs"]))
  # Three steps: the loss each returns was computed from the parameters
  # the previous update left, so the updates are compared too. Rounding
  # only (the batch mean sums per device, then across devices).
  for _ in range(3):
    np.testing.assert_allclose(float(many()), float(one()), rtol=1e-5)


def test_a_device_count_the_process_lacks_is_refused_by_name():
  with pytest.raises(ValueError, match="config.mesh.data"):
    train_step.jax_step(_config(), jax.device_count() // 2)
