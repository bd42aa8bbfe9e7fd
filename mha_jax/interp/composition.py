"""Weight-based circuit scores: composition, copying, direct logit attribution.

Shape letters: L layers, H heads (K key/value heads), D d_model, Dh, Dv
per-head widths, V vocabulary, N a subset of token ids, B batch, T length.

Row vectors throughout (x @ W, as the model computes). Head h of layer l
reads the residual stream through a LayerNorm with scale g_l. Its

  OV circuit  M    = diag(g_l) W_V^h W_O^h P                    [D, D]
  QK circuit  A(d) = diag(g_l) W_Q^h R(d) W_K^h^T diag(g_l)      [D, D]

map the normalised residual stream to what the head writes, and a query
and a key to their score (times 1/sqrt(Dh)). P = I - 11^T/D: the
LayerNorm that a later head or the readout reads through subtracts the
mean over D, so whatever a head writes along 1 reaches nobody
(TransformerLens centres writing weights the same way). R(d) is the
rotary rotation between a query and a key d positions earlier (q R(p) .
k R(p') = q R(p - p') k^T); d = 0, the default, is the identity, so the
default scores ignore rotary positions. Left out on purpose: each
LayerNorm's 1/sigma (it depends on the input and only scales a whole
matrix, which the ratios below ignore) and all biases (constant offsets,
which compose with nothing).

Composition (Elhage et al. 2021, "A Mathematical Framework for Transformer
Circuits"): how much of what an earlier head 1 writes a later head 2
reads, as the ratio ||X Y||_F / (||X||_F ||Y||_F) of
  Q-composition  M_1 A_2     (head 1's output in head 2's queries)
  K-composition  M_1 A_2^T   (in its keys; = ||A_2 M_1^T||)
  V-composition  M_1 M_2     (in its values).
The ratio is at most 1 and is 1/sqrt(r) for two aligned rank-r partial
isometries, so it is read against `composition_baseline`: the same ratio
for Gaussian matrices of the same shapes.

Copying (Olsson et al. 2022, "In-context Learning and Induction Heads"):
the full OV circuit E P M P diag(g_f) W_U `[N, N]` (token embedding in,
through the head, out through the final LayerNorm's scale g_f and the
readout) maps a token attended to onto the logits it raises. A head that
copies raises the token itself: positive eigenvalues. `copying_score`
gives sum(Re lambda) / sum(|lambda|) (in [-1, 1]; Elhage et al.'s and
TransformerLens's definition) and sum(max(Re lambda, 0)) / sum(|lambda|)
(the positive share, in [0, 1]).

Grouped-query attention (K < H kv heads): every circuit and score here
is per QUERY head, h in [0, H). Head h's circuits take W_Q^h and W_O^h of
its own and W_K, W_V of the kv head it reads, `hooks.kv_head(h, H, K)` =
h // (H // K) (`head_weights` lays the weights out that way, and
`qk_circuits`/`ov_circuits` pair kv-head weights with query heads
themselves). Two query heads of one group share W_K and W_V but not their
QK or OV circuits: a receiver's K-composition is its group's keys read
through its own W_Q, its V-composition its group's values written
through its own W_O. So a head index means the same here as in the
patterns, `z`, `result` and `head_mask`.

Nothing here is jitted; all of it is cheap at these sizes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mha_jax import hooks
from mha_jax.core import precision
from mha_jax.core import rotary

mm = precision.matmul  # every product here at the library's precision


def frobenius_ratio(x: jax.Array, y: jax.Array) -> jax.Array:
  """`||x @ y||_F / (||x||_F ||y||_F)` over the last two axes (0 where a
  factor is 0); leading axes broadcast: `[..., D, D] -> [...]`."""
  num = jnp.linalg.norm(mm(x, y), axis=(-2, -1))
  den = jnp.linalg.norm(x, axis=(-2, -1)) * jnp.linalg.norm(y, axis=(-2, -1))
  return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)


def centring(d: int) -> jax.Array:
  """`P = I - 11^T / D` `[D, D]`: removes the mean over D, as LayerNorm."""
  return jnp.eye(d) - jnp.full((d, d), 1.0 / d)


def rotation(offset: int, head_dim: int, base: float) -> jax.Array:
  """`R(offset)` `[Dh, Dh]`: row i is unit vector i rotated by `rotary`."""
  eye = jnp.eye(head_dim)[None, :, None, :]  # [1, Dh, 1, Dh]: Dh "tokens"
  rows = rotary.apply_rotary(eye, jnp.full((head_dim,), offset), base=base)
  return rows[0, :, 0, :]


def check_circuit_model(model, fn: str = "composition") -> None:
  """Refuse, by field, models whose weights these circuits misread: they
  assume pre-LayerNorm blocks, no QK-norm, an untied readout and no final
  soft cap (the project's own models; a loaded Llama's RMSNorm does not
  centre, GPT-2's readout is its embedding, and QK-norm's scales, which
  the QK circuit leaves out, weigh each query and key feature). Any
  number of kv heads is fine: the circuits are per query head."""
  c = model.config
  wrong = [f"{name}={getattr(c, name)!r}" for name, ok in (
      ("norm", c.norm == "layer"),
      ("norm_placement", c.norm_placement == "pre"),
      ("parallel_block", not c.parallel_block),
      ("qk_norm", c.qk_norm is None),
      ("tie_embeddings", not c.tie_embeddings),
      ("final_soft_cap", c.final_soft_cap is None)) if not ok]
  if wrong:
    raise ValueError(f"{fn}: the circuits here assume pre-LayerNorm blocks, "
                     f"no QK-norm, an untied readout and no final soft cap; "
                     f"the model has {', '.join(wrong)}")


def head_weights(model, layer: int) -> dict:
  """One layer's attention weights per query head, and the scale of the
  LayerNorm before it: `w_q, w_k [H, D, Dh]`, `w_v [H, D, Dv]`, `w_o [H,
  Dv, D]`, `g [D]`. Under GQA, `w_k[h]` and `w_v[h]` are those of the kv
  head query head h reads (`hooks.expand_kv`)."""
  check_circuit_model(model, "head_weights")
  block = model.blocks[layer]
  p = block.attn.core_params()
  h = p["w_q"].shape[1]
  # [D, K, D*] -> [D, H, D*] -> [H, D, D*]
  per_head = lambda w: jnp.moveaxis(hooks.expand_kv(w, h, axis=1), 1, 0)
  return {"w_q": per_head(p["w_q"]), "w_k": per_head(p["w_k"]),
          "w_v": per_head(p["w_v"]), "w_o": p["w_o"],
          "g": block.ln_attn.scale[...]}


def _per_query_head(w, num_heads: int, what: str, fn: str):
  """`w [H, D, d]` as it is, or `[K, D, d]` kv-head weights paired with
  the H query heads (`hooks.expand_kv`); else a ValueError naming `what`."""
  if w.ndim != 3 or w.shape[0] == num_heads:
    return w
  if num_heads % w.shape[0]:
    raise ValueError(f"{fn}: `{what}` has {w.shape[0]} heads (shape "
                     f"{list(w.shape)}), which is neither the {num_heads} "
                     f"query heads nor a number of kv heads dividing them")
  return hooks.expand_kv(w, num_heads, axis=0)


def ov_circuits(w_v, w_o, g) -> jax.Array:
  """`M [H, D, D]` from `w_v [H or K, D, Dv]`, `w_o [H, Dv, D]`, `g [D]`
  (with K kv heads, query head h takes kv head h // (H // K)'s W_V)."""
  w_v = _per_query_head(w_v, w_o.shape[0], "w_v", "ov_circuits")
  p = centring(w_o.shape[-1])
  return mm(mm(g[None, :, None] * w_v, w_o), p[None])


def qk_circuits(w_q, w_k, g, r=None) -> jax.Array:
  """`A [H, D, D]` from `w_q [H, D, Dh]`, `w_k [H or K, D, Dh]` (with K kv
  heads, query head h takes kv head h // (H // K)'s W_K), `g [D]` and an
  optional rotation `r [Dh, Dh]` between query and key."""
  w_k = _per_query_head(w_k, w_q.shape[0], "w_k", "qk_circuits")
  q = g[None, :, None] * w_q  # [H, D, Dh]
  k = g[None, :, None] * w_k
  if r is not None:
    q = mm(q, r[None])
  return mm(q, jnp.swapaxes(k, -1, -2))


def _scores(m1, a2, m2):
  """Q, K, V composition `[Hs, Hr]` of senders' OV circuits `m1 [Hs, D,
  D]` with receivers' QK `a2 [Hr, D, D]` and OV `m2 [Hr, D, D]`."""
  pair = lambda x, y: frobenius_ratio(x[:, None], y[None])  # [Hs, Hr]
  return {"q": pair(m1, a2), "k": pair(m1, jnp.swapaxes(a2, -1, -2)),
          "v": pair(m1, m2)}


def composition_scores(model, sender_layer: int, receiver_layer: int, *,
                       offsets=(0,)) -> dict:
  """Q, K and V composition of every sender head with every receiver
  head: `{"q", "k", "v"}`, each `[Hs, Hr]` (rows: sender heads).

  `offsets`: query-minus-key distances d at which the QK circuit is taken
  with its rotary rotation R(d); the Q and K scores are averaged over
  them. The default (0,) ignores rotary positions; a model without
  rotary positions has R = I whatever the offsets.
  """
  s, r = head_weights(model, sender_layer), head_weights(model, receiver_layer)
  m1 = ov_circuits(s["w_v"], s["w_o"], s["g"])
  m2 = ov_circuits(r["w_v"], r["w_o"], r["g"])
  c = model.config
  if c.positions != "rotary":
    return _scores(m1, qk_circuits(r["w_q"], r["w_k"], r["g"]), m2)

  def at(d):
    rot = rotation(d, r["w_q"].shape[-1], c.rotary_base)
    return _scores(m1, qk_circuits(r["w_q"], r["w_k"], r["g"], rot), m2)

  per_offset = jax.vmap(at)(jnp.asarray(list(offsets)))  # [n_offsets, ...]
  return jax.tree.map(lambda x: jnp.mean(x, axis=0), per_offset)


def _gaussian(seed: int, *shapes):
  """Standard normal float32 arrays from NumPy's generator `seed` (the
  chance levels need no JAX key, and drawing them with `jax.random`
  compiles a program per shape)."""
  rng = np.random.default_rng(seed)
  return [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in shapes]


def composition_baseline(seed: int, d_model: int, head_dim: int,
                         value_dim: int, draws: int) -> dict:
  """Q, K, V composition of `draws` pairs of Gaussian heads of the given
  shapes (g = 1, centred as the model's): `{"q", "k", "v"}`, each
  `[draws]`. The chance level of `composition_scores`.

  The matrices are standard normal draws of `np.random.default_rng(seed)`
  in this order (so a result can be reproduced): the sender's W_V `[draws,
  D, Dv]` and W_O `[draws, Dv, D]`, the receiver's W_V, W_O, W_Q `[draws,
  D, Dh]` and W_K `[draws, D, Dh]`."""
  d, dh, dv = d_model, head_dim, value_dim
  v1, o1, v2, o2, q2, k2 = _gaussian(
      seed, *[(draws,) + s for s in ((d, dv), (dv, d), (d, dv), (dv, d),
                                     (d, dh), (d, dh))])
  g = jnp.ones((d,))
  m1, m2 = ov_circuits(v1, o1, g), ov_circuits(v2, o2, g)
  a2 = qk_circuits(q2, k2, g)
  return {"q": frobenius_ratio(m1, a2),
          "k": frobenius_ratio(m1, jnp.swapaxes(a2, -1, -2)),
          "v": frobenius_ratio(m1, m2)}


def copying_score(matrix: jax.Array) -> tuple[jax.Array, jax.Array]:
  """`(sum Re lambda / sum |lambda|, sum max(Re lambda, 0) / sum |lambda|)`
  of the eigenvalues of `matrix [..., N, N]` (each `[...]`; 0 for a zero
  matrix)."""
  lam = jnp.linalg.eigvals(matrix)
  mass = jnp.sum(jnp.abs(lam), axis=-1)
  safe = jnp.where(mass > 0, mass, 1.0)
  return (jnp.sum(lam.real, axis=-1) / safe,
          jnp.sum(jnp.maximum(lam.real, 0.0), axis=-1) / safe)


def _readout(model):
  """`(g_f [D], W_U [D, V])`: the final LayerNorm's scale (ones without
  one) and the readout kernel."""
  check_circuit_model(model, "composition")
  w_u = model.readout.kernel[...]
  g = (model.final_ln.scale[...] if model.final_ln is not None
       else jnp.ones((w_u.shape[0],)))
  return g, w_u


def _full_ov_factors(model, layer: int, tokens=None):
  """`(a [H, N, Dv], b [H, Dv, N])` with `a @ b` the full OV circuit:
  `a = E P diag(g) W_V`, `b = W_O P diag(g_f) W_U`."""
  w = head_weights(model, layer)
  e = model.embed.embed.embedding[...]  # [V, D]
  g_f, w_u = _readout(model)
  if tokens is not None:
    tokens = jnp.asarray(tokens)
    e, w_u = e[tokens], w_u[:, tokens]
  p = centring(e.shape[-1])
  a = mm(mm(e, p)[None], w["g"][None, :, None] * w["w_v"])
  return a, mm(mm(w["w_o"], p[None]), (g_f[:, None] * w_u)[None])


def full_ov_circuits(model, layer: int, tokens=None) -> jax.Array:
  """`E P M P diag(g_f) W_U` `[H, N, N]` of each head of `layer` for the
  token ids `tokens` (None: the whole vocabulary)."""
  a, b = _full_ov_factors(model, layer, tokens)
  return mm(a, b)


def copying_scores(model, layer: int, tokens=None) -> dict:
  """`{"copying", "positive_share"}`, each `[H]`: `copying_score` of each
  head's full OV circuit.

  The circuit `a @ b` `[N, N]` has rank at most Dv, and its nonzero
  eigenvalues are those of `b @ a` `[Dv, Dv]` (zeros add nothing to
  either sum), so the smaller of the two products is decomposed: a 4k
  vocabulary costs a 16 x 16 eigenproblem per head, not a 4k x 4k one.
  """
  a, b = _full_ov_factors(model, layer, tokens)
  small = mm(b, a) if b.shape[-2] < a.shape[-2] else mm(a, b)
  score, share = copying_score(small)
  return {"copying": score, "positive_share": share}


def copying_baseline(seed: int, num_tokens: int, d_model: int,
                     value_dim: int, draws: int) -> dict:
  """`copying_scores` of `draws` Gaussian E, W_V, W_O, W_U of the given
  shapes (g = 1): `{"copying", "positive_share"}`, each `[draws]`."""
  n, d, dv = num_tokens, d_model, value_dim
  e, v, o, u = _gaussian(seed, *[(draws,) + s for s in (
      (n, d), (d, dv), (dv, d), (d, n))])
  p = centring(d)
  full = mm(mm(mm(e, p[None]), ov_circuits(v, o, jnp.ones((d,)))), u)
  score, share = copying_score(full)
  return {"copying": score, "positive_share": share}


def direct_logit_attribution(model, inputs, targets, mask, *,
                             tokens=None) -> dict:
  """Each head's direct effect on the correct token's logit.

  Head h of layer l adds its term r = z_h W_O^h (the `result` site) to the
  residual stream; its direct effect on the logits is that term read out
  through the final LayerNorm with the per-position 1/sigma FROZEN at this
  run's value (so that the terms add up to the logits):
  ((r - mean_D r) / sigma) g_f W_U. The attribution is the term's logit of
  the target minus its mean logit over `tokens` (None: the vocabulary;
  shifting every logit changes no probability), averaged over the
  positions where `mask [B, T]` is 1.

  Args:
    inputs, targets, mask: `[B, T]`.

  Returns:
    `{"heads": [L, H], "embed": the residual stream entering block 0
    (embedding and position table), "rest": whatever else the last
    residual stream holds (b_o, MLP outputs), "bias": the final
    LayerNorm's and the readout's biases, "total": their sum, which is the
    same logit difference of the model's own logits}`.
  """
  c = model.config
  sites = tuple(f"blocks.{l}.attn.result" for l in range(c.num_layers))
  first, last = "blocks.0.resid_pre", f"blocks.{c.num_layers - 1}.resid_post"
  _, acts = model(inputs, capture=sites + (first, last))
  x = acts[last]  # [B, T, D]
  heads = jnp.stack([acts[s] for s in sites])  # [L, B, T, H, D]
  g_f, w_u = _readout(model)
  bias = model.readout.bias[...] if model.readout.use_bias else 0.0
  if model.final_ln is not None:
    ln = model.final_ln
    var = jnp.var(x, axis=-1, keepdims=True)  # [B, T, 1]
    inv_sigma = jax.lax.rsqrt(var + ln.epsilon)
    centre = lambda y: y - jnp.mean(y, axis=-1, keepdims=True)
    if ln.use_bias:
      bias = bias + mm(ln.bias[...], w_u)
  else:
    inv_sigma, centre = jnp.ones(x.shape[:-1] + (1,)), lambda y: y
  gw = g_f[:, None] * w_u  # [D, V]

  def logit_diff(y):
    """Target logit minus mean logit of a term `y [..., B, T, D]` -> [...]."""
    lift = lambda a: jnp.reshape(a, (1,) * (y.ndim - 3) + a.shape)
    logits = mm(centre(y) * lift(inv_sigma), gw)  # [..., B, T, V]
    tgt = jnp.take_along_axis(
        logits, jnp.broadcast_to(lift(targets[..., None]),
                                 logits.shape[:-1] + (1,)), axis=-1)[..., 0]
    ref = jnp.mean(logits if tokens is None
                   else logits[..., jnp.asarray(tokens)], axis=-1)
    return (jnp.sum((tgt - ref) * lift(mask[..., None])[..., 0],
                    axis=(-2, -1)) / jnp.sum(mask))

  per_head = logit_diff(jnp.moveaxis(heads, 3, 1))  # [L, H]
  embed = logit_diff(acts[first])
  rest = logit_diff(x - acts[first] - jnp.sum(heads, axis=(0, 3)))
  b = jnp.broadcast_to(jnp.asarray(bias, jnp.float32), (w_u.shape[1],))
  ref_b = jnp.mean(b if tokens is None else b[jnp.asarray(tokens)])
  bias_term = jnp.sum((b[targets] - ref_b) * mask) / jnp.sum(mask)
  return {"heads": per_head, "embed": embed, "rest": rest, "bias": bias_term,
          "total": jnp.sum(per_head) + embed + rest + bias_term}
