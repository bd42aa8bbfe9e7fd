"""The explorer's numbers: every head's pattern, scores, floors and
ablation effect on a batch, as plain arrays the page then draws.

Shape letters: L layers, B examples, H heads, K kv heads, Tq query
length, Tk key length, T length of a sequence.

Kept apart from the page so that a test, a notebook or a report can read
the very numbers the page shows without rendering any HTML. The scores
are `head_metrics.head_metrics`'s; a score means something only against
its floors: uniform attention over the keys each query may see, and the
same architecture at initialisation (as `interp/survey.py` reports them).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mha_jax.interp import head_metrics
from mha_jax.core import attention
from mha_jax.interp import survey
from mha_jax.training import held_out
from mha_jax.interp import interventions
from mha_jax.training import tasks
from mha_jax.models import transformer
from mha_jax.interp.explorer_batch import token_labels
from mha_jax.interp.explorer_sae import sae_panel

# The scores that compare a query's position with a key's.
POSITION_SCORES = ("previous_token", "mean_distance", "positional_offset",
                   "positional_share")


@dataclasses.dataclass(frozen=True)
class Kind:
  """One kind of attention of a model, as `held_out.weights_of` names it.

  `queries` / `keys`: the batch entries holding each side's tokens;
  `mask_arg`: the gate `interventions` ablates its heads with.
  """
  key: str
  title: str
  queries: str
  keys: str
  causal: bool
  mask_arg: str


DECODER_KINDS = (Kind("self", "self-attention", "inputs", "inputs", True,
                      "head_mask"),)
ENCODER_DECODER_KINDS = (
    Kind("encoder", "encoder self-attention (source x source)", "inputs",
         "inputs", False, "encoder_head_mask"),
    Kind("self", "decoder self-attention (target x target)",
         "decoder_inputs", "decoder_inputs", True, "head_mask"),
    Kind("cross", "cross-attention (target queries x source keys)",
         "decoder_inputs", "inputs", False, "cross_head_mask"),
)


# A bidirectional `Encoder` (BERT loaded by mha_jax.pretrained).
ENCODER_KINDS = (Kind("self", "self-attention (bidirectional)", "inputs",
                      "inputs", False, "head_mask"),)


def kinds_of(model) -> tuple[Kind, ...]:
  """The attention kinds of a `DecoderLM`, `Encoder` or `EncoderDecoder`."""
  if isinstance(model, transformer.EncoderDecoder):
    return ENCODER_DECODER_KINDS
  if isinstance(model, transformer.DecoderLM):
    return DECODER_KINDS
  if isinstance(model, transformer.Encoder):
    return ENCODER_KINDS
  raise TypeError(f"explorer: `model` must be a DecoderLM, Encoder or "
                  f"EncoderDecoder, got {type(model).__name__}")


def visible_keys(kind: Kind, batch) -> np.ndarray:
  """`[B, Tq, Tk]` bool: the keys each query of `kind` may attend to.

  Causal kinds see keys at or before the query; an encoder-decoder also
  hides PAD keys (a `DecoderLM` attends to every earlier token).
  """
  q, k = np.asarray(batch[kind.queries]), np.asarray(batch[kind.keys])
  b, tq, tk = q.shape[0], q.shape[1], k.shape[1]
  vis = np.ones((b, tq, tk), bool)
  if kind.causal:
    vis &= np.tril(np.ones((tq, tk), bool))[None]
  if "decoder_inputs" in batch:
    vis &= (k != tasks.PAD)[:, None, :]
  return vis


def uniform_weights(visible) -> np.ndarray:
  """`[B, 1, Tq, Tk]`: each query spread evenly over its `visible [B, Tq,
  Tk]` keys (rows with none stay 0). The floor of a head that looks
  nowhere in particular; causal and unpadded, it is
  `head_metrics.uniform_causal_weights`."""
  return np.asarray(head_metrics.uniform_weights(visible))


def _token_side(kind: Kind, batch):
  """`[B, T]` ids for the token scores, or None (cross-attention, whose
  queries and keys are different sequences, or continuous inputs)."""
  tokens = np.asarray(batch[kind.queries])
  if kind.queries != kind.keys or tokens.ndim != 2:
    return None
  return tokens


def floor_scores(visible, tokens=None) -> dict:
  """name -> the score of uniform attention over `visible [B, Tq, Tk]`."""
  m = head_metrics.head_metrics(uniform_weights(visible), tokens)
  return {k: float(np.asarray(v)[0]) for k, v in m.items()}


def _weights_model(model):
  """The model on an attention path that forms weights (same parameters):
  flash, xla, cudnn and auto never form the pattern the page shows."""
  if not attention.forms_weights(model.config.implementation):
    return transformer.with_implementation(model, "einsum")
  return model


def explore(model, batch, *, loss: str | None = None, init_model=None,
            example: int = 0, labels: dict | None = None,
            specials: bool = True, sae_features=None,
            sae_layer: int | None = None, sae_head_features=None) -> dict:
  """The page's data for `model` on `batch` (a task batch dict).

  Patterns are example `example`'s; scores are over the whole batch.
  `loss` ("xent" / "mse", the task's) adds each head's zero-ablation
  effect on `batch`; `init_model` (the same architecture untrained) adds
  its scores as a floor. `labels`: {batch key: [T] labels} to replace the
  ids' labels (for example a text model's characters); `specials`: name
  PAD/BOS/SEP. `sae_features`: feature dicts of an SAE on layer
  `sae_layer`'s z (`mha_jax/sae/view.py` documents them; head names
  `head_name(sae_layer, h)` of this model) for the page's features panel;
  `sae_head_features`: `{head name: [(feature id, decoder share)]}`, the
  features each head of `sae_layer` writes most, largest first, every id
  one of `sae_features`' (`explorer_sae.sae_panel`), which the selected
  head's panel lists.

  Returns {"kinds": one dict per attention kind (`kinds_of`): "key",
  "title", "causal", "weights" `[L, H, Tq, Tk]` float32 (example
  `example`), "query_labels" `[Tq]`, "key_labels" `[Tk]`, "scores" (name
  -> `[L, H]`, with "ablation" given `loss`) and "floors" ("uniform": name
  -> float; "init", given `init_model`: name -> `[L, H]`); "example",
  "num_examples", "heads" `(H, K)`, given `loss`, "eval"
  (`held_out.eval_loss`) and, given `sae_features`, "sae"
  (`explorer_sae.sae_panel`: the features checked, ready for the page)}.

  Under grouped-query attention (K < H) every view and score is per query
  head (the patterns, the ablation of a head's `z`), and the page says
  which kv head each group of query heads shares.
  """
  c = model.config
  # Bad features fail before anything is computed.
  sae = (None if sae_features is None and sae_layer is None
         and sae_head_features is None else
         sae_panel(sae_features, layer=sae_layer, num_layers=c.num_layers,
                   head_features=sae_head_features,
                   num_heads=c.num_heads, fn="explore"))
  model = _weights_model(model)
  b = int(np.shape(batch["inputs"])[0])
  if not 0 <= example < b:
    raise ValueError(f"explore: `example`={example} is outside the batch of "
                     f"{b} examples")
  weights = held_out.weights_of(model, batch)
  init_weights = (held_out.weights_of(_weights_model(init_model), batch)
                  if init_model is not None else None)
  labels = dict(labels or {})
  for key in ("inputs", "decoder_inputs"):
    if key not in batch:
      continue
    t = np.shape(batch[key])[1]
    if key not in labels:
      labels[key] = token_labels(np.asarray(batch[key])[example],
                                 specials=specials)
    elif len(labels[key]) != t:
      raise ValueError(f"explore: `labels[{key!r}]` has {len(labels[key])} "
                       f"labels for {t} positions")
  out = []
  for kind in kinds_of(model):
    tokens = _token_side(kind, batch)
    floors = {"uniform": floor_scores(visible_keys(kind, batch), tokens)}
    if init_weights is not None:
      floors["init"] = survey.layer_metrics(init_weights[kind.key], tokens)
    scores = survey.layer_metrics(weights[kind.key], tokens)
    if kind.queries != kind.keys:
      # Offsets between positions of two different sequences (target
      # query, source key) mean nothing: keep entropy and confidence.
      for d in [scores] + list(floors.values()):
        for name in POSITION_SCORES:
          d.pop(name, None)
    if loss is not None:
      scores["ablation"] = np.asarray(interventions.zero_ablation(
          model, batch, loss, kind.mask_arg))
    out.append({
        "key": kind.key, "title": kind.title,
        "weights": np.asarray(weights[kind.key][:, example], np.float32),
        "query_labels": list(labels[kind.queries]),
        "key_labels": list(labels[kind.keys]),
        "causal": kind.causal, "scores": scores, "floors": floors})
  data = {"kinds": out, "example": example, "num_examples": b,
          "heads": (model.config.num_heads,
                    model.config.num_kv_heads or model.config.num_heads)}
  if loss is not None:
    data["eval"] = held_out.eval_loss(model, batch, loss)
  if sae is not None:
    data["sae"] = sae
  return data
