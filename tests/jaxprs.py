"""The jaxprs inside an equation's params (a scan's body, a pjit's callee),
for tests that walk every intermediate of a traced function.

`jax.extend.core.jaxprs_in_params` does this from JAX 0.10 on; this helper
also runs on the older JAX that pyproject allows."""

from jax.extend import core as jex_core


def jaxprs_in_params(params):
  """Yield each Jaxpr in params (a ClosedJaxpr gives its .jaxpr)."""
  for value in params.values():
    for v in value if isinstance(value, tuple) else (value,):
      if isinstance(v, jex_core.ClosedJaxpr):
        yield v.jaxpr
      elif isinstance(v, jex_core.Jaxpr):
        yield v
