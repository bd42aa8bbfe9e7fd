"""`PretrainedError`: a checkpoint that cannot become an mha_jax model.

Every message names the file, then the tensor or field, what was expected
and what came, so a bad directory fails before any model is returned.
"""

from __future__ import annotations


class PretrainedError(ValueError):
  """A bad checkpoint directory, file, tensor or config field."""

  def __init__(self, where, message: str):
    super().__init__(f"{where}: {message}")
    self.where = str(where)
