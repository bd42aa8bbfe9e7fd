"""Synthetic tasks: deterministic batches from a PRNG key.

Shape letters: B batch, T length (`task.seq_len`), F feature width
(`task.feature_dim`), V vocabulary.

Every task is a pure function `make_batch(key, cfg) -> dict` of the task
config (`configs/default.py`, group `task`), so a training run's data is a
function of (seed, step) and a resumed run sees exactly the same batches.
A batch holds:
  * "inputs":  int tokens `[B, T]` or float features `[B, T, F]`;
  * "targets": int classes `[B, T]` or float vectors `[B, T, O]`;
  * "loss_mask": float `[B, T]`, 1 where the target counts;
  * encoder-decoder tasks add "decoder_inputs" `[B, T]` (BOS + shifted
    targets); "inputs" is then the source sequence.
Token ids: 0 = PAD, 1 = BOS, 2 = SEP, data symbols are 3..V-1 (the
two-offset token task has no special tokens: its symbols are 0..V-1).
The `text` task reads real files (`mha_jax.training.text_corpus`): byte b is id
b + 3, so V = 259. The `text_tokens` task reads the same files in the tokens
of a byte-level BPE trained on the training files
(`mha_jax.training.text_tokens`): V = `task.vocab_size` ids, 0-2 reserved.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp

from mha_jax.training import text_corpus
from mha_jax.training import text_tokens

PAD, BOS, SEP = 0, 1, 2
NUM_SPECIAL = 3


@dataclasses.dataclass(frozen=True)
class Task:
  """A task: how to make a batch and what model shape it needs."""
  make_batch: Callable  # (key, cfg) -> batch dict
  io: Callable  # cfg -> dict(vocab_size, input_dim, output_dim)
  model: str  # "decoder" or "encoder_decoder"
  loss: str  # "xent" (class targets) or "mse" (vector targets)
  check: Callable = lambda cfg: None  # raises on inconsistent task fields
  # Ids 0..NUM_SPECIAL-1 are PAD/BOS/SEP (False: every id is a data symbol,
  # as in two_offset_token); what the explorer labels tokens by.
  special_tokens: bool = True


def _symbols(key, shape, cfg):
  return jax.random.randint(key, shape, NUM_SPECIAL, cfg.vocab_size)


def copy_batch(key, cfg):
  """`x_1..x_n SEP x_1..x_n` (n = T // 2); loss on the copied half."""
  b, t = cfg.batch_size, cfg.seq_len
  n = t // 2
  x = _symbols(key, (b, n), cfg)
  sep = jnp.full((b, 1), SEP, x.dtype)
  seq = jnp.concatenate([x, sep, x], axis=1)  # [B, 2n+1]
  seq = jnp.pad(seq, ((0, 0), (0, t + 1 - seq.shape[1])))  # odd T: one PAD
  pos = jnp.arange(t)
  loss_mask = (pos >= n) & (pos < 2 * n)  # targets x_1..x_n after SEP
  return {"inputs": seq[:, :-1], "targets": seq[:, 1:],
          "loss_mask": jnp.broadcast_to(loss_mask, (b, t)).astype(
              jnp.float32)}


def reverse_batch(key, cfg):
  """Source of random length in [min_len, T], padded; target = reversed."""
  b, t = cfg.batch_size, cfg.seq_len
  k_len, k_sym = jax.random.split(key)
  lengths = jax.random.randint(k_len, (b, 1), cfg.min_len, t + 1)  # [B, 1]
  pos = jnp.arange(t)[None, :]  # [1, T]
  valid = pos < lengths  # [B, T]
  src = jnp.where(valid, _symbols(k_sym, (b, t), cfg), PAD)
  rev_index = jnp.clip(lengths - 1 - pos, 0, t - 1)  # [B, T]
  tgt = jnp.where(valid, jnp.take_along_axis(src, rev_index, axis=1), PAD)
  bos = jnp.full((b, 1), BOS, tgt.dtype)
  dec_in = jnp.concatenate([bos, tgt[:, :-1]], axis=1)
  return {"inputs": src, "decoder_inputs": dec_in, "targets": tgt,
          "loss_mask": valid.astype(jnp.float32)}


def induction_batch(key, cfg):
  """Random tokens with one segment repeated later; loss on the repeat.

  Per example: segment length L in [min_segment, max_segment], first copy at
  s1, second at s2 >= s1 + L, both random, so no fixed position or offset
  predicts the repeat; only "find the earlier occurrence, copy what
  followed" (an induction head) does. The loss counts the targets inside
  the second copy after its first token (the first is unpredictable).

  `cfg.bos` (default False): every sequence starts with BOS (input 0 is
  BOS) and the pattern above fills the T tokens after it, so every
  position, and the loss mask with it, shifts right by one. Without it the
  batch is exactly what it was before the option existed.
  """
  b, t = cfg.batch_size, cfg.seq_len
  total = t + 1  # inputs and targets are the sequence shifted by one
  bos = bool(cfg.get("bos", False))  # configs saved before the field: off
  body = total - 1 if bos else total  # tokens the random pattern fills
  if bos and 2 * cfg.max_segment > body:
    raise ValueError(f"config.task.max_segment: with bos, two copies of "
                     f"{cfg.max_segment} tokens must fit in seq_len = {t}")

  def one(k):
    k_seq, *k_span = jax.random.split(k, 4)
    seq, s2, seg = _copy_span(k_span, _symbols(k_seq, (body,), cfg),
                              cfg.min_segment, cfg.max_segment)
    # Position in the pattern of each of the T targets: target j is token
    # j + 1 of the full sequence, pattern token j + 1 (no BOS) or j (BOS).
    target_pos = jnp.arange(t) + (0 if bos else 1)
    mask = (target_pos > s2) & (target_pos < s2 + seg)
    if bos:
      seq = jnp.concatenate([jnp.full((1,), BOS, seq.dtype), seq])
    return seq, mask.astype(jnp.float32)

  seq, mask = jax.vmap(one)(jax.random.split(key, b))
  return {"inputs": seq[:, :-1], "targets": seq[:, 1:], "loss_mask": mask}


def _copy_span(keys, row, lo, hi):
  """`row [N]` with a span of L tokens (L uniform in [lo, hi]) copied from
  a random s1 to a random s2 >= s1 + L, both copies whole.

  `keys`: three keys, for L, s1 and s2. Returns `(row, s2, L)`.
  """
  k_len, k_s1, k_s2 = keys
  n = row.shape[0]
  seg = jax.random.randint(k_len, (), lo, hi + 1)
  s1 = jax.random.randint(k_s1, (), 0, n - 2 * seg + 1)
  s2 = jax.random.randint(k_s2, (), s1 + seg, n - seg + 1)
  pos = jnp.arange(n)
  in_repeat = (pos >= s2) & (pos < s2 + seg)
  return jnp.where(in_repeat, row[jnp.clip(pos - s2 + s1, 0, n - 1)],
                   row), s2, seg


def _offsets_valid(b, t):
  """Loss mask `[B, T]`: positions t >= 3 have both u_{t-1} and u_{t-3}."""
  return jnp.broadcast_to(jnp.arange(t) >= 3, (b, t)).astype(jnp.float32)


def _shift(x, d):
  """x shifted right by d along axis 1 (zeros enter): out[:, t] = x[:, t-d]."""
  pad = [(0, 0)] * x.ndim
  pad[1] = (d, 0)
  return jnp.pad(x, pad)[:, :x.shape[1]]


def two_offset_continuous_batch(key, cfg):
  """Gaussian u `[B,T,F]`; target at t is `[u_{t-1}; u_{t-3}]` (MSE)."""
  b, t = cfg.batch_size, cfg.seq_len
  u = jax.random.normal(key, (b, t, cfg.feature_dim), jnp.float32)
  target = jnp.concatenate([_shift(u, 1), _shift(u, 3)], axis=-1)  # [B,T,2F]
  return {"inputs": u, "targets": target, "loss_mask": _offsets_valid(b, t)}


def two_offset_token_batch(key, cfg):
  """Symbols x in [0, V); class at t is the pair `x_{t-1} * V + x_{t-3}`."""
  b, t, v = cfg.batch_size, cfg.seq_len, cfg.vocab_size
  x = jax.random.randint(key, (b, t), 0, v)
  target = _shift(x, 1) * v + _shift(x, 3)
  return {"inputs": x, "targets": target, "loss_mask": _offsets_valid(b, t)}


TEXT_VOCAB = NUM_SPECIAL + text_corpus.NUM_BYTES  # 256 bytes + PAD/BOS/SEP
# The text task's own fields (configs/text.py documents them); a task
# config without them (configs/default.py's) reads the standard library.
TEXT_DEFAULTS = {"corpus": text_corpus.STDLIB, "corpus_glob": "*.py",
                 "pieces": 20, "split": "train", "split_seed": 0,
                 "held_out_fraction": 0.1, "repeat_prob": 0.0,
                 "repeat_span": (16, 64)}


def _text_field(cfg, name):
  return cfg.get(name, TEXT_DEFAULTS[name])


def text_corpus_of(cfg) -> text_corpus.Corpus:
  """The split corpus of the text task config `cfg` (cached per fields)."""
  f = functools.partial(_text_field, cfg)
  return text_corpus.load(
      f("corpus"), window=cfg.seq_len + 1, split_seed=f("split_seed"),
      held_out_fraction=f("held_out_fraction"), glob=f("corpus_glob"),
      pieces=f("pieces"))


def text_split(cfg) -> text_corpus.Split:
  """The side `cfg.split` ("train" / "held_out") of `text_corpus_of(cfg)`."""
  return text_corpus_of(cfg).split(_text_field(cfg, "split"))


def text_batch(key, cfg):
  """Windows of T + 1 bytes of real text from split `cfg.split`.

  inputs = window[:-1], targets = window[1:] (next-byte prediction), loss
  on every position; ids are bytes + NUM_SPECIAL. Which windows: 64
  random bits per example from `key`, so the batch is a pure function of
  (key, cfg) given the corpus files, and a resumed run sees the same
  batches. The bytes are gathered on the host from memory-mapped files
  through `jax.pure_callback`: `train.batch_fn` jits every task's sampler,
  and a callback keeps the corpus out of the compiled program (no constant
  of tens of MB, and corpora larger than memory work), at the cost of one
  host round trip per batch, small next to a training step.

  `cfg.repeat_prob` (default 0: off): that share of windows gets a span
  of `cfg.repeat_span` bytes repeated later in the window
  (`_repeat_spans`), a training signal for induction heads in real text.
  """
  seq = _windows(key, cfg, lambda: text_split(cfg), NUM_SPECIAL)
  return _next_token(_maybe_repeat(key, cfg, seq))


def _maybe_repeat(key, cfg, seq):
  """`seq` with `cfg.repeat_prob`'s repeated spans (`_repeat_spans`); as
  it is when the option is off (0, the default), bit for bit."""
  p = float(_text_field(cfg, "repeat_prob"))
  if p == 0:
    return seq
  return _repeat_spans(jax.random.fold_in(key, 1), seq, p,
                       tuple(_text_field(cfg, "repeat_span")))


def _windows(key, cfg, split, first_id):
  """`[B, T + 1]` int32 windows of `split()` picked by 64 random bits per
  example from `key`, read on the host (see `text_batch`)."""
  b, t = cfg.batch_size, cfg.seq_len
  bits = jax.random.bits(key, (b, 2), jnp.uint32)

  def read(bits_host):
    return split().windows_from_bits(bits_host, first_id=first_id)

  return jax.pure_callback(read, jax.ShapeDtypeStruct((b, t + 1), jnp.int32),
                           bits, vmap_method="sequential")


def _next_token(seq):
  """Next-token prediction on windows `seq [B, T + 1]`, loss everywhere."""
  return {"inputs": seq[:, :-1], "targets": seq[:, 1:],
          "loss_mask": jnp.ones(seq[:, 1:].shape, jnp.float32)}


def text_tokens_of(cfg) -> text_tokens.TokenCorpus:
  """The `text_tokens` task's corpus: the byte corpus of the same fields
  in the tokens of its BPE of `cfg.vocab_size` ids (cached on disk)."""
  return text_tokens.load(text_corpus_of(cfg), vocab_size=cfg.vocab_size,
                          window=cfg.seq_len + 1,
                          cache_dir=cfg.get("cache_dir", ""))


def text_tokens_batch(key, cfg):
  """Windows of T + 1 BPE tokens of real text from split `cfg.split`:
  the byte task's windows (`text_batch`), in tokens, inside one file.
  `cfg.repeat_prob` and `cfg.repeat_span` plant repeated spans as there,
  counted in tokens."""
  # Read (or train) the tokenizer now, while tracing: a bad setting
  # raises its ValueError here rather than inside the host callback.
  corpus = text_tokens_of(cfg)
  split = lambda: corpus.split(_text_field(cfg, "split"))
  return _next_token(_maybe_repeat(key, cfg, _windows(key, cfg, split, 0)))


def _repeat_spans(key, seq, prob, span):
  """With probability `prob` per window, a span of L bytes (L uniform in
  `span = (min, max)`) copied over a later stretch of the same window
  (`_copy_span`): what follows the first copy is the answer an induction
  head reads at the second. `seq [B, N]`."""
  def one(k, row):
    k_on, *k_span = jax.random.split(k, 4)
    copied, _, _ = _copy_span(k_span, row, *span)
    return jnp.where(jax.random.bernoulli(k_on, prob), copied, row)

  return jax.vmap(one)(jax.random.split(key, seq.shape[0]), seq)


def need(cond, field: str, msg: str) -> None:
  """The one check of a config field: `ValueError("config.<field>: msg")`
  unless `cond` (`field` is dotted from the config's root, e.g.
  "train.batch_size"). `config.validate_config` uses it for every group."""
  if not cond:
    raise ValueError(f"config.{field}: {msg}")


def _need(cond, field, msg):
  need(cond, f"task.{field}", msg)


def _check_symbols(cfg):
  _need(cfg.vocab_size > NUM_SPECIAL, "vocab_size",
        f"needs more than {NUM_SPECIAL} ids (PAD, BOS, SEP are reserved), got "
        f"{cfg.vocab_size}")


def _check_copy(cfg):
  _check_symbols(cfg)
  _need(cfg.seq_len >= 2, "seq_len", f"must be >= 2, got {cfg.seq_len}")


def _check_reverse(cfg):
  _check_symbols(cfg)
  _need(1 <= cfg.min_len <= cfg.seq_len, "min_len",
        f"must be in [1, seq_len={cfg.seq_len}], got {cfg.min_len}")


def _check_induction(cfg):
  _check_symbols(cfg)
  _need(2 <= cfg.min_segment <= cfg.max_segment, "min_segment",
        f"must satisfy 2 <= min_segment <= max_segment, got "
        f"{cfg.min_segment}, {cfg.max_segment}")
  _need(2 * cfg.max_segment <= cfg.seq_len + 1, "max_segment",
        f"two copies of {cfg.max_segment} tokens must fit in seq_len + 1 = "
        f"{cfg.seq_len + 1}")
  _need(not cfg.get("bos", False) or 2 * cfg.max_segment <= cfg.seq_len,
        "max_segment", f"with bos, two copies of {cfg.max_segment} tokens "
        f"must fit in seq_len = {cfg.seq_len}")


def _check_offsets(cfg):
  _need(cfg.seq_len > 3, "seq_len", f"must be > 3, got {cfg.seq_len}")


def _check_windows(cfg):
  """The fields both text tasks read: the window length, the split and
  the repeated spans."""
  _need(cfg.seq_len >= 2, "seq_len", f"must be >= 2, got {cfg.seq_len}")
  split = _text_field(cfg, "split")
  _need(split in ("train", "held_out"), "split",
        f"expected 'train' or 'held_out', got {split!r}")
  p = _text_field(cfg, "repeat_prob")
  _need(0.0 <= p <= 1.0, "repeat_prob", f"must be in [0, 1], got {p}")
  lo, hi = _text_field(cfg, "repeat_span")
  _need(p == 0 or (1 <= lo <= hi and 2 * hi <= cfg.seq_len + 1),
        "repeat_span",
        f"needs 1 <= min <= max and two copies of max ids within seq_len "
        f"+ 1 = {cfg.seq_len + 1}, got ({lo}, {hi})")


def _check_text(cfg):
  _need(cfg.vocab_size == TEXT_VOCAB, "vocab_size",
        f"the text task has {TEXT_VOCAB} ids (256 bytes + PAD, BOS, SEP), "
        f"got {cfg.vocab_size}")
  _check_windows(cfg)
  text_split(cfg)  # the corpus exists, decodes and has windows: fail now


def _check_text_tokens(cfg):
  text_tokens.check_vocab(cfg.vocab_size)
  _check_windows(cfg)
  # The files exist and decode; the tokenizer is trained (or read from
  # its cache) when the first batch is traced, not by every validation.
  text_corpus_of(cfg)


def _token_io(cfg):
  return dict(vocab_size=cfg.vocab_size, input_dim=0, output_dim=0)


TASKS = {
    "copy": Task(copy_batch, _token_io, "decoder", "xent", _check_copy),
    "reverse": Task(reverse_batch, _token_io, "encoder_decoder", "xent",
                    _check_reverse),
    "induction": Task(induction_batch, _token_io, "decoder", "xent",
                      _check_induction),
    "two_offset_continuous": Task(
        two_offset_continuous_batch,
        lambda c: dict(vocab_size=0, input_dim=c.feature_dim,
                       output_dim=2 * c.feature_dim),
        "decoder", "mse",
        lambda c: (_check_offsets(c), _need(c.feature_dim > 0, "feature_dim",
                                            "must be > 0"))),
    "two_offset_token": Task(
        two_offset_token_batch,
        lambda c: dict(vocab_size=c.vocab_size, input_dim=0,
                       output_dim=c.vocab_size ** 2),
        "decoder", "xent", _check_offsets, special_tokens=False),
    "text": Task(text_batch,
                 lambda c: dict(vocab_size=TEXT_VOCAB, input_dim=0,
                                output_dim=0),
                 "decoder", "xent", _check_text),
    "text_tokens": Task(text_tokens_batch, _token_io, "decoder", "xent",
                        _check_text_tokens),
}


def get_task(name: str) -> Task:
  """The registered task called `name`; the error lists the known ones."""
  if name not in TASKS:
    raise ValueError(f"config.task.name: unknown task {name!r}; expected one "
                     f"of {sorted(TASKS)}")
  return TASKS[name]
