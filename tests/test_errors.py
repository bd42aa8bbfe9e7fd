"""Bad input gets a clear error: the argument, what was expected, what came.

Each case checks the message, and that the same error comes under jax.jit
(raised while checking shapes, before anything reaches XLA).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mha_jax

D, H = 8, 4


def _params(**kw):
  return mha_jax.init_mha_params(jax.random.key(0), D, H, **kw)


P = _params()
X = jnp.ones((2, 3, D))

# (description, call, exception type, regex the message must match)
MHA_CASES = [
    ("x_q rank 4", lambda: mha_jax.multi_head_attention(P, X[None]),
     ValueError, r"`x_q` must have shape \[B, T, D\] or \[T, D\], got "
     r"\(1, 2, 3, 8\)"),
    ("x_q rank 1", lambda: mha_jax.multi_head_attention(P, jnp.ones(D)),
     ValueError, r"`x_q` must have shape"),
    ("integer tokens", lambda: mha_jax.multi_head_attention(
        P, jnp.ones((2, 3, D), jnp.int32)),
     TypeError, r"`x_q` must be floating .*got int32"),
    ("feature size vs params", lambda: mha_jax.multi_head_attention(
        P, jnp.ones((2, 3, 5))),
     ValueError, r"`x_q` has feature size 5 but params expect d_model=8"),
    ("x_kv feature size", lambda: mha_jax.multi_head_attention(
        P, X, jnp.ones((2, 4, 6))),
     ValueError, r"`x_kv` has feature size 6"),
    ("batch sizes disagree", lambda: mha_jax.multi_head_attention(
        P, X, jnp.ones((3, 4, D))),
     ValueError, r"batch sizes differ: `x_q` \(2, 3, 8\), `x_kv` \(3, 4, 8\)"),
    ("batched vs unbatched", lambda: mha_jax.multi_head_attention(
        P, X, jnp.ones((4, D))),
     ValueError, r"must both be batched or both not"),
    ("mask does not broadcast", lambda: mha_jax.multi_head_attention(
        P, X, mask=jnp.ones((2, 2), bool)),
     ValueError, r"`mask` of shape \(2, 2\) does not broadcast to "
     r"\[2, 4, 3, 3\]"),
    ("float mask", lambda: mha_jax.multi_head_attention(
        P, X, mask=jnp.zeros((3, 3))),
     TypeError, r"`mask` must be boolean .*got float32.*pass it as `bias=`"),
    ("integer mask", lambda: mha_jax.multi_head_attention(
        P, X, mask=jnp.ones((3, 3), jnp.int32)),
     TypeError, r"`mask` must be boolean .*got int32"),
    ("bool bias", lambda: mha_jax.multi_head_attention(
        P, X, bias=jnp.ones((3, 3), bool)),
     TypeError, r"`bias` must be floating, got bool"),
    ("bias does not broadcast", lambda: mha_jax.multi_head_attention(
        P, X, bias=jnp.ones((5, 3))),
     ValueError, r"`bias` of shape \(5, 3\) does not broadcast"),
    ("unknown implementation", lambda: mha_jax.multi_head_attention(
        P, X, implementation="fast"),
     ValueError, r"unknown `implementation`='fast'; expected one of .*"
     r"'einsum'.*'vmap'"),
    ("params w_o wrong shape", lambda: mha_jax.multi_head_attention(
        dict(P, w_o=jnp.ones((H, 3, D))), X),
     ValueError, r"`params\['w_o'\]` must have shape \(4, 2, 8\)"),
    ("params K does not divide H", lambda: mha_jax.multi_head_attention(
        dict(P, w_k=jnp.ones((D, 3, 2)), w_v=jnp.ones((D, 3, 2))), X),
     ValueError, r"K=3 .* must divide query heads H=4"),
    ("integer params", lambda: mha_jax.multi_head_attention(
        dict(P, w_q=jnp.ones((D, H, 2), jnp.int32)), X),
     TypeError, r"`params\['w_q'\]` must be floating, got int32"),
]


@pytest.mark.parametrize("case", MHA_CASES, ids=[c[0] for c in MHA_CASES])
def test_multi_head_attention_rejects(case):
  _, call, exc, match = case
  with pytest.raises(exc, match=match):
    call()


@pytest.mark.parametrize("case", MHA_CASES[::3], ids=[c[0] for c in
                                                      MHA_CASES[::3]])
def test_errors_are_the_same_under_jit(case):
  _, call, exc, match = case
  with pytest.raises(exc, match=match):
    jax.jit(call)()


INIT_CASES = [
    (dict(d_model=10, num_heads=3), r"`d_model`=10 is not divisible by "
     r"`num_heads`=3; pass `head_dim`"),
    (dict(d_model=8, num_heads=4, num_kv_heads=3),
     r"`num_kv_heads`=3 must divide `num_heads`=4"),
    (dict(d_model=0, num_heads=4), r"`d_model` must be a positive int, got 0"),
    (dict(d_model=8, num_heads=2, dtype=jnp.int32),
     r"`dtype` must be floating"),
]


@pytest.mark.parametrize("kwargs,match", INIT_CASES)
def test_init_mha_params_rejects(kwargs, match):
  with pytest.raises((ValueError, TypeError), match=match):
    mha_jax.init_mha_params(jax.random.key(0), **kwargs)


def test_init_mha_params_shapes():
  # eval_shape: shapes without running (or compiling) the initialiser.
  p = jax.eval_shape(lambda key: mha_jax.init_mha_params(
      key, 12, 6, num_kv_heads=2, use_bias=True), jax.random.key(0))
  shapes = {k: v.shape for k, v in p.items()}
  assert shapes == {"w_q": (12, 6, 2), "w_k": (12, 2, 2), "w_v": (12, 2, 2),
                    "w_o": (6, 2, 12), "b_q": (6, 2), "b_k": (2, 2),
                    "b_v": (2, 2), "b_o": (12,)}
  # head_dim overrides D // H when D is not divisible by H.
  p = jax.eval_shape(lambda key: mha_jax.init_mha_params(
      key, 10, 3, head_dim=4), jax.random.key(0))
  assert p["w_q"].shape == (10, 3, 4)


def test_single_head_and_attend_reject_bad_ranks_and_dtypes():
  q = jnp.ones((3, 2))
  with pytest.raises(ValueError, match=r"`q` must have rank 2 \(\[T, Dh\]\); "
                     r"got shape \(1, 3, 2\)"):
    mha_jax.scaled_dot_product_attention(q[None], q, q)
  with pytest.raises(TypeError, match=r"`k` must be floating, got int32"):
    mha_jax.scaled_dot_product_attention(q, q.astype(jnp.int32), q)
  with pytest.raises(ValueError, match=r"q and k widths differ"):
    mha_jax.scaled_dot_product_attention(q, jnp.ones((3, 4)), q)
  q4 = jnp.ones((1, 3, 4, 2))
  with pytest.raises(ValueError, match=r"`v` must have rank 4"):
    mha_jax.attend(q4, jnp.ones((1, 3, 2, 2)), jnp.ones((3, 2, 2)))
  with pytest.raises(ValueError, match=r"kv heads K=3 must divide query heads"
                     r" H=4"):
    mha_jax.attend(q4, jnp.ones((1, 3, 3, 2)), jnp.ones((1, 3, 3, 2)))
  with pytest.raises(ValueError, match=r"`dropout_rate` > 0 needs"):
    mha_jax.attend(q4, q4, q4, dropout_rate=0.1)
  with pytest.raises(ValueError, match=r"`dropout_rate` must be in \[0, 1\)"):
    mha_jax.attend(q4, q4, q4, dropout_rate=1.0)


def test_float_mask_error_points_to_bias_in_single_head_too():
  q = jnp.ones((3, 2))
  with pytest.raises(TypeError, match=r"pass it as `bias=`"):
    mha_jax.scaled_dot_product_attention(
        q, q, q, mask=np.where(np.eye(3), 0.0, -np.inf))
