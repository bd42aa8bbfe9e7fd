"""The explorer's inputs: a user's text as a batch, and tokens as labels.

Shape letters: B examples, T length of a sequence, S source length,
F input features.

Kept apart from measuring so that the command line and the notebook can
turn "5 9 4 5 9" or "SOURCE | TARGET" into the batch a task would have
built (targets and loss mask included, so that ablation has a loss to
increase) without touching the scores or the page.
"""

from __future__ import annotations

import re

from flax import nnx
import jax
import numpy as np

from mha_jax.training import tasks
from mha_jax.models import transformer

# Token names of the tasks with reserved ids (see mha_jax.training.tasks).
SPECIAL_NAMES = {tasks.PAD: "PAD", tasks.BOS: "BOS", tasks.SEP: "SEP"}


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
