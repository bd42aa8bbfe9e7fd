"""Induction on real text, measuring one model: Olsson et al.'s quantities.

Shape letters: L layers, B windows, H heads, T length, V vocabulary.

At one checkpoint (`measure`):
  * the per-position loss `[T]` (nats, mean over held-out windows), and
    from it the in-context-learning score: mean loss at the late positions
    minus the early ones (Olsson et al. 2022: loss at token 500 minus loss
    at token 50 of 512; the positions used are `config.experiment`'s, the
    nearest a shorter window allows);
  * every head's prefix-matching score `[L, H]` on repeated random tokens:
    `head_metrics.induction_score`, the weight a query in the second copy
    puts on the token that followed its earlier occurrence (the detector
    that fires on experiment 1's induction models);
  * every head's copying score `[L, H]`: `composition.copying_scores` of
    its full OV circuit over the whole vocabulary;
  * what else the heads do on the held-out windows `[L, H]`: the
    previous-token score and the duplicate-token score (weight on earlier
    copies of the query's own token), `head_metrics`' definitions;
  * bits per token and per byte on the same windows.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from mha_jax.interp import composition
from mha_jax.interp import head_metrics
from mha_jax.training import held_out

LN2 = float(np.log(2.0))


def icl_score(loss, early, late) -> np.ndarray:
  """Mean loss over positions `late = (start, end)` minus `early`, per row
  of `loss [..., T]`: negative when later tokens are predicted better."""
  loss = np.asarray(loss)
  return (loss[..., late[0]:late[1]].mean(-1)
          - loss[..., early[0]:early[1]].mean(-1))


def repeated_random(ids, n: int, examples: int, seed: int) -> np.ndarray:
  """`[examples, 2n]`: n tokens drawn uniformly from `ids`, then again."""
  x = np.asarray(ids)[np.random.default_rng(seed).integers(
      0, len(ids), (examples, n))]
  return np.concatenate([x, x], axis=1).astype(np.int32)


def prefix_matching(model, tokens) -> np.ndarray:
  """`[L, H]` prefix-matching scores on repeated tokens `[B, 2n]`."""
  w = held_out.weights_of(model, {"inputs": jnp.asarray(tokens)})["self"]
  tokens = jnp.asarray(tokens)
  return np.stack([np.asarray(head_metrics.induction_score(wl, tokens))
                   for wl in w])


def prefix_matching_floor(tokens) -> float:
  """Uniform causal attention's prefix-matching score on `tokens`."""
  b, t = np.shape(tokens)
  return float(np.asarray(head_metrics.induction_score(
      head_metrics.uniform_causal_weights(b, t), jnp.asarray(tokens)))[0])


def copying(model) -> np.ndarray:
  """`[L, H]` copying scores (sum Re lambda / sum |lambda|, in [-1, 1])."""
  return np.stack([np.asarray(composition.copying_scores(model, l)["copying"])
                   for l in range(model.config.num_layers)])


def bits(loss, targets, token_bytes) -> dict:
  """Bits per token and per byte of `loss [B, T]` (nats) on `targets`."""
  total = float(np.sum(loss)) / LN2
  return {"bits_per_token": total / np.size(loss),
          "bits_per_byte": total / float(np.sum(token_bytes[
              np.asarray(targets)]))}


def text_scores(model, batch) -> dict:
  """`{"previous_token", "duplicate_token"}`, each `[L, H]`, on `batch`."""
  w = held_out.weights_of(model, {"inputs": batch["inputs"]})["self"]
  tokens = jnp.asarray(batch["inputs"])
  return {"previous_token": np.stack([np.asarray(
              head_metrics.previous_token_score(wl)) for wl in w]),
          "duplicate_token": np.stack([np.asarray(
              head_metrics.duplicate_token_score(wl, tokens)) for wl in w])}


def measure(model, batch, rep_tokens, token_bytes, *, early, late) -> dict:
  """Every quantity of the module doc at one checkpoint."""
  loss = held_out.per_position_loss(model, batch)
  return {"loss_by_position": loss.mean(0).tolist(),
          **text_scores(model, batch),
          "icl": float(icl_score(loss, early, late).mean()),
          "prefix_matching": prefix_matching(model, rep_tokens),
          "copying": copying(model),
          **bits(loss, batch["targets"], token_bytes)}


def ablated_icl(model, batch, heads, *, early, late) -> float:
  """Mean ICL score with the heads `[(layer, head), ...]` zero-ablated."""
  loss = held_out.per_position_loss(model, batch,
                                    held_out.head_gates(model, heads))
  return float(icl_score(loss, early, late).mean())
