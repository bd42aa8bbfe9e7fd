"""Bad input gets a clear error: the argument, what was expected, what came.

Every case checks the message (which names the argument), and every case
also runs under jax.jit: the checks look only at shapes, dtypes and Python
values, so the same error comes while tracing, before anything reaches XLA.
(Arrays a case closes over are constants of the trace, not tracers, so the
cache's value check of `lengths` runs under jit too.)
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mha_jax
from mha_jax import hooks

D, H = 8, 4


def _params(**kw):
  return mha_jax.init_mha_params(jax.random.key(0), D, H, **kw)


P = _params()
P_GQA = _params(num_kv_heads=2)
P_BIAS = _params(use_bias=True)
X = jnp.ones((2, 3, D))
CACHE = mha_jax.init_cache_for(P_GQA, 2, 8)
KEY = jax.random.key(1)
Q4 = jnp.ones((1, 3, 4, 2))  # [B, T, H, Dh]
KV4 = jnp.ones((1, 3, 2, 2))  # [B, T, K, Dh]
Q2 = jnp.ones((3, 2))  # one head [T, Dh]
LENGTHS_ABOVE_T = jnp.array([1, 4])  # built outside the traced call: known


def _without(params, *names):
  return {k: v for k, v in params.items() if k not in names}


mha = mha_jax.multi_head_attention
attend = mha_jax.attend
sdpa = mha_jax.scaled_dot_product_attention
cached = mha_jax.cached_attention
rotary = mha_jax.apply_rotary

# (description, call, exception type, regex the message must match)
MHA_CASES = [
    ("x_q rank 4", lambda: mha(P, X[None]),
     ValueError, r"`x_q` must have shape \[B, T, D\] or \[T, D\], got "
     r"\(1, 2, 3, 8\)"),
    ("x_q rank 1", lambda: mha(P, jnp.ones(D)),
     ValueError, r"`x_q` must have shape"),
    ("integer tokens", lambda: mha(P, jnp.ones((2, 3, D), jnp.int32)),
     TypeError, r"`x_q` must be floating .*got int32"),
    ("feature size vs params", lambda: mha(P, jnp.ones((2, 3, 5))),
     ValueError, r"`x_q` has feature size 5 but params expect d_model=8"),
    ("x_kv feature size", lambda: mha(P, X, jnp.ones((2, 4, 6))),
     ValueError, r"`x_kv` has feature size 6"),
    ("batch sizes disagree", lambda: mha(P, X, jnp.ones((3, 4, D))),
     ValueError, r"batch sizes differ: `x_q` \(2, 3, 8\), `x_kv` \(3, 4, 8\)"),
    ("batched vs unbatched", lambda: mha(P, X, jnp.ones((4, D))),
     ValueError, r"`x_q` \(2, 3, 8\) and `x_kv` \(4, 8\) must both be "
     r"batched or both not"),
    ("mask does not broadcast", lambda: mha(P, X, mask=jnp.ones((2, 2), bool)),
     ValueError, r"`mask` of shape \(2, 2\) does not broadcast to "
     r"\[2, 4, 3, 3\]"),
    ("float mask", lambda: mha(P, X, mask=jnp.zeros((3, 3))),
     TypeError, r"`mask` must be boolean .*got float32.*pass it as `bias=`"),
    ("integer mask", lambda: mha(P, X, mask=jnp.ones((3, 3), jnp.int32)),
     TypeError, r"`mask` must be boolean .*got int32"),
    ("bool bias", lambda: mha(P, X, bias=jnp.ones((3, 3), bool)),
     TypeError, r"`bias` must be floating, got bool"),
    ("bias does not broadcast", lambda: mha(P, X, bias=jnp.ones((5, 3))),
     ValueError, r"`bias` of shape \(5, 3\) does not broadcast"),
    ("unknown implementation", lambda: mha(P, X, implementation="fast"),
     ValueError, r"unknown `implementation`='fast'; expected one of .*"
     r"'einsum'.*'vmap'"),
    ("head_mask length", lambda: mha(P, X, head_mask=jnp.ones(3)),
     ValueError, r"multi_head_attention: `head_mask` must have shape "
     r"\[H\]=\[4\] or \[B, H\]=\[2, 4\], got \(3,\)"),
    ("head_mask batch", lambda: mha(P, X, head_mask=jnp.ones((3, H))),
     ValueError, r"`head_mask` must have shape .*got \(3, 4\)"),
    ("params w_o wrong shape", lambda: mha(dict(P, w_o=jnp.ones((H, 3, D))),
                                           X),
     ValueError, r"`params\['w_o'\]` must have shape \(4, 2, 8\)"),
    ("params K does not divide H", lambda: mha(
        dict(P, w_k=jnp.ones((D, 3, 2)), w_v=jnp.ones((D, 3, 2))), X),
     ValueError, r"K=3 .* must divide query heads H=4"),
    ("integer params", lambda: mha(dict(P, w_q=jnp.ones((D, H, 2), jnp.int32)),
                                   X),
     TypeError, r"`params\['w_q'\]` must be floating, got int32"),
    ("params missing w_o", lambda: mha(_without(P, "w_o"), X),
     ValueError, r"`params` is missing \['w_o'\]"),
    ("params unknown key", lambda: mha(dict(P, w_x=P["w_q"]), X),
     ValueError, r"`params` has unknown key 'w_x'"),
    ("params wrong rank", lambda: mha(dict(P, w_q=jnp.ones((D, 8))), X),
     ValueError, r"`params\['w_q'\]` must have rank 3, got shape \(8, 8\)"),
    ("params bias wrong rank", lambda: mha(dict(P_BIAS, b_o=jnp.ones((1, D))),
                                           X),
     ValueError, r"`params\['b_o'\]` must have rank 1, got shape \(1, 8\)"),
    ("params partial biases", lambda: mha(_without(P_BIAS, "b_k", "b_v",
                                                   "b_o"), X),
     ValueError, r"`params` has biases \['b_q'\]; give all of b_q, b_k, b_v,"
     r" b_o, or b_q, b_k, b_v, or none"),
    ("params not a dict", lambda: mha(list(P.values()), X),
     TypeError, r"`params` must be a dict from init_mha_params, got list"),
    ("mha_dims missing keys", lambda: mha_jax.mha_dims(_without(P, "w_k",
                                                                "w_v")),
     ValueError, r"`params` is missing \['w_k', 'w_v'\]"),
]

ATTEND_CASES = [
    ("attend batch sizes", lambda: attend(Q4, jnp.ones((2, 3, 2, 2)),
                                          jnp.ones((2, 3, 2, 2))),
     ValueError, r"attend: batch sizes differ: q \(1, 3, 4, 2\), k "
     r"\(2, 3, 2, 2\), v \(2, 3, 2, 2\)"),
    ("attend k/v lengths", lambda: attend(Q4, KV4, jnp.ones((1, 4, 2, 2))),
     ValueError, r"attend: k \(1, 3, 2, 2\) and v \(1, 4, 2, 2\) must agree "
     r"in batch, length and kv heads"),
    ("attend k/v heads", lambda: attend(Q4, KV4, jnp.ones((1, 3, 1, 2))),
     ValueError, r"attend: k \(1, 3, 2, 2\) and v \(1, 3, 1, 2\) must agree"),
    ("attend q/k widths", lambda: attend(Q4, jnp.ones((1, 3, 2, 3)),
                                         jnp.ones((1, 3, 2, 3))),
     ValueError, r"attend: q and k head widths differ: q \(1, 3, 4, 2\), k "
     r"\(1, 3, 2, 3\)"),
    ("attend v rank", lambda: attend(Q4, KV4, jnp.ones((3, 2, 2))),
     ValueError, r"attend: `v` must have rank 4 \(\[B, T, heads, dim\]\), "
     r"got shape \(3, 2, 2\)"),
    ("attend integer k", lambda: attend(Q4, KV4.astype(jnp.int32), KV4),
     TypeError, r"attend: `k` must be floating, got int32"),
    ("attend K does not divide H", lambda: attend(
        Q4, jnp.ones((1, 3, 3, 2)), jnp.ones((1, 3, 3, 2))),
     ValueError, r"kv heads K=3 must divide query heads H=4"),
    ("attend dropout without rng", lambda: attend(Q4, Q4, Q4,
                                                  dropout_rate=0.1),
     ValueError, r"`dropout_rate` > 0 needs `dropout_rng`"),
    ("attend dropout rate 1", lambda: attend(Q4, Q4, Q4, dropout_rate=1.0),
     ValueError, r"`dropout_rate` must be in \[0, 1\), got 1.0"),
    ("xla refuses dropout", lambda: attend(
        Q4, Q4, Q4, implementation="xla", dropout_rate=0.1, dropout_rng=KEY),
     ValueError, r"^attend: implementation='xla' has no attention dropout "
     r"\(jax.nn.dot_product_attention has none\); use dropout_rate=0 or one "
     r"of \['auto', 'einsum', 'vmap'\]"),
    ("xla refuses mixed dtypes", lambda: attend(
        Q4.astype(jnp.bfloat16), Q4, Q4, implementation="xla"),
     ValueError, r"^attend: implementation='xla' cannot take this call: q, "
     r"k, v must share one dtype, got bfloat16, float32, float32; use "
     r"'auto' or 'flash'"),
    ("xla refuses Dv != Dh", lambda: attend(Q4, Q4, jnp.ones((1, 3, 4, 3)),
                                            implementation="xla"),
     ValueError, r"^attend: implementation='xla' cannot take this call: "
     r"mha_jax's jax.nn.dot_product_attention adapter needs value width Dv "
     r"== Dh, got Dv=3, Dh=2; use 'auto' or 'flash'"),
    ("flash refuses dropout", lambda: attend(
        Q4, Q4, Q4, implementation="flash", dropout_rate=0.1,
        dropout_rng=KEY),
     ValueError, r"^attend: implementation='flash' has no attention dropout "
     r"\(it never forms the weights to drop\); use dropout_rate=0 or one of "
     r"\['auto', 'einsum', 'vmap'\]"),
    ("single head q rank", lambda: sdpa(Q2[None], Q2, Q2),
     ValueError, r"`q` must have rank 2 \(\[T, Dh\]\); got shape "
     r"\(1, 3, 2\)"),
    ("single head integer k", lambda: sdpa(Q2, Q2.astype(jnp.int32), Q2),
     TypeError, r"`k` must be floating, got int32"),
    ("single head q/k widths", lambda: sdpa(Q2, jnp.ones((3, 4)), Q2),
     ValueError, r"q and k widths differ: q \(3, 2\), k \(3, 4\)"),
    ("single head k/v lengths", lambda: sdpa(Q2, Q2, jnp.ones((4, 2))),
     ValueError, r"scaled_dot_product_attention: k and v lengths differ: "
     r"k \(3, 2\), v \(4, 2\)"),
    ("single head float mask", lambda: sdpa(
        Q2, Q2, Q2, mask=np.where(np.eye(3), 0.0, -np.inf)),
     TypeError, r"`mask` must be boolean .*pass it as `bias=`"),
]

CACHE_CASES = [
    ("cache x rank 2", lambda: cached(P_GQA, X[:, 0], CACHE),
     ValueError, r"cached_attention: `x` must have shape \[B, T, D\] with "
     r"D=8, got \(2, 8\)"),
    ("cache x feature size", lambda: cached(P_GQA, jnp.ones((2, 3, 5)),
                                            CACHE),
     ValueError, r"`x` must have shape \[B, T, D\] with D=8, got "
     r"\(2, 3, 5\)"),
    ("cache not a KVCache", lambda: cached(P_GQA, X, (CACHE.k, CACHE.v)),
     TypeError, r"cached_attention: `cache` must be a KVCache \(see "
     r"init_cache\), got tuple"),
    ("cache of other params", lambda: cached(
        P_GQA, X, mha_jax.init_cache(2, 8, 4, 2)),
     ValueError, r"`cache.k` must have shape \(2, 8, 2, 2\)"),
    ("cache of other batch", lambda: cached(P_GQA, X[:1], CACHE),
     ValueError, r"`cache.k` must have shape \(1, 8, 2, 2\)"),
    ("lengths shape", lambda: cached(P_GQA, X, CACHE,
                                     lengths=jnp.array([1, 2, 3])),
     ValueError, r"`lengths` must be an int array of shape \[2\], got "
     r"int32 \(3,\)"),
    ("lengths float", lambda: cached(P_GQA, X, CACHE,
                                     lengths=jnp.array([1.0, 2.0])),
     ValueError, r"`lengths` must be an int array of shape \[2\], got "
     r"float32"),
    ("lengths above T", lambda: cached(P_GQA, X, CACHE,
                                       lengths=LENGTHS_ABOVE_T),
     ValueError, r"`lengths` must lie in \[0, T=3\], got \[1 4\]"),
    ("lengths negative", lambda: cached(P_GQA, X, CACHE, lengths=[-1, 2]),
     ValueError, r"`lengths` must lie in \[0, T=3\]"),
    ("init_cache max_len", lambda: mha_jax.init_cache(2, 0, 1, 4),
     ValueError, r"init_cache: `max_len` must be a positive int, got 0"),
]

ROTARY_CASES = [
    ("rotary x rank", lambda: rotary(jnp.ones((3, 4, 2)), jnp.arange(3)),
     ValueError, r"apply_rotary: `x` must be \[B, T, H, Dh\], got "
     r"\(3, 4, 2\)"),
    ("rotary odd width", lambda: rotary(jnp.ones((1, 3, 2, 5)),
                                        jnp.arange(3)),
     ValueError, r"apply_rotary: head width must be even, got Dh=5"),
    ("rotary positions length", lambda: rotary(jnp.ones((1, 3, 2, 4)),
                                               jnp.arange(4)),
     ValueError, r"apply_rotary: `positions` must be \[B, T\] or \[T\] with "
     r"T=3, got \(4,\)"),
    ("rotary positions rank", lambda: rotary(jnp.ones((1, 3, 2, 4)),
                                             jnp.zeros((1, 1, 3))),
     ValueError, r"`positions` must be \[B, T\] or \[T\] with T=3, got "
     r"\(1, 1, 3\)"),
]


def _init(**kwargs):
  return lambda: mha_jax.init_mha_params(jax.random.key(0), **kwargs)


INIT_CASES = [
    ("d_model not divisible", _init(d_model=10, num_heads=3), ValueError,
     r"`d_model`=10 is not divisible by `num_heads`=3; pass `head_dim`"),
    ("num_kv_heads does not divide", _init(d_model=8, num_heads=4,
                                           num_kv_heads=3), ValueError,
     r"`num_kv_heads`=3 must divide `num_heads`=4"),
    ("d_model zero", _init(d_model=0, num_heads=4), ValueError,
     r"`d_model` must be a positive int, got 0"),
    ("num_heads float", _init(d_model=8, num_heads=2.0), ValueError,
     r"`num_heads` must be a positive int, got 2.0"),
    ("num_kv_heads zero", _init(d_model=8, num_heads=4, num_kv_heads=0),
     ValueError, r"`num_kv_heads` must be a positive int, got 0"),
    ("head_dim zero", _init(d_model=8, num_heads=4, head_dim=0), ValueError,
     r"`head_dim` must be a positive int, got 0"),
    ("integer dtype", _init(d_model=8, num_heads=2, dtype=jnp.int32),
     TypeError, r"`dtype` must be floating"),
]

# Patches whose heads, positions or value do not fit the site: the sizes
# are static shapes, so these fail while tracing, naming the site.
_Z = r"z \[B, Tq, H, Dv\]=\[2, 3, 4, 2\]"
HOOK_CASES = [
    ("patch heads past the end", lambda: mha(
        P, X, patch=hooks.ablate("z", heads=4)),
     ValueError, rf"hook site 'z': `heads`=4, out of range for axis 2 \(H\) "
     rf"of {_Z}, of size 4: use 0\.\.3, or -4\.\.-1 counting from the end"),
    ("patch heads before the start", lambda: mha(
        P, X, patch=hooks.ablate("z", heads=[0, -5])),
     ValueError, rf"hook site 'z': `heads`=\[0, -5\] holds -5, out of range "
     rf"for axis 2 \(H\) of {_Z}, of size 4"),
    ("patch positions past the end", lambda: mha(
        P, X, patch=hooks.ablate("q", positions=3)),
     ValueError, r"hook site 'q': `positions`=3, out of range for axis 1 "
     r"\(Tq\) of q \[B, Tq, H, Dh\]=\[2, 3, 4, 2\], of size 3"),
    ("patch kv heads past the end", lambda: mha(
        P_GQA, X, patch=hooks.ablate("v", heads=2)),
     ValueError, r"hook site 'v': `heads`=2, out of range for axis 2 \(K\) "
     r"of v \[B, Tk, K, Dv\]=\[2, 3, 2, 2\], of size 2"),
    ("patch pattern positions", lambda: mha(
        P, X, patch=hooks.ablate("pattern", positions=-4)),
     ValueError, r"hook site 'pattern': `positions`=-4, out of range for axis "
     r"2 \(Tq\) of pattern \[B, H, Tq, Tk\]=\[2, 4, 3, 3\], of size 3"),
    ("patch value of another T", lambda: mha(
        P, X, patch=hooks.replace("z", jnp.ones((2, 5, 2)), heads=1)),
     ValueError, r"hook site 'z': `replace`'s value has shape \[2, 5, 2\], "
     r"which must be a scalar or fit \[B, Tq, H, Dv\]=\[2, 3, 4, 2\] or "
     r"\[B, Tq, Dv\]=\[2, 3, 2\]"),
    ("patch unknown site with heads", lambda: mha(
        P, X, patch=hooks.ablate("zz", heads=1)),
     ValueError, r"unknown hook site 'zz' \(did you mean 'z'\?\)"),
]

CASES = (MHA_CASES + HOOK_CASES + ATTEND_CASES + CACHE_CASES + ROTARY_CASES
         + INIT_CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_rejected_naming_the_argument(case):
  _, call, exc, match = case
  with pytest.raises(exc, match=match):
    call()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_errors_are_the_same_under_jit(case):
  _, call, exc, match = case
  with pytest.raises(exc, match=match):
    jax.jit(call)()


def test_case_names_are_unique():
  names = [c[0] for c in CASES]
  assert len(names) == len(set(names))


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
