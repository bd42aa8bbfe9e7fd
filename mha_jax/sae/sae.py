"""Sparse autoencoders: ReLU with an L1 penalty, and TopK.

Shape letters: N examples (tokens), D input width (H * Dv for `z`),
F dictionary features.

One SAE is a params dict of arrays:
  w_enc [D, F], b_enc [F], w_dec [F, D] (unit-norm rows), b_dec [D].
The pre-encoder bias is the decoder's: the input is centred by `b_dec`
before encoding (Bricken et al. 2023, Kissane et al. 2024), so
`pre = (x - b_dec) @ w_enc + b_enc` and `x_hat = f @ w_dec + b_dec`.

Kinds:
  "relu": f = ReLU(pre); loss = |x - x_hat|^2 + l1 * sum_f f_f |w_dec_f|
    (the decoder rows have unit norm, so the L1 term is sum_f f_f).
  "topk": f keeps the k largest of ReLU(pre) and zeroes the rest (Gao et
    al. 2024); loss = |x - x_hat|^2 + aux_coef * AuxK, where AuxK asks the
    `aux_k` largest pre-activations of the dead features to reconstruct
    what the live ones missed (Gao et al.'s remedy for dead latents).
  "batchtopk": in training, f keeps the k * N largest of ReLU(pre) over
    the whole batch (Bussmann et al. 2024), so a token may use more or
    fewer than k features while the batch averages k; the loss is TopK's.
    A batch is not there at inference, so the SAE carries a threshold,
    `params["threshold"] [F]` (one value, repeated), the moving average of
    the smallest activation each training batch kept; encoding is then
    JumpReLU with it, f = ReLU(pre) * [pre > threshold], token by token.
  "jumprelu": f = ReLU(pre) * [pre > threshold_f], a threshold per feature
    (Rajamanoharan et al. 2024; Gemma Scope's SAEs). Encoded only: such
    SAEs come from SAELens (`saelens.load_saelens`); training one is refused
    since its straight-through threshold gradients are not implemented.
Losses are means over the N examples of sums over D (or F).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mha_jax.core import precision

KINDS = ("relu", "topk", "batchtopk", "jumprelu")
TRAINABLE = ("relu", "topk", "batchtopk")
# Kinds trained with k features per token (on average, for BatchTopK),
# and kinds whose encoding reads `params["threshold"]`.
TOPK_KINDS = ("topk", "batchtopk")
THRESHOLDED = ("batchtopk", "jumprelu")


def check_kind(kind: str, k: int | None = None) -> None:
  """Raise naming `kind` (and `k` for the TopK kinds) when they are not
  usable."""
  if kind not in KINDS:
    raise ValueError(f"sae kind: expected one of {KINDS}, got {kind!r}")
  if kind in TOPK_KINDS and (not isinstance(k, int) or k < 1):
    raise ValueError(f"sae kind {kind!r}: `k` must be a positive int, got "
                     f"{k!r}")


def init(key, d_in: int, d_sae: int) -> dict:
  """Random unit-norm decoder rows, the encoder their transpose (Gao et al.:
  a tied start avoids early dead features), zero biases."""
  for name, n in (("d_in", d_in), ("d_sae", d_sae)):
    if not isinstance(n, int) or n < 1:
      raise ValueError(f"sae.init: `{name}` must be a positive int, got {n!r}")
  w_dec = jax.random.normal(key, (d_sae, d_in), jnp.float32)
  w_dec = w_dec / jnp.linalg.norm(w_dec, axis=1, keepdims=True)
  return {"w_enc": w_dec.T, "b_enc": jnp.zeros((d_sae,), jnp.float32),
          "w_dec": w_dec, "b_dec": jnp.zeros((d_in,), jnp.float32)}


def pre_acts(params, x):
  """`[N, D] -> [N, F]`: the features' pre-activations."""
  pre = precision.matmul(x - params["b_dec"][None], params["w_enc"])
  return pre + params["b_enc"][None]


def activate(pre, *, kind: str, k: int | None = None, threshold=None):
  """`[N, F] -> [N, F]`: the features from their pre-activations, as an
  encoder uses them (a "batchtopk" SAE by its threshold, `batch_topk` is
  its training form). `threshold [F]`: the thresholded kinds'."""
  if kind in THRESHOLDED:
    if threshold is None:
      raise ValueError(f"sae kind {kind!r}: the params need a "
                       f"'threshold' [F], got none")
    # ReLU and the jump both, as SAELens encodes (the two agree wherever
    # the threshold is >= 0, as trained thresholds are).
    return jnp.where(pre > threshold[None], jax.nn.relu(pre), 0.0)
  f = jax.nn.relu(pre)
  if kind == "relu":
    return f
  return keep_largest(f, k)  # TopK


def batch_topk(pre, k: int):
  """`[N, F] -> [N, F]`: the k * N largest of ReLU(pre) over the whole
  batch kept, the rest zero (BatchTopK's training activation)."""
  f = jax.nn.relu(pre)
  return keep_largest(f.reshape(1, -1), k * f.shape[0]).reshape(f.shape)


def keep_largest(f, k: int):
  """`[M, F] -> [M, F]`: each row's k largest entries of `f` kept and the
  rest zero, ties broken by index as `lax.top_k` breaks them (the same
  entries top_k returns, and the same gradient).

  Kept as a mask on `f`: an entry stays if it is above the row's k-th
  largest value, or equal to it at an index no later than the last index
  top_k took at that value. Scattering top_k's values into zeros, the
  direct way, made the TopK SAE step about twice as slow on a CPU (the
  scatter, and the gather of its gradient, at 64 -> 2048). XLA runs its
  top-k kernel only when top_k's values and indices are read whole: a
  slice of either compiles to a full sort of every row, so the k-th value
  is taken as their minimum.
  """
  vals, idx = jax.lax.top_k(f, k)  # [M, k]
  kth = jnp.min(vals, -1, keepdims=True)  # [M, 1]
  last = jnp.max(jnp.where(vals == kth, idx, -1), -1, keepdims=True)
  kth, last = jax.lax.stop_gradient(kth), jax.lax.stop_gradient(last)
  index = jax.lax.broadcasted_iota(jnp.int32, f.shape, 1)
  # A NaN is kept so that it reaches the loss, as it did when top_k's
  # values were scattered (comparisons with NaN are false: the mask
  # alone would drop it, and the loss would hide it).
  keep = (f > kth) | ((f == kth) & (index <= last)) | jnp.isnan(f)
  return jnp.where(keep, f, jnp.zeros_like(f))


def encode(params, x, *, kind: str, k: int | None = None):
  """`[N, D] -> [N, F]`."""
  return activate(pre_acts(params, x), kind=kind, k=k,
                  threshold=params.get("threshold"))


def decode(params, f):
  """`[N, F] -> [N, D]`."""
  return precision.matmul(f, params["w_dec"]) + params["b_dec"][None]


def reconstruct(params, x, *, kind: str, k: int | None = None):
  """`[N, D] -> [N, D]`: the SAE's reconstruction of x."""
  return decode(params, encode(params, x, kind=kind, k=k))


def loss(params, x, *, kind: str, l1: float = 0.0, k: int | None = None,
         dead=None, aux_k: int = 0, aux_coef: float = 0.0):
  """`(loss, {"mse", "sparsity", "aux", "l0", "fired" [F], "kept_min"})`
  of a batch `x [N, D]` ("fired": which features were active on any
  example; "kept_min": the smallest activation kept, inf if none).

  `dead [F]` bool marks the features that have not fired for a while
  (TopK's AuxK uses them; ignored by "relu" and when aux_k is 0).
  """
  if kind not in TRAINABLE:
    raise ValueError(f"sae loss: kind {kind!r} is not trained here; "
                     f"expected one of {TRAINABLE}")
  pre = pre_acts(params, x)
  f = (batch_topk(pre, k) if kind == "batchtopk"
       else activate(pre, kind=kind, k=k))
  err = x - decode(params, f)  # [N, D]
  mse = jnp.mean(jnp.sum(err ** 2, -1))
  dec_norm = jnp.linalg.norm(params["w_dec"], axis=1)  # [F], 1 after renorm
  sparsity = jnp.mean(jnp.sum(f * dec_norm[None], -1))
  aux = jnp.zeros((), jnp.float32)
  if kind in TOPK_KINDS and aux_k and dead is not None:
    def aux_loss(_):
      # The dead features' largest pre-activations reconstruct the error
      # (no decoder bias: it is the live features' residual).
      masked = jnp.where(dead[None], jax.nn.relu(pre), 0.0)
      f_aux = activate(masked, kind="topk", k=min(aux_k, pre.shape[-1]))
      err_aux = (jax.lax.stop_gradient(err)
                 - precision.matmul(f_aux, params["w_dec"]))
      return jnp.mean(jnp.sum(err_aux ** 2, -1))
    # Zero when nothing is dead, as in Gao et al.; `cond` skips the second
    # top-k, the slowest part of a TopK step on a CPU, in that case.
    aux = jax.lax.cond(jnp.any(dead), aux_loss, lambda _: aux, None)
  total = mse + (l1 * sparsity if kind == "relu" else aux_coef * aux)
  # The smallest activation kept (BatchTopK's threshold follows it; inf
  # when nothing fired).
  kept_min = jnp.min(jnp.where(f > 0, f, jnp.inf))
  return total, {"mse": mse, "sparsity": sparsity, "aux": aux,
                 "l0": jnp.mean(jnp.sum(f > 0, -1)),
                 "fired": jnp.any(f > 0, axis=0), "kept_min": kept_min}


def normalize_decoder(params) -> dict:
  """The params with every decoder row scaled to unit norm."""
  w = params["w_dec"]
  return {**params, "w_dec": w / jnp.linalg.norm(w, axis=1, keepdims=True)}


def project_decoder_grad(grads, params) -> dict:
  """The gradient with each decoder row's component along that row
  removed: a step along it would only change the row's norm, which the
  renormalisation undoes, so it is wasted (and, with Adam, distorts the
  step sizes of the other directions)."""
  w, g = params["w_dec"], grads["w_dec"]
  parallel = jnp.sum(g * w, axis=1, keepdims=True) * w
  return {**grads, "w_dec": g - parallel}
