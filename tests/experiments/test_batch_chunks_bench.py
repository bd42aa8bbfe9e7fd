"""`experiments.benchmark.batch_chunks` reads the chunk count the library
gives each train-step shape (known answers from the shapes' sizes); the
scripts that time a shape per process refuse one they do not know by
name."""

import pytest

from experiments.benchmark import batch_chunks
from experiments.benchmark import train_step


@pytest.mark.parametrize("shape, seed, want", [
    # B16 H8 T256: 32 MiB of float32 scores, 4 chunks.
    ("text_size", 0, 4),
    # B64 H4 T32 (1 MiB) and the committed runs' random draw, L4 H4 D256
    # T128 B8 (2 MiB): under the 8 MiB threshold.
    ("induction", 0, 1),
    ("random", 1006221605, 1),
])
def test_chunks_of_the_benchmark_shapes(shape, seed, want):
  c = train_step.experiment_config(train_step.spec_of(shape, seed),
                                   "einsum")
  assert batch_chunks.chunks_of(c) == want


def test_an_unknown_shape_is_named():
  with pytest.raises(ValueError, match="--shapes.*'text_sized'"):
    train_step.spec_of("text_sized", 0)
