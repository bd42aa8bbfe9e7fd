"""The BPE text task: tokenizer training, caching, windows and baselines.

Corpora are small files each test writes, with words chosen so that what
the tokenizer learnt says which files it read.
"""

from __future__ import annotations

import pathlib

import jax
import ml_collections
import numpy as np
import pytest

from mha_jax.training import held_out
from mha_jax.training import tasks
from mha_jax.training import text_corpus
from mha_jax.training import text_tokens

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf",
         "hotel", "india", "juliet"]


def _corpus(folder, files: dict, **kw) -> text_corpus.Corpus:
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  for name, text in files.items():
    (folder / name).write_bytes(text.encode())
  text_corpus.load.cache_clear()
  return text_corpus.load(str(folder), window=kw.pop("window", 9),
                          glob="*.txt", **kw)


def _word_files():
  """File i: word i, many times, with a few shared and unusual strings:
  "<sep>" (a reserved token's name), accents, CJK and an emoji."""
  return {f"f{i}.txt": (f"{w}_{w}{w} " * 40 + "x = <sep> é 日本 🙂\n")
          for i, w in enumerate(WORDS)}


def _load(tmp_path, corpus, vocab=300, window=9, **kw):
  text_tokens.load.cache_clear()
  return text_tokens.load(corpus, vocab_size=vocab, window=window,
                          cache_dir=str(tmp_path / "cache"), **kw)


@pytest.fixture(scope="module")
def word_corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("words")
  corpus = _corpus(root / "text", _word_files(), held_out_fraction=0.3)
  return root, corpus, _load(root, corpus)


def _file_word(doc) -> str:
  return WORDS[int(doc.path.stem[1:])]


def test_trains_on_the_training_files_only(word_corpus):
  _, corpus, tc = word_corpus
  vocab = tc.tokenizer.get_vocab()
  pieces = {text_tokens._id_bytes(tc.tokenizer, i).decode("utf-8", "replace")
            for i in vocab.values() if i >= 3}
  held = {_file_word(d) for d in corpus.held_out.documents}
  train = {_file_word(d) for d in corpus.train.documents}
  assert len(held) == 3 and len(train) == 7
  for w in train:  # 120 copies per file: each training word is one token
    assert len(tc.encode(w)) == 1, w
  for w in held:  # never seen: no merge spans even half of it
    assert not any(w[:3] in p for p in pieces), w
    assert len(tc.encode(w)) >= 3, w


def test_round_trips_every_file_and_keeps_reserved_ids(word_corpus):
  _, corpus, tc = word_corpus
  for split in (tc.train, tc.held_out):
    for i, doc in enumerate(split.documents):
      ids = split.document_tokens(i)
      text = doc.path.read_text()
      assert tc.decode(ids) == text
      assert np.array_equal(ids, tc.encode(text))
      assert ids.min() >= len(text_tokens.SPECIALS)  # "<sep>" is text
      assert tc.token_bytes[ids].sum() == doc.size  # bytes per id, exact
  assert tc.tokenizer.id_to_token(tasks.SEP) == "<sep>"
  assert tc.vocab_size == 300


def test_same_corpus_same_merges(word_corpus, tmp_path):
  root, corpus, tc = word_corpus
  again = _load(tmp_path, corpus)  # another cache: trained afresh
  assert again.folder.name == tc.folder.name
  assert again.tokenizer.to_str() == tc.tokenizer.to_str()
  assert np.array_equal(np.asarray(again.train.tokens),
                        np.asarray(tc.train.tokens))


def test_cache_is_read_back_and_keyed_by_content(tmp_path, monkeypatch):
  files = _word_files()
  corpus = _corpus(tmp_path / "a", files)
  first = _load(tmp_path, corpus)

  def refuse(*a, **k):
    raise AssertionError("trained again with a cache in place")

  with monkeypatch.context() as m:
    m.setattr(text_tokens, "train_tokenizer", refuse)
    again = _load(tmp_path, corpus)
    assert again.folder == first.folder
    assert np.array_equal(np.asarray(again.held_out.tokens),
                          np.asarray(first.held_out.tokens))
  files["f0.txt"] = files["f0.txt"].replace("alpha", "omega")
  changed = _load(tmp_path, _corpus(tmp_path / "b", files))
  assert changed.folder != first.folder
  other_size = _load(tmp_path, corpus, vocab=290)
  assert other_size.folder != first.folder
  assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(
      {first.folder.name, changed.folder.name, other_size.folder.name})


def test_windows_lie_inside_one_file(word_corpus):
  _, corpus, tc = word_corpus
  split = tc.train
  assert split.window == 9
  counts = np.diff(split.starts) - 9 + 1
  assert split.num_windows == counts.sum()
  every = split.windows(np.arange(split.num_windows))
  # Window k is the k-th run of 9 tokens of its file, in file order.
  expect = np.concatenate([
      np.lib.stride_tricks.sliding_window_view(split.document_tokens(i), 9)
      for i in range(len(split.documents))])
  assert np.array_equal(every, expect)


def test_counts_known_answer(tmp_path):
  corpus = _corpus(tmp_path / "c", {"a.txt": "ab ab ab ab ab ab ab ab ab",
                                    "b.txt": "ab ab ab ab ab ab ab ab ab"},
                   held_out_fraction=0.5)
  tc = _load(tmp_path, corpus, vocab=262, window=3)
  ids = tc.train.document_tokens(0)
  v = tc.vocab_size  # 261: the 2 files hold one merge's worth of pairs
  assert v == 261
  uni, keys, n, prev = text_tokens.counts(tc.train, v)
  assert uni.sum() == len(ids) and np.array_equal(
      uni, np.bincount(ids, minlength=v))
  pairs = {}
  for a, b in zip(ids[:-1], ids[1:]):
    pairs[a * v + b] = pairs.get(a * v + b, 0) + 1
  assert dict(zip(keys.tolist(), n.tolist())) == pairs
  assert prev.sum() == len(ids) - 1


@pytest.mark.parametrize("vocab", [259, 100, 70000, 300.5])
def test_bad_vocabulary_fails_by_name(word_corpus, tmp_path, vocab):
  _, corpus, _ = word_corpus
  with pytest.raises(ValueError, match=r"config\.task\.vocab_size.*259"):
    _load(tmp_path, corpus, vocab=vocab)


def test_files_shorter_than_a_window_fail_by_name(word_corpus, tmp_path):
  _, corpus, _ = word_corpus
  with pytest.raises(ValueError, match=r"config\.task\.seq_len.*no file"):
    _load(tmp_path, corpus, window=10_000)


def test_corpus_without_text_fails_by_name(tmp_path):
  (tmp_path / "empty").mkdir()
  (tmp_path / "empty" / "a.txt").write_bytes(b"")
  with pytest.raises(ValueError, match=r"config\.task\.corpus"):
    _corpus(tmp_path / "empty", {})


def _task_cfg(tmp_path, corpus_dir, **kw):
  fields = dict(
      name="text_tokens", corpus=str(corpus_dir), corpus_glob="*.txt",
      pieces=20, split="train", split_seed=0, held_out_fraction=0.3,
      seq_len=8, vocab_size=300, batch_size=6,
      cache_dir=str(tmp_path / "cache"))
  return ml_collections.ConfigDict({**fields, **kw})


def test_task_batch_is_next_token_windows(word_corpus, tmp_path):
  root, _, tc = word_corpus
  cfg = _task_cfg(root, root / "text")
  tasks.get_task("text_tokens").check(cfg)
  batch = jax.tree.map(np.asarray, tasks.text_tokens_batch(
      jax.random.PRNGKey(3), cfg))
  again = tasks.text_tokens_batch(jax.random.PRNGKey(3), cfg)
  assert np.array_equal(batch["inputs"], np.asarray(again["inputs"]))
  other = tasks.text_tokens_batch(jax.random.PRNGKey(4), cfg)
  assert not np.array_equal(batch["inputs"], np.asarray(other["inputs"]))
  assert batch["inputs"].shape == (6, 8)
  assert np.array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
  assert np.all(batch["loss_mask"] == 1)
  # Each row is a window of the training split's tokens.
  train = {tuple(w) for w in tc.train.windows(
      np.arange(tc.train.num_windows))}
  for x, y in zip(batch["inputs"], batch["targets"]):
    assert tuple(np.concatenate([x, y[-1:]])) in train
  held = ml_collections.ConfigDict(cfg.to_dict())
  held.split = "held_out"
  rows = np.asarray(tasks.text_tokens_batch(jax.random.PRNGKey(3),
                                            held)["inputs"])
  held_windows = {tuple(w) for w in tc.held_out.windows(
      np.arange(tc.held_out.num_windows))}
  assert all(tuple(r) in {w[:-1] for w in held_windows} for r in rows)


def _is_one_copy(new, old, lo, hi) -> bool:
  """Whether `new` is `old` with one span of lo..hi ids copied over a
  later stretch: new = old except new[s2 + j] = old[s1 + j], j < L, for
  some lo <= L <= hi and s1 + L <= s2."""
  n = len(old)
  for length in range(lo, hi + 1):
    for s1 in range(n - 2 * length + 1):
      for s2 in range(s1 + length, n - length + 1):
        want = old.copy()
        want[s2:s2 + length] = old[s1:s1 + length]
        if np.array_equal(new, want):
          return True
  return False


def test_task_plants_repeated_spans_in_training_windows_only(word_corpus):
  root, _, _ = word_corpus
  lo, hi = 2, 4
  cfg = _task_cfg(root, root / "text", batch_size=32)

  def window(c):  # [B, T + 1]: the window each example was cut from
    b = jax.jit(lambda k: tasks.text_tokens_batch(
        k, ml_collections.FrozenConfigDict(c)))(jax.random.PRNGKey(5))
    return np.concatenate([b["inputs"], b["targets"][:, -1:]], 1)

  plain = window(cfg)
  off = window(dict(cfg.to_dict(), repeat_prob=0.0, repeat_span=(lo, hi)))
  np.testing.assert_array_equal(off, plain)  # off: bit for bit the same
  rep = window(dict(cfg.to_dict(), repeat_prob=1.0, repeat_span=(lo, hi)))
  assert all(_is_one_copy(n, o, lo, hi) for n, o in zip(rep, plain))
  assert np.any(rep != plain, axis=1).sum() >= 16  # most copies change it
  planted = ml_collections.ConfigDict(dict(cfg.to_dict(), repeat_prob=1.0))
  held = held_out.text_config(ml_collections.ConfigDict({"task": planted}))
  assert (held.task.split, held.task.repeat_prob) == ("held_out", 0.0)


@pytest.mark.parametrize("field,value,match", [
    ("repeat_prob", -0.1, r"task\.repeat_prob: must be in \[0, 1\]"),
    ("repeat_span", (3, 5), r"task\.repeat_span: .*seq_len \+ 1 = 9"),
])
def test_bad_repeat_fields_fail_by_name(word_corpus, field, value, match):
  root, _, _ = word_corpus
  cfg = _task_cfg(root, root / "text", **{"repeat_prob": 1.0, field: value})
  with pytest.raises(ValueError, match=match):
    tasks.get_task("text_tokens").check(cfg)
