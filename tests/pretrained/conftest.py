"""Shared fixtures: each family's tiny transformers model, built once per
session (per xdist worker) into a temporary directory, with its outputs
in float32 and float64."""

import copy

import pytest
import torch
import transformers

import hf_models

# The suite runs on 2 workers sharing 2 cores: one torch thread each.
torch.set_num_threads(1)
# "Writing model shards" progress bars on every save_pretrained.
transformers.utils.logging.disable_progress_bar()


class Built:
  """One family's saved model: `directory`, the float32 torch `model`, its
  outputs `out32` and those of a float64 copy `out64` (`hf_models.run`)."""

  def __init__(self, family, directory):
    self.family, self.directory = family, directory
    self.model = hf_models.build(family, directory)
    self.batch = hf_models.inputs(family)
    self.out32 = hf_models.run(self.model, self.batch)
    self.out64 = hf_models.run(copy.deepcopy(self.model).double(),
                               self.batch)


@pytest.fixture(scope="session")
def built(tmp_path_factory):
  """`built(family)` -> that family's `Built`, made on first use."""
  cache = {}

  def get(family):
    if family not in cache:
      cache[family] = Built(family, tmp_path_factory.mktemp(family))
    return cache[family]

  return get
