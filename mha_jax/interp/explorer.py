"""See the heads: one self-contained HTML page to explore a model's attention.

Shape letters: L layers, B examples, H heads, Tq query length, Tk key
length, T length of a sequence, F input features.

`explore(model, batch, ...)` measures a model on a batch and returns the
page's data: every head's attention pattern on one example of the batch
(`held_out.weights_of`: the weights the analyses and results.json use),
readable labels for the tokens on both sides, and per head, over the whole
batch, the scores of `head_metrics.head_metrics`, the loss increase when the
head alone is ablated (`interventions.zero_ablation`) and the floors the
scores are read against: uniform attention over the keys each query may
see, and the same architecture at initialisation (as `interp/survey.py`
reports them). `render(data)` turns that into one HTML page that opens
from disk and makes no network request; `write_explorer` does both.

An encoder-decoder has three kinds of attention, each its own view:
encoder self-attention (source x source), decoder self-attention (target
x target) and cross-attention (target queries x source keys).

Why a hand-written page: what a reader needs are linked views (a layer x
head grid that selects the heatmap, a query token that highlights its keys
in the text for every head, a table row that selects its head, the value
under the pointer). Treescope's `render_array` draws one array with sliders
inside its own shadow DOM, which the page cannot drive, and shows token
labels only in its hover text. It does serve, below the linked views, as
the raw-array panel: every weight of the view as one `[L, H, Tq, Tk]` array
with sliders over layer and head, zoom and hover.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import pathlib
import re

from flax import nnx
import jax
import numpy as np
import treescope

from mha_jax import hooks
from mha_jax.interp import head_metrics
from mha_jax.core import attention
from mha_jax.interp import survey
from mha_jax.training import held_out
from mha_jax.interp import interventions
from mha_jax.training import tasks
from mha_jax.models import transformer

_STATIC = pathlib.Path(__file__).parent / "explorer_static"

# Token names of the tasks with reserved ids (see mha_jax.training.tasks).
SPECIAL_NAMES = {tasks.PAD: "PAD", tasks.BOS: "BOS", tasks.SEP: "SEP"}

# The table's columns: (key, header, digits, what it measures). Scores of
# `head_metrics.head_metrics` first, then the ablation; absent keys are skipped.
SCORE_COLUMNS = (
    ("previous_token", "previous-token", 3,
     "mean weight on the key one position back"),
    ("induction", "induction", 3,
     "mean weight on the token after an earlier copy of the query's token"),
    ("duplicate_token", "duplicate-token", 3,
     "mean weight on earlier copies of the query's own token"),
    ("entropy", "entropy (nats)", 3,
     "mean entropy of the rows; log(n) is uniform over n keys"),
    ("confidence", "confidence", 3, "mean largest weight of a row"),
    ("mean_distance", "mean distance", 2,
     "expected |query position - key position|"),
    ("positional_offset", "argmax offset", 0,
     "most common offset of the argmax key (1 = previous token)"),
    ("positional_share", "offset share", 3,
     "share of rows whose argmax is at that offset"),
    ("ablation", "ablation effect", 4,
     "loss increase when this head alone is zero-ablated"),
)


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


# ---------------------------------------------------------------- tokens


def token_labels(tokens, *, specials: bool = True) -> list[str]:
  """Readable labels of one sequence: `tokens [T]` ids or `[T, F]` features.

  Ids print as themselves, reserved ids by name (PAD, BOS, SEP) when
  `specials`; continuous inputs have no symbol, so they are labelled by
  position ("@0", "@1", ...).
  """
  tokens = np.asarray(tokens)
  if tokens.ndim == 2:
    return [f"@{t}" for t in range(tokens.shape[0])]
  if tokens.ndim != 1:
    raise ValueError(f"token_labels: `tokens` must be [T] ids or [T, F] "
                     f"features, got shape {tokens.shape}")
  names = SPECIAL_NAMES if specials else {}
  return [names.get(int(t), str(int(t))) for t in tokens]


def parse_tokens(text: str, *, vocab_size: int, max_len: int,
                 specials: bool = True, what: str = "text") -> np.ndarray:
  """Token ids `[T]` (int32) from `text`: ids separated by spaces or commas.

  With `specials`, PAD, BOS and SEP may be written by name. Raises
  ValueError naming `what` and the problem: no token, an item that is no
  id, an id outside `[0, vocab_size)`, or more than `max_len` tokens.
  """
  items = [s for s in re.split(r"[\s,]+", text.strip()) if s]
  if not items:
    raise ValueError(f"`{what}` is empty: give token ids separated by "
                     "spaces, e.g. '5 9 4 5 9'")
  by_name = ({v: k for k, v in SPECIAL_NAMES.items()} if specials else {})
  ids = []
  for pos, item in enumerate(items):
    if item.upper() in by_name:
      ids.append(by_name[item.upper()])
      continue
    try:
      ids.append(int(item))
    except ValueError:
      names = f" or one of {', '.join(by_name)}" if by_name else ""
      raise ValueError(f"`{what}`: {item!r} at position {pos} is not a token "
                       f"id (an integer in [0, {vocab_size}){names})"
                       ) from None
    if not 0 <= ids[-1] < vocab_size:
      raise ValueError(f"`{what}`: token {ids[-1]} at position {pos} is "
                       f"outside the model's vocabulary [0, {vocab_size})")
  if len(ids) > max_len:
    raise ValueError(f"`{what}` has {len(ids)} tokens, more than the model's "
                     f"max_len={max_len}")
  return np.asarray(ids, np.int32)


def _shift(x, d, fill=0):
  """`[T]` shifted right by d: out[t] = x[t - d], `fill` where t < d."""
  return np.concatenate([np.full(d, fill, x.dtype), x[:len(x) - d]])


def decoder_text_batch(tokens, task_name: str, vocab_size: int) -> dict:
  """A batch of one sequence `tokens [T]` for a decoder, with the targets
  its task would ask for, so that ablation has a loss to increase.

  two_offset_token: the pair class `x_{t-1} * V + x_{t-3}` from t = 3 on
  (as `tasks.two_offset_token_batch`); every other token task: the next
  token, at every position but the last.
  """
  x = np.asarray(tokens, np.int32)
  t = len(x)
  if task_name == "two_offset_token":
    targets = _shift(x, 1) * vocab_size + _shift(x, 3)
    mask = np.arange(t) >= 3
  else:
    targets = np.concatenate([x[1:], [tasks.PAD]]).astype(np.int32)
    mask = np.arange(t) < t - 1
  return {"inputs": x[None], "targets": targets[None],
          "loss_mask": mask[None].astype(np.float32)}


def encoder_decoder_text_batch(source, target) -> dict:
  """A batch of one source `[S]` and the target `[T]` the decoder emits:
  decoder inputs are BOS and the target shifted right (as
  `tasks.reverse_batch`); the loss counts the target's non-PAD tokens."""
  src = np.asarray(source, np.int32)
  tgt = np.asarray(target, np.int32)
  dec_in = _shift(tgt, 1, tasks.BOS)
  return {"inputs": src[None], "decoder_inputs": dec_in[None],
          "targets": tgt[None],
          "loss_mask": (tgt != tasks.PAD)[None].astype(np.float32)}


def greedy_target(model, source, length: int) -> np.ndarray:
  """`[length]` ids an `EncoderDecoder` emits for `source [S]`, greedily.

  The decoder input has a fixed length (PAD after the tokens so far; the
  decoder is causal, so they do not change earlier positions), so every
  step runs the same compiled program.
  """
  src = np.asarray(source, np.int32)[None]
  graphdef, state = nnx.split(model)
  step = jax.jit(lambda st, s, d: nnx.merge(graphdef, st)(s, d))
  out = np.full(length, tasks.PAD, np.int32)
  for t in range(length):
    dec_in = _shift(out, 1, tasks.BOS)[None]
    out[t] = int(np.argmax(np.asarray(step(state, src, dec_in))[0, t]))
  return out


def text_batch(model, config, text: str) -> dict:
  """The batch of one user sequence for `model` trained with `config`.

  Decoders: `text` holds the token ids. Encoder-decoders: "SOURCE | TARGET"
  (the target side optional: without it the model's own greedy output of
  the source's length). Raises ValueError for continuous-input tasks and
  for tokens outside the vocabulary or longer than the model's max_len.
  """
  c = model.config
  name = config.task.name
  if c.input_dim:
    raise ValueError(f"`text`: task {name!r} takes continuous inputs "
                     f"[T, {c.input_dim}], not token ids; use a batch of the "
                     "task instead (--batch_from_task)")
  kw = dict(vocab_size=c.vocab_size, max_len=c.max_len,
            specials=tasks.get_task(name).special_tokens)
  if isinstance(model, transformer.EncoderDecoder):
    src_text, _, tgt_text = text.partition("|")
    src = parse_tokens(src_text, what="text (source)", **kw)
    tgt = (parse_tokens(tgt_text, what="text (target)", **kw)
           if tgt_text.strip() else greedy_target(model, src, len(src)))
    return encoder_decoder_text_batch(src, tgt)
  if "|" in text:
    raise ValueError("`text`: '|' separates source and target of an "
                     "encoder-decoder; this model is a decoder")
  return decoder_text_batch(parse_tokens(text, **kw), name, c.vocab_size)


# ---------------------------------------------------------------- scores


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
  if model.config.implementation in attention.WEIGHTLESS:
    return transformer.with_implementation(model, "einsum")
  return model


def explore(model, batch, *, loss: str | None = None, init_model=None,
            example: int = 0, labels: dict | None = None,
            specials: bool = True) -> dict:
  """The page's data for `model` on `batch` (a task batch dict).

  Patterns are example `example`'s; scores are over the whole batch.
  `loss` ("xent" / "mse", the task's) adds each head's zero-ablation
  effect on `batch`; `init_model` (the same architecture untrained) adds
  its scores as a floor. `labels`: {batch key: [T] labels} to replace the
  ids' labels (for example a text model's characters); `specials`: name
  PAD/BOS/SEP.

  Returns {"kinds": one dict per attention kind (`kinds_of`): "key",
  "title", "causal", "weights" `[L, H, Tq, Tk]` float32 (example
  `example`), "query_labels" `[Tq]`, "key_labels" `[Tk]`, "scores" (name
  -> `[L, H]`, with "ablation" given `loss`) and "floors" ("uniform": name
  -> float; "init", given `init_model`: name -> `[L, H]`); "example",
  "num_examples", "heads" `(H, K)` and, given `loss`, "eval"
  (`held_out.eval_loss`)}.

  Under grouped-query attention (K < H) every view and score is per query
  head (the patterns, the ablation of a head's `z`), and the page says
  which kv head each group of query heads shares.
  """
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
  return data


# ---------------------------------------------------------- circuit numbers


# ------------------------------------------------------------------ page


def gqa_note(num_heads: int, num_kv_heads: int) -> str:
  """The page's line on grouped-query attention: heads are query heads,
  and which of them share a kv head (e.g. H0-H1 -> kv 0)."""
  groups = ", ".join(
      f"H{g[0]}-H{g[-1]} -> kv {j}" if len(g) > 1 else f"H{g[0]} -> kv {j}"
      for j in range(num_kv_heads)
      for g in [hooks.query_heads(j, num_heads, num_kv_heads)])
  kv = f"{num_kv_heads} kv head" + ("s" if num_kv_heads > 1 else "")
  return (f"{num_heads} query heads on {kv} (grouped-query attention): "
          f"every head here is a query head; {groups}")


def b64_float32(weights) -> str:
  """Little-endian float32 bytes, base64: exact values, a quarter of the
  size of decimal text (the page reads them as a Float32Array)."""
  return base64.b64encode(np.asarray(weights, "<f4").tobytes()).decode()


def _table(kind: dict, circuits) -> dict:
  """The score table of one kind: columns, one row per head, floor rows."""
  scores = kind["scores"]
  num_layers, num_heads = kind["weights"].shape[:2]
  cols = [dict(key=k, label=lab, digits=d, help=h)
          for k, lab, d, h in SCORE_COLUMNS if k in scores]
  values = {k: np.asarray(scores[k], float) for k in scores}
  if circuits and kind["key"] == "self":
    for name, arr in circuits["columns"].items():
      cols.append(dict(key=name, label=name, digits=3, circuit=True,
                       help=f"from {circuits['source']}"))
      values[name] = arr
  rows = [{"layer": l, "head": h,
           "values": [float(values[c["key"]][l, h]) for c in cols]}
          for l in range(num_layers) for h in range(num_heads)]
  floors = []
  names = {"uniform": "uniform attention (floor)",
           "init": "same model at initialisation (mean over heads)"}
  for name, fl in kind["floors"].items():
    # A mean of argmax offsets is no offset of any head: left blank.
    vals = [None if c["key"] not in fl or c["key"] == "positional_offset"
            else float(np.mean(fl[c["key"]])) for c in cols]
    floors.append({"name": names.get(name, name), "values": vals})
  return {"columns": cols, "rows": rows, "floors": floors}


def _treescope_panel(kind: dict) -> str:
  """Treescope's rendering of the kind's `[L, H, Tq, Tk]` weights."""
  w = kind["weights"]
  fig = treescope.render_array(
      w, rows=[2], columns=[3], sliders=[0, 1], vmin=0.0, vmax=1.0,
      axis_labels={0: "layer", 1: "head", 2: "query", 3: "key"},
      axis_item_labels={2: kind["query_labels"], 3: kind["key_labels"]},
      maximum_size=max(w.size, 10_000), pixels_per_cell=12)
  return fig._repr_html_()  # pylint: disable=protected-access


def page_json(data: dict, *, title: str = "", info=(),
              circuits=None) -> dict:
  """What the page's script reads: labels, weights (base64) and tables."""
  kinds = []
  for kind in data["kinds"]:
    num_layers, num_heads, tq, tk = kind["weights"].shape
    kinds.append({
        "key": kind["key"], "title": kind["title"], "causal": kind["causal"],
        "num_layers": num_layers, "num_heads": num_heads, "tq": tq, "tk": tk,
        "query_labels": kind["query_labels"],
        "key_labels": kind["key_labels"],
        "weights": b64_float32(kind["weights"]),
        "table": _table(kind, circuits)})
  info = list(info) + [("example shown", f"{data['example']} of "
                        f"{data['num_examples']} (scores over all)")]
  h, k = data.get("heads", (0, 0))
  if k < h:
    info.append(("heads", gqa_note(h, k)))
  if "eval" in data:
    info.append(("loss on the batch", " | ".join(
        f"{k} {v:.4f}" for k, v in sorted(data["eval"].items()))))
  return {"title": title, "info": [[str(k), str(v)] for k, v in info],
          "kinds": kinds}


def render(data: dict, *, title: str = "Attention explorer", info=(),
           circuits=None, raw_arrays: bool = True) -> str:
  """The self-contained HTML page of `explore`'s `data`.

  `info`: (label, value) pairs shown under the title (the run, its
  config); `circuits`: `{"source": file, "columns": {name: [L, H]}}`, extra per-head columns (e.g. `experiments.saved_patching.beside`); `raw_arrays`: add the
  Treescope panel of every view.
  """
  raw = ""
  if raw_arrays:
    raw = "\n".join(
        f'<div class="raw" data-kind="{i}">{_treescope_panel(k)}</div>'
        for i, k in enumerate(data["kinds"]))
  return page_html(page_json(data, title=title, info=info,
                             circuits=circuits), title=title, raw=raw)


def page_html(payload: dict, *, title: str, raw: str = "") -> str:
  """The page (`explorer_static/`) around `payload`, the JSON its script
  reads (`page_json`'s, or a notebook view's from `interp/show.py`);
  `raw`: HTML of the Treescope panels, if any."""
  text = json.dumps(payload, separators=(",", ":"))
  # Inside <script>, "</" could end the element early; JSON allows "<\/".
  text = text.replace("</", "<\\/")
  page = (_STATIC / "page.html").read_text()
  parts = {"TITLE": html.escape(title), "CSS": (_STATIC / "page.css"
                                                ).read_text(),
           "JS": (_STATIC / "page.js").read_text(), "DATA": text,
           "RAW": raw}
  # One pass, so a placeholder inside the substituted text stays as it is.
  return re.sub(r"@@(\w+)@@", lambda m: parts[m.group(1)], page)


def write_explorer(model, batch, path, *, loss: str | None = None,
                   init_model=None, example: int = 0, title: str = "",
                   info=(), circuits=None, labels: dict | None = None,
                   specials: bool = True,
                   raw_arrays: bool = True) -> pathlib.Path:
  """Measure `model` on `batch` (`explore`) and write the page to `path`.

  For an experiment's report: `write_explorer(model, batch,
  workdir / "explorer.html", loss=task.loss, init_model=...)` with the
  batch its analysis used. Returns the path written.
  """
  data = explore(model, batch, loss=loss, init_model=init_model,
                 example=example, labels=labels, specials=specials)
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(render(data, title=title or "Attention explorer",
                         info=info, circuits=circuits,
                         raw_arrays=raw_arrays))
  return path
