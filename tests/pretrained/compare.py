"""The mha_jax side of the comparisons: one call that returns what
`hf_models.run` returns, from the hook sites of a loaded model."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mha_jax.pretrained import layout
from mha_jax.pretrained import weights

U32 = 2.0 ** -24  # float32's unit roundoff
U_BF16 = 2.0 ** -8  # bfloat16's


def rel(a, b):
  """Relative error in norm of `a` against the reference `b`."""
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def model_kwargs(family, batch):
  """The HF batch as the mha_jax model's call arguments."""
  kw = {}
  if family == "bert":
    kw = dict(mask=jnp.asarray(batch["attention_mask"].numpy() == 1),
              token_types=jnp.asarray(batch["token_type_ids"].numpy()))
  return jnp.asarray(batch["input_ids"].numpy()), kw


def run(model, family, batch):
  """`{"main", "stream", "patterns"}` as float64 NumPy arrays: logits (or
  the encoder's output), `[L + 1, B, T, D]` each block's `resid_pre` and
  the last `resid_post`, and `[L, B, H, T, T]` patterns; jitted once."""
  n = model.config.num_layers
  names = tuple(f"blocks.{l}.resid_pre" for l in range(n)) + (
      f"blocks.{n - 1}.resid_post",)
  tokens, kw = model_kwargs(family, batch)
  graphdef, state = nnx.split(model)

  @jax.jit
  def forward(state, tokens, kw):
    m = nnx.merge(graphdef, state)
    return m(tokens, capture=names, return_weights=True, **kw)

  main, acts, weights = forward(state, tokens, kw)
  f64 = lambda x: np.asarray(jnp.asarray(x, jnp.float32), np.float64)
  return dict(main=f64(main), stream=np.stack([f64(acts[s]) for s in names]),
              patterns=f64(weights["self"]))


def as_hf_tensors(model, family):
  """{Hugging Face name: array} of a loaded model's parameters, through
  the family's table backwards (`layout.to_source` is exact)."""
  params = {".".join(map(str, p)): np.asarray(v[...])
            for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  sizes = weights.axis_sizes(model.config)
  out = {}
  for source, rule, paths in weights.expand(family, model.config.num_layers):
    if all(p in params for p in paths):
      out[weights.checkpoint_name(family, source, paths)] = layout.to_source(
          [params[p] for p in paths], rule.src, rule.dst, sizes)
  return out


def assert_tensors_equal_bitwise(ours: dict, theirs: dict) -> None:
  """Two {name: float32 array} dicts hold the same names and bits."""
  assert set(ours) == set(theirs), set(ours) ^ set(theirs)
  for name, want in theirs.items():
    assert ours[name].dtype == want.dtype == np.float32, name
    np.testing.assert_array_equal(ours[name].view(np.uint32),
                                  want.view(np.uint32), err_msg=name)
