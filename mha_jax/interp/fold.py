"""Rewrite a decoder's weights into an equivalent, easier-to-read form.

Shape letters: D d_model, H heads, K key/value heads, Dh, Dv per-head
widths, F MLP width, V vocabulary, P position-table rows, L layers.

Each function takes a `DecoderLM` and returns a NEW one whose logits
equal the old within float32 rounding (the original is not touched):

  fold_layer_norm         a pre-norm's scale g (and LayerNorm's bias
                          beta) moves into the weights that read it:
                          (x_hat g + beta) W + b = x_hat (g W) + (beta W
                          + b); the norm is left with scale 1, bias 0.
  center_writing_weights  every weight that writes to the residual stream
                          loses its mean over D: each reader is a
                          LayerNorm, which subtracts that mean anyway.
  center_unembed          the unembedding loses its mean over V: every
                          logit of a position moves by one constant, so
                          the log-probabilities are unchanged (the logits
                          become the old ones minus their mean over V).

What cannot be done exactly is refused by name (`FoldError`), never
approximated: a post-norm block's norm (BERT) reads the stream itself,
so its scale cannot move anywhere; RMSNorm does not subtract the mean,
so centring the writers would change what it reads; a final soft cap
c tanh(l / c) is not shift-invariant, so centring the unembedding would
change the probabilities. Sandwich blocks (Gemma 2 and 3) fold their
pre-norms; their post-norms N'(f(N x)) normalise a sublayer's output
before it joins the stream, which no linear weight can absorb, and stay
as they are.

A weight that a fold must give a bias it lacks (a LayerNorm's beta
folded into bias-free projections) or that centring changes on one side
of a tied embedding makes the new model's config differ: `use_bias`,
`mlp_bias`, `readout_bias` turn on (new biases start as the folded
terms, those with nothing to hold as 0) and `tie_embeddings` turns off
(the readout keeps the old embedding's values). Everything runs in
float32 and is cast back to each parameter's dtype.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from mha_jax.core import precision
from mha_jax.models.transformer import DecoderLM


class FoldError(ValueError):
  """A conversion this model's architecture does not allow exactly."""


def _flat(model) -> dict:
  """`{path tuple: float32 array}` of the model's parameters."""
  return {p: jnp.asarray(v[...], jnp.float32)
          for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _rebuild(model, config, flat: dict):
  """A new `DecoderLM` of `config` holding `flat`, each cast to its
  parameter's dtype (every parameter of the new model must be given)."""
  abstract = nnx.eval_shape(lambda: DecoderLM(config, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  leaves = []
  for path, var in nnx.to_flat_state(state):
    if path not in flat:
      raise AssertionError(f"fold: no value for {path}")  # a bug here
    leaves.append((path, var.replace(flat[path].astype(var.dtype))))
  return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def _check(model, fn: str, need: dict) -> None:
  """Refuse a non-decoder, or a config field `need` rules out:
  `need = {field: (ok, why)}`."""
  if not isinstance(model, DecoderLM):
    raise TypeError(f"{fn}: `model` must be a DecoderLM, got "
                    f"{type(model).__name__}")
  c = model.config
  bad = [f"{f}={getattr(c, f)!r} ({why})" for f, (ok, why) in need.items()
         if not ok]
  if bad:
    raise FoldError(f"{fn}: cannot be done exactly for this model: "
                    + "; ".join(bad))


def _untie(config, flat: dict) -> tuple:
  """A tied readout as its own weights: `readout.kernel [D, V]` = the
  token embedding's transpose (the config's `tie_embeddings` off)."""
  if not config.tie_embeddings:
    return config, flat
  flat = dict(flat)
  flat[("readout", "kernel")] = flat[("embed", "embed", "embedding")].T
  return config.replace(tie_embeddings=False, readout_bias=False), flat


def _norm(flat, prefix, config):
  """`(g [D], beta [D] or None)`: a norm's effective scale (RMSNorm's
  offset + w: Gemma's 1 + w) and bias; and sets it to the identity."""
  scale = flat[prefix + ("scale",)]
  if config.norm == "rms":
    flat[prefix + ("scale",)] = jnp.full_like(scale, 1.0 - config.norm_offset)
    return config.norm_offset + scale, None
  beta = flat[prefix + ("bias",)]
  flat[prefix + ("scale",)] = jnp.ones_like(scale)
  flat[prefix + ("bias",)] = jnp.zeros_like(beta)
  return scale, beta


def _fold_into(flat, prefix, names, g, beta, bias_names, centre):
  """Fold `g`, `beta` into the reading weights `prefix + name` (input axis
  first, `[D, ...]`), their biases `prefix + bias_name` (`[...]`, made
  from 0 if absent). `centre`: then remove each weight's mean over D."""
  for name, bias_name in zip(names, bias_names):
    w = flat[prefix + name]  # [D, ...]
    g_ = jnp.reshape(g, (-1,) + (1,) * (w.ndim - 1))
    if beta is not None:
      b = flat.get(prefix + bias_name, jnp.zeros(w.shape[1:], jnp.float32))
      flat[prefix + bias_name] = b + precision.tensordot(beta, w, axes=1)
    w = g_ * w
    if centre:
      w = w - jnp.mean(w, axis=0, keepdims=True)
    flat[prefix + name] = w


def fold_layer_norm(model, *, center_reading_weights: bool = True):
  """The model with each pre-norm's scale (and bias) folded into the
  weights that read it; the norms keep their place with scale 1 and bias
  0 (RMSNorm: scale parameter 1 - offset, so offset + w = 1).

  Attention reads the stream through `ln_attn` (w_q, w_k, w_v `[D, H or
  K, Dh]` and b_q, b_k, b_v), the MLP through `ln_mlp` (mlp_in, mlp_gate
  `[D, F]`), the readout through `final_ln` (`[D, V]`; a tied readout is
  untied). With LayerNorm and `center_reading_weights` (as
  TransformerLens's `fold_ln`), each folded weight then loses its mean
  over D, which the normalised input (mean 0) never reads. Sandwich
  blocks keep their post-norms (module docstring).

  Raises FoldError for post-norm blocks (BERT) and a norm after the
  embedding, whose scales act on the stream itself; TypeError for a
  model that is not a `DecoderLM`.
  """
  fn = "fold_layer_norm"
  _check(model, fn, {} if not isinstance(model, DecoderLM) else {
      "norm_placement": (model.config.norm_placement != "post",
                         "a post-norm's scale acts on the residual stream "
                         "itself; no weight reads it alone"),
      "embed_norm": (not model.config.embed_norm,
                     "the embedding's norm writes the stream")})
  c = model.config
  flat = _flat(model)
  layer_norm = c.norm == "layer"
  centre = layer_norm and center_reading_weights
  if layer_norm:  # beta goes into biases, which must exist
    c = c.replace(use_bias=True, out_bias=c.has_out_bias, mlp_bias=True)
  for l in range(c.num_layers):
    block = ("blocks", l)
    g, beta = _norm(flat, block + ("ln_attn",), c)
    _fold_into(flat, block + ("attn",), [("w_q",), ("w_k",), ("w_v",)],
               g, beta, [("b_q",), ("b_k",), ("b_v",)], centre)
    if not c.attention_only:
      g, beta = _norm(flat, block + ("ln_mlp",), c)
      mlp = ["mlp_in"] + (["mlp_gate"] if c.mlp_gated else [])
      _fold_into(flat, block, [(m, "kernel") for m in mlp], g, beta,
                 [(m, "bias") for m in mlp], centre)
      if layer_norm:
        flat.setdefault(block + ("mlp_out", "bias"), jnp.zeros((c.d_model,)))
  if c.final_ln:
    c, flat = _untie(c, flat)
    g, beta = _norm(flat, ("final_ln",), c)
    _fold_into(flat, ("readout",), [("kernel",)], g, beta, [("bias",)],
               centre)
    if beta is not None:
      c = c.replace(readout_bias=True)
  return _rebuild(model, c, flat)


def center_writing_weights(model):
  """The model with every weight that writes to the residual stream
  centred over D: the token embedding `[V, D]` (or the input layer's
  kernel and bias), the learned position and token-type tables `[P, D]`,
  each attention layer's w_o `[H, Dv, D]` and b_o, each MLP's output
  kernel `[F, D]` and bias. A tied readout is untied first (it keeps the
  old embedding). As TransformerLens's `center_writing_weights`.

  Exact because every reader of the stream is a LayerNorm, which removes
  the mean over D first. Raises FoldError where one is not: RMSNorm,
  post-norm or sandwich blocks, no final norm, a norm after the
  embedding; TypeError for a model that is not a `DecoderLM`.
  """
  fn = "center_writing_weights"
  c = getattr(model, "config", None)
  _check(model, fn, {} if not isinstance(model, DecoderLM) else {
      "norm": (c.norm == "layer",
               "RMSNorm does not subtract the mean, so it reads it"),
      "norm_placement": (c.norm_placement == "pre",
                         "only pre-norm blocks read the stream through a "
                         "norm alone"),
      "final_ln": (c.final_ln, "the readout reads the stream directly"),
      "embed_norm": (not c.embed_norm,
                     "the embedding's norm writes the stream")})
  flat = _flat(model)
  c, flat = _untie(c, flat)
  centre = lambda w: w - jnp.mean(w, axis=-1, keepdims=True)
  writers = [("embed", "embed", "embedding"), ("embed", "embed", "kernel"),
             ("embed", "embed", "bias"), ("embed", "pos_embed", "embedding"),
             ("embed", "type_embed", "embedding")]
  for l in range(c.num_layers):
    writers += [("blocks", l, "attn", "w_o"), ("blocks", l, "attn", "b_o"),
                ("blocks", l, "mlp_out", "kernel"),
                ("blocks", l, "mlp_out", "bias")]
  for path in writers:
    if path in flat:
      flat[path] = centre(flat[path])
  return _rebuild(model, c, flat)


def center_unembed(model):
  """The model with the unembedding `[D, V]` and its bias `[V]` centred
  over V (a tied readout is untied first; the embedding is unchanged).

  Each position's logits move by one constant, their mean over V: the new
  logits are the old minus that mean, the log-probabilities are the same
  (TransformerLens's `center_unembed`). Raises FoldError for a final soft
  cap (c tanh(l / c) does not commute with the shift) and regression
  outputs (`output_dim` > 0: no softmax); TypeError for a model that is
  not a `DecoderLM`.
  """
  fn = "center_unembed"
  c = getattr(model, "config", None)
  _check(model, fn, {} if not isinstance(model, DecoderLM) else {
      "final_soft_cap": (c.final_soft_cap is None,
                         "a soft cap does not commute with shifting the "
                         "logits"),
      "output_dim": (c.output_dim == 0, "regression outputs have no "
                     "softmax to leave unchanged")})
  flat = _flat(model)
  c, flat = _untie(c, flat)
  for path in (("readout", "kernel"), ("readout", "bias")):
    if path in flat:
      flat[path] = flat[path] - jnp.mean(flat[path], axis=-1, keepdims=True)
  return _rebuild(model, c, flat)
