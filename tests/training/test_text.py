"""The text task and its analysis: corpus reader, head scores, entry point.

Corpora are small files each test writes, with contents chosen so that
every byte a window holds says which file it came from; metrics are
checked on hand-built patterns whose answers are known; the entry point
runs end to end on its smoke config over such a corpus.
"""

from __future__ import annotations

import json
import math
import pathlib

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import text as text_config
from mha_jax.interp import head_metrics
from mha_jax.models.transformer import DecoderLM
from mha_jax.training import config as config_lib
from mha_jax.measure import report as report_lib
from mha_jax.training import held_out
from mha_jax.training import tasks
from mha_jax.training import text_corpus
from experiments.text_heads import control
from experiments.text_heads import heads
from experiments.text_heads import survey

import entry_points
import wired_circuit

FIRST = tasks.NUM_SPECIAL


def _write(folder, files: dict) -> pathlib.Path:
  folder = pathlib.Path(folder)
  for name, data in files.items():
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
  return folder


def _letter_corpus(folder, n=10, size=40):
  """File i holds `size` copies of letter i (a, b, c, ...)."""
  return _write(folder, {f"f{i}.py": chr(97 + i) * size for i in range(n)})


def _task(corpus, **kw):
  c = text_config.get_config("smoke").task
  c.update({"corpus": str(corpus), "seq_len": 7, **kw})
  return c


# ------------------------------------------------------------ corpus reader


def test_split_is_by_file_fixed_by_seed_and_disjoint(tmp_path):
  _letter_corpus(tmp_path, n=10)
  c = text_corpus.load(str(tmp_path), window=8, split_seed=0,
                       held_out_fraction=0.25)
  train = {d.path.name for d in c.train.documents}
  held = {d.path.name for d in c.held_out.documents}
  assert len(held) == 3 and len(train) == 7  # ceil(0.25 * 10) held out
  assert not train & held and train | held == {f"f{i}.py" for i in range(10)}
  # The same seed gives the same split; another seed another one.
  again = text_corpus.load(str(tmp_path), window=8, split_seed=0,
                           held_out_fraction=0.25)
  assert {d.path.name for d in again.held_out.documents} == held
  other = [{d.path.name for d in text_corpus.load(
      str(tmp_path), window=8, split_seed=s,
      held_out_fraction=0.25).held_out.documents} for s in range(1, 6)]
  assert any(o != held for o in other)


def test_windows_are_byte_ids_inside_one_file(tmp_path):
  _write(tmp_path, {"a.py": "0123456789", "b.py": "xy", "c.py": "abcdef"})
  split = text_corpus.split_of("train", [
      text_corpus.Document(tmp_path / n, 0, (tmp_path / n).stat().st_size)
      for n in ("a.py", "b.py", "c.py")], 4)
  sizes = [d.size for d in split.documents]
  assert split.num_windows == sum(max(0, s - 3) for s in sizes)
  ids = split.windows(np.arange(split.num_windows), first_id=FIRST)
  assert ids.dtype == np.int32 and ids.shape == (split.num_windows, 4)
  texts = [bytes((ids[i] - FIRST).tolist()).decode()
           for i in range(len(ids))]
  expected = []
  for d in split.documents:
    data = d.path.read_text()
    expected += [data[o:o + 4] for o in range(d.size - 3)]
  assert texts == expected  # in order, never across two files, "xy" none
  assert len(texts) == 7 + 3


def test_locate_finds_the_file_and_offset_at_file_boundaries(tmp_path):
  """Window k lies in the first file whose cumulative count `ends`
  exceeds k: the first window of a file is at offset 0 of that file, not
  one past the last window of the file before (nor in a file with no
  window at all)."""
  _write(tmp_path, {"a.py": "0123456789", "b.py": "xy", "c.py": "abcdef",
                    "d.py": "PQRSTU"})
  split = text_corpus.split_of("train", [
      text_corpus.Document(tmp_path / n, 0, (tmp_path / n).stat().st_size)
      for n in ("a.py", "b.py", "c.py", "d.py")], 4)
  np.testing.assert_array_equal(split.ends, [7, 7, 10, 13])
  index = [0, 6, 7, 9, 10, 12]  # each file's first and last window
  doc, offset = split.locate(index)
  np.testing.assert_array_equal(doc, [0, 0, 2, 2, 3, 3])
  np.testing.assert_array_equal(offset, [0, 6, 0, 2, 0, 2])
  texts = [bytes(w.tolist()).decode() for w in split.windows(index)]
  assert texts == ["0123", "6789", "abcd", "cdef", "PQRS", "RSTU"]
  for outside in (13, -1):
    with pytest.raises(ValueError, match=r"window index outside \[0, 13\)"):
      split.locate([outside])


def test_windows_from_bits_cover_64_bit_numbers(tmp_path):
  _letter_corpus(tmp_path, n=4, size=20)
  split = text_corpus.load(str(tmp_path), window=5, split_seed=0,
                           held_out_fraction=0.25).train
  n = split.num_windows  # 3 files x 16 windows
  assert n == 48
  bits = np.array([[0, 5], [1, 0], [0, n + 2]], np.uint32)
  got = split.windows_from_bits(bits)
  want = split.windows(np.array([5, (2 ** 32) % n, 2]))
  np.testing.assert_array_equal(got, want)


def test_text_task_batch_shifts_and_keeps_held_out_apart(tmp_path):
  _letter_corpus(tmp_path, n=10)
  cfg = _task(tmp_path, held_out_fraction=0.3)
  make = jax.jit(lambda k: tasks.text_batch(k, ml_collections.FrozenConfigDict(
      cfg)))
  batch = make(jax.random.key(0))
  assert batch["inputs"].shape == batch["targets"].shape == (8, 7)
  x, y = np.asarray(batch["inputs"]), np.asarray(batch["targets"])
  np.testing.assert_array_equal(x[:, 1:], y[:, :-1])  # next byte
  assert x.min() >= FIRST and x.max() < tasks.TEXT_VOCAB
  np.testing.assert_array_equal(batch["loss_mask"], np.ones((8, 7)))
  # Same key, same batch; the key decides which windows.
  np.testing.assert_array_equal(make(jax.random.key(0))["inputs"], x)
  assert not np.array_equal(make(jax.random.key(1))["inputs"], x)
  # Each file is one letter: a window's letter names its file.
  corpus = text_corpus.load(str(tmp_path), window=8, split_seed=0,
                            held_out_fraction=0.3)
  letters = lambda s: {d.path.read_text()[0] for d in s.documents}
  held_cfg = ml_collections.FrozenConfigDict(dict(cfg.to_dict(),
                                                  split="held_out"))
  held = np.asarray(jax.jit(lambda k: tasks.text_batch(k, held_cfg))(
      jax.random.key(0))["inputs"])
  assert {chr(v - FIRST) for v in held.ravel()} <= letters(corpus.held_out)
  assert {chr(v - FIRST) for v in x.ravel()} <= letters(corpus.train)


def test_repeated_spans_copy_earlier_bytes_and_leave_the_rest(tmp_path):
  # Distinct bytes everywhere, so a copied byte is told from the original.
  _write(tmp_path, {f"f{i}.py": bytes(range(1 + 40 * i, 41 + 40 * i))
                    for i in range(3)})  # ASCII: UTF-8 text
  cfg = _task(tmp_path, seq_len=31, held_out_fraction=0.2)
  make = lambda c: np.asarray(jax.jit(lambda k: tasks.text_batch(
      k, ml_collections.FrozenConfigDict(c)))(jax.random.key(3))["inputs"])
  plain = make(cfg)
  # Off (the default) is the batch of a config without the fields.
  bare = ml_collections.ConfigDict(cfg.to_dict())
  del bare["repeat_prob"], bare["repeat_span"]
  np.testing.assert_array_equal(make(bare), plain)
  np.testing.assert_array_equal(make(dict(cfg.to_dict(), repeat_prob=0.0)),
                                plain)
  lo, hi = 3, 6
  rep = make(dict(cfg.to_dict(), repeat_prob=1.0, repeat_span=(lo, hi)))
  for row, (new, old) in enumerate(zip(rep, plain)):
    changed = np.flatnonzero(new != old)
    # One stretch of lo..hi positions (the bytes are all distinct, so
    # every copied byte differs), holding the bytes d >= its length back.
    assert lo <= changed.size <= hi, (row, changed)
    assert changed[-1] - changed[0] + 1 == changed.size
    shift = {int(i - np.flatnonzero(old == new[i])[0]) for i in changed}
    assert len(shift) == 1 and shift.pop() >= changed.size, row
  # Half the windows, about: a Bernoulli draw per window.
  half = make(dict(cfg.to_dict(), repeat_prob=0.5, repeat_span=(lo, hi),
                   batch_size=64))
  base = make(dict(cfg.to_dict(), batch_size=64))
  assert 16 <= np.any(half != base, axis=1).sum() <= 48
  # Held-out windows stay as they are whatever the training side gets.
  config = text_config.get_config("smoke")
  config.task.repeat_prob = 1.0
  assert held_out.text_config(config).task.repeat_prob == 0.0
  assert survey.parse_variant("L2+MLP+rep", repeat_prob=0.3) == {
      "model.num_layers": 2, "model.attention_only": False,
      "task.repeat_prob": 0.3}
  with pytest.raises(ValueError, match="'L2', 'L4\\+MLP', 'L2\\+rep'"):
    survey.parse_variant("L2+rep+MLP", repeat_prob=0.3)


@pytest.mark.parametrize("field,value,match", [
    ("repeat_prob", 1.5, r"repeat_prob: must be in \[0, 1\], got 1.5"),
    ("repeat_span", (5, 4), r"repeat_span: .*got \(5, 4\)"),
    ("repeat_span", (2, 17), r"repeat_span: .*seq_len \+ 1 = 33"),
])
def test_bad_repeat_fields_fail_naming_them(tmp_path, field, value, match):
  config = text_config.get_config("smoke")
  config.task.repeat_prob = 0.5  # the span is checked where it is used
  config.task[field] = value
  with pytest.raises(ValueError, match="config.task." + match):
    config_lib.validate_config(config)


def test_single_file_is_cut_into_pieces_at_line_ends(tmp_path):
  lines = "".join(f"line {i:03d}\n" for i in range(100))  # 9 bytes a line
  path = _write(tmp_path, {"one.txt": lines}) / "one.txt"
  c = text_corpus.load(str(path), window=5, split_seed=0, pieces=10,
                       held_out_fraction=0.2)
  docs = sorted(c.train.documents + c.held_out.documents,
                key=lambda d: d.start)
  assert len(docs) == 10 and len(c.held_out.documents) == 2
  assert sum(d.size for d in docs) == len(lines)
  assert [d.start % 9 for d in docs] == [0] * 10  # cuts after a newline


def _pieces(tmp_path, text, pieces):
  """The documents a single file is cut into, in order, as (start, text)."""
  path = _write(tmp_path, {"one.txt": text}) / "one.txt"
  c = text_corpus.load(str(path), window=2, split_seed=0, pieces=pieces,
                       held_out_fraction=0.3)
  docs = sorted(c.train.documents + c.held_out.documents,
                key=lambda d: d.start)
  data = path.read_bytes()
  return [(d.start, data[d.start:d.start + d.size].decode()) for d in docs]


def test_single_file_cuts_land_just_after_the_next_newline(tmp_path):
  """Each even cut point (size * i // pieces) moves to just past the
  first newline at or after it; the pieces tile the file in order. Lines
  of 9 bytes and 7 pieces put the even cuts inside lines."""
  lines = "".join(f"line {i:03d}\n" for i in range(100))
  got = _pieces(tmp_path, lines, 7)
  starts = [0] + [lines.index("\n", len(lines) * i // 7) + 1
                  for i in range(1, 7)]
  assert [s for s, _ in got] == starts
  assert "".join(t for _, t in got) == lines
  assert all(t.endswith("\n") for _, t in got)


@pytest.mark.parametrize("gap, moved", [(4095, True), (4096, False)])
def test_a_cut_looks_for_a_newline_within_4_kib(tmp_path, gap, moved):
  """The newline `gap` bytes past the even cut: within the 4096 bytes
  looked at (gap 4095) the cut moves past it; one byte further it stays
  at the even point, inside the line."""
  half = 5000
  text = "x" * (half + gap) + "\n" + "y" * (half - gap - 1)
  got = _pieces(tmp_path, text, 2)
  assert [s for s, _ in got] == [0, half + gap + 1 if moved else half]


def test_byte_counts_count_pairs_within_files(tmp_path):
  _write(tmp_path, {"a.txt": "abab", "b.txt": "ba", "c.txt": "cccc"})
  c = text_corpus.load(str(tmp_path), window=2, glob="*.txt",
                       held_out_fraction=0.3, split_seed=0)
  uni, bi = text_corpus.byte_counts(c.train)
  text = [d.path.read_text() for d in c.train.documents]
  assert uni.sum() == sum(map(len, text))
  assert bi.sum() == sum(len(t) - 1 for t in text)  # no pair across files
  for t in text:
    for a, b in zip(t, t[1:]):
      assert bi[ord(a), ord(b)] >= 1
  if "abab" in text and "ba" in text:
    assert bi[ord("b"), ord("a")] == 2 and bi[ord("a"), ord("b")] == 2


def test_byte_counts_carry_pairs_across_the_chunks_of_one_file(tmp_path,
                                                               monkeypatch):
  """Streamed in chunks of 3 bytes, a file's pairs that straddle two
  chunks count as they do read whole: the counts equal a plain count over
  each file's text."""
  _write(tmp_path, {"a.txt": "abcdefgh", "b.txt": "mnopq", "c.txt": "xyz"})
  c = text_corpus.load(str(tmp_path), window=2, glob="*.txt",
                       held_out_fraction=0.3, split_seed=0)
  text = [d.path.read_text() for d in c.train.documents]
  assert max(map(len, text)) > 3  # a file spans several chunks
  want = np.zeros((256, 256), np.int64)
  for t in text:
    for a, b in zip(t, t[1:]):
      want[ord(a), ord(b)] += 1
  monkeypatch.setattr(text_corpus, "_CHUNK", 3)
  uni, bi = text_corpus.byte_counts(c.train)
  np.testing.assert_array_equal(bi, want)
  assert uni.sum() == sum(map(len, text))


@pytest.mark.parametrize("files, corpus, match", [
    ({}, "missing", "does not exist"),
    ({}, ".", "holds no non-empty file matching '\\*.py'"),
    ({"e.py": ""}, "e.py", "is empty"),
    ({"a.py": "x" * 50}, ".", "has 1 non-empty document"),
    ({"a.py": "ok" * 20, "b.py": b"\xff\xfe bad"}, ".", "b.py is not UTF-8"),
    ({"a.py": "abc", "b.py": "def"}, ".", "has no document of at least 9"),
])
def test_bad_corpora_fail_at_start_naming_them(tmp_path, files, corpus,
                                               match):
  _write(tmp_path, files)
  path = str(tmp_path / corpus)
  with pytest.raises(ValueError, match=match) as err:
    text_corpus.load(path, window=9)
  assert "config.task.corpus" in str(err.value)
  assert path in str(err.value) or "b.py" in str(err.value)


def test_config_validation_names_the_corpus_before_training(tmp_path):
  config = text_config.get_config("smoke")
  config.task.corpus = str(tmp_path / "nowhere")
  with pytest.raises(ValueError, match="config.task.corpus: .*nowhere"):
    config_lib.validate_config(config)
  config.task.corpus = "stdlib"
  config.task.vocab_size = 16
  with pytest.raises(ValueError, match="config.task.vocab_size: .*259"):
    config_lib.validate_config(config)


def test_stdlib_corpus_is_this_pythons_standard_library():
  c = text_corpus.load("stdlib", window=257)
  docs = c.train.documents + c.held_out.documents
  names = {d.path.relative_to(c.root).as_posix() for d in docs}
  assert {"os.py", "json/decoder.py"} <= names
  assert not any("site-packages" in n or not n.endswith(".py")
                 for n in names)
  assert len(c.held_out.documents) == math.ceil(0.1 * len(docs))


# ------------------------------------------------------------ head scores


def _ids(text):
  return jnp.asarray([[b + FIRST for b in text.encode()]])


def _keys(targets, query):
  return np.flatnonzero(np.asarray(targets)[0, query]).tolist()


def test_line_start_and_indentation_targets():
  text = "ab\n  cd\nx"
  #       012 3456 78
  ls = heads.line_start_targets(_ids(text))
  assert _keys(ls, 1) == []  # no newline in view before the first line
  assert _keys(ls, 6) == [2] and _keys(ls, 3) == [2] and _keys(ls, 8) == [7]
  ind = heads.indentation_targets(_ids(text))
  assert _keys(ind, 5) == [3, 4] and _keys(ind, 6) == [3, 4]
  assert _keys(ind, 4) == []  # inside the indentation itself
  assert _keys(ind, 8) == []  # an unindented line


def test_open_bracket_targets_find_the_innermost_open_one():
  text = "f(a[b], {c}) d("
  #       0123456789012345
  ob = heads.open_bracket_targets(_ids(text))
  assert _keys(ob, 2) == [1] and _keys(ob, 4) == [3]
  assert _keys(ob, 6) == [1]  # "]" closed the "[": back to "("
  assert _keys(ob, 9) == [8] and _keys(ob, 11) == [1]
  assert _keys(ob, 13) == []  # everything closed
  assert _keys(ob, 1) == []  # the bracket is not its own target


def test_word_start_targets():
  text = "x = foo_bar(a1)"
  #       012345678901234
  ws = heads.word_start_targets(_ids(text))
  assert _keys(ws, 5) == [3] and _keys(ws, 10) == [3]  # "oo_bar" after " "
  assert _keys(ws, 4) == []  # a word's first byte: that is the previous byte
  assert _keys(ws, 13) == [11]  # "1" of "a1", after "("
  assert _keys(ws, 11) == [] and _keys(ws, 0) == []  # "(" is no word byte;
  # "x" has no start in view


def test_span_induction_targets():
  tokens = _ids("abcxbcab")
  #              01234567
  k1 = heads.span_induction_targets(tokens, 1)
  np.testing.assert_array_equal(k1, head_metrics.induction_targets(tokens))
  k2 = heads.span_induction_targets(tokens, 2)
  assert _keys(k2, 5) == [3]  # "bc" at 1-2 was followed by "x" at 3
  assert _keys(k2, 7) == [2]  # "ab" at 0-1 was followed by "c"
  assert _keys(k2, 4) == []  # "xb" never occurred before
  assert _keys(k1, 4) == [2]  # "b" alone did, at 1


def test_strict_span_targets_drop_near_keys_and_one_byte_runs():
  # Old and strict keys of queries in a 2-periodic text: the strict score
  # keeps keys at least min_distance back, that distance included.
  tokens = _ids("ababababab")
  #              0123456789
  assert _keys(heads.span_induction_targets(tokens, 3), 9) == [4, 6, 8]
  for d, keys in ((2, [4, 6]), (5, [4]), (6, [])):
    strict = heads.strict_span_induction_targets(tokens, 3, min_distance=d)
    assert _keys(strict, 9) == keys, d
  # A run of 14 spaces: its last query has plain keys 5..14, and keys
  # 5 and 6 are 9 or more back, but its 3 bytes are one byte repeated.
  tokens = _ids("ab" + " " * 14 + "c")
  assert _keys(heads.span_induction_targets(tokens, 3), 15) == list(
      range(5, 15))
  strict = heads.strict_span_induction_targets(tokens, 3, min_distance=9)
  assert not np.any(np.asarray(strict))
  with pytest.raises(ValueError, match="min_distance"):
    heads.strict_span_induction_targets(tokens, 3, min_distance=1)


def test_strict_span_score_gives_a_previous_byte_head_nothing():
  text = "abcd" + " " * 6 + "xyz" + "abcd"
  #       0123    4-9        10-12  13-16
  # Plain targets: queries 8 (key 7) and 9 (keys 7, 8) inside the run,
  # and 15 (key 3) and 16 (key 4) after "abc" and "bcd" repeat, 12 back.
  tokens = _ids(text)
  t = tokens.shape[1]
  w = _one_hot_heads([lambda i: max(i - 1, 0),  # the previous byte
                      lambda i: i - 12 if i >= 13 else 0],  # induction
                     t)
  plain = heads.target_score(w, heads.span_induction_targets(tokens, 3))
  strict = heads.target_score(
      w, heads.strict_span_induction_targets(tokens, 3, min_distance=9))
  # Previous byte: both run queries hit, neither copy query: 2 of 4.
  np.testing.assert_allclose(plain, [0.5, 0.5], atol=1e-6)
  np.testing.assert_allclose(strict, [0.0, 1.0], atol=1e-6)
  # text_scores' strict score keeps keys beyond its fixed offsets: with
  # max_offset 11 the copy, 12 back, still counts; with 12 it does not.
  for max_offset, want in ((11, [0.0, 1.0]), (12, [0.0, 0.0])):
    s = heads.text_scores(w, tokens, counts=np.ones(256),
                          max_offset=max_offset)
    np.testing.assert_allclose(s["span_induction_strict"], want, atol=1e-6)
    np.testing.assert_allclose(s["span_induction"], [0.5, 0.5], atol=1e-6)


def test_controls_fire_on_the_wired_induction_head_and_not_at_init():
  """The text experiment's detectors on a model known to have an
  induction head (tests/wired_circuit.py: layer-1 head 1) and on
  the same architecture untrained."""
  x = np.array([[3, 4, 5, 6, 3, 4, 5, 6], [9, 2, 7, 11, 9, 2, 7, 11]])
  rep = {"inputs": x, "targets": np.roll(x, -1, axis=1),
         "loss_mask": np.ones(x.shape, np.float32)}
  thr = {"induction": 0.4, "floor_ratio": 2.0}
  uniform = control.detector_floors(rep, rep, max_offset=2)
  # Uniform attention on queries 4..7 of the repeat: 1 / (i + 1) each.
  assert uniform["repeat_induction"] == pytest.approx(
      np.mean([1 / 5, 1 / 6, 1 / 7, 1 / 8]), rel=1e-5)
  wired = control.detector_scores(wired_circuit.build(), rep, rep,
                                  max_offset=2)
  # Queries 5-7 find the token after the earlier copy; query 4 (the
  # first token again) attends to key 0 instead, whose previous-token
  # slot holds its own token (nothing comes before it) and which is
  # also the head's fallback: 3 of 4 queries, one-hot.
  assert wired["repeat_induction"][1, 1] == pytest.approx(0.75, abs=1e-3)
  # Layer 0 looks one back and at itself, never 3 back; layer-1 head 0
  # matches tokens with unscaled weights, so it stays near uniform.
  np.testing.assert_allclose(wired["repeat_induction"][0], [0.0, 0.0],
                             atol=1e-3)
  firing = control.fires(wired["repeat_induction"],
                         uniform["repeat_induction"], thr)
  assert firing.tolist() == [[False, False], [False, True]]
  init = DecoderLM(wired_circuit.config(), rngs=nnx.Rngs(0))
  s = control.detector_scores(init, rep, rep, max_offset=2)
  assert not np.any(control.fires(s["repeat_induction"],
                                  uniform["repeat_induction"], thr))
  # The rule: the threshold AND floor_ratio x the floor.
  assert control.fires([0.45, 0.45, 0.39], 0.2, thr).tolist() == [
      True, True, False]
  assert not control.fires(0.45, 0.3, thr)


def test_rare_and_first_token_and_repeat_targets():
  counts = np.full(256, 100)
  counts[ord("q")] = 1
  rare = heads.rare_byte_targets(_ids("aqbq"), counts)
  assert _keys(rare, 2) == [1] and _keys(rare, 3) == [1]
  assert _keys(rare, 1) == [0]  # only "a" was before
  first = heads.first_token_targets(1, 4)
  assert _keys(first, 0) == [] and _keys(first, 3) == [0]
  rep = heads.repeat_targets(8, 4)
  assert _keys(rep, 3) == [] and _keys(rep, 4) == [1] and _keys(rep, 7) == [4]


def _one_hot_heads(keys_per_head, t):
  """`[1, H, T, T]` weights: head h puts all weight on keys_per_head[h](i)."""
  w = np.zeros((1, len(keys_per_head), t, t), np.float32)
  for h, key in enumerate(keys_per_head):
    for i in range(t):
      w[0, h, i, key(i)] = 1.0
  return jnp.asarray(w)


def test_scores_of_hand_built_heads():
  t = 12
  w = _one_hot_heads([lambda i: 0, lambda i: max(i - 2, 0),
                      lambda i: i], t)
  score = heads.target_score(w, heads.first_token_targets(1, t))
  np.testing.assert_allclose(score, [1.0, 2 / 11, 0.0], atol=1e-6)
  d, mass = heads.fixed_offset(w, 4)
  np.testing.assert_array_equal(d[1:], [2, 0])
  np.testing.assert_allclose(mass[1:], [1.0, 1.0])
  # Uniform attention: 1 / (i + 1) on the first token for query i.
  u = head_metrics.uniform_causal_weights(1, t)
  np.testing.assert_allclose(
      heads.target_score(u, heads.first_token_targets(1, t)),
      [np.mean([1 / (i + 1) for i in range(1, t)])], rtol=1e-5)


def test_text_scores_on_a_line_start_head():
  text = "ab\n  cd\n  efg\nhi"
  tokens = _ids(text)
  t = tokens.shape[1]
  nl = [i for i, ch in enumerate(text) if ch == "\n"]
  prev_nl = lambda i: max([j for j in nl if j < i], default=0)
  w = _one_hot_heads([prev_nl], t)
  s = heads.text_scores(w, tokens, counts=np.ones(256), max_offset=3)
  assert float(s["line_start"][0]) == pytest.approx(1.0)
  assert float(s["first_token"][0]) == pytest.approx(2 / 15)  # queries 1, 2


def test_in_context_score():
  loss = np.tile(np.linspace(3.0, 1.0, 10), (2, 1))
  np.testing.assert_allclose(
      heads.in_context_score(loss, (0, 2), (8, 10)),
      [np.mean(loss[0, 8:]) - np.mean(loss[0, :2])] * 2)
  with pytest.raises(ValueError, match="position ranges"):
    heads.in_context_score(loss, (0, 2), (8, 12))


def test_classify_uses_thresholds_floors_and_order():
  thr = {"sink": 0.5, "induction": 0.4, "syntactic": 0.4,
         "positional": 0.5, "floor_ratio": 2.0}
  z = np.zeros((1, 5))
  scores = {k: z.copy() for k in ("first_token", "repeat_induction",
                                  "line_start", "indentation",
                                  "open_bracket", "word_start",
                                  "fixed_offset_weight")}
  scores["first_token"][0] = [0.9, 0.1, 0.0, 0.0, 0.6]
  scores["repeat_induction"][0] = [0.0, 0.5, 0.0, 0.0, 0.0]
  scores["fixed_offset_weight"][0] = [0.0, 0.8, 0.7, 0.1, 0.0]
  scores["indentation"][0] = [0.0, 0.0, 0.0, 0.45, 0.0]
  floors = {k: 0.01 for k in scores}
  floors["first_token"] = 0.35  # head 4 clears 0.5 but not 2 x floor
  out = heads.classify(scores, floors, thr)
  assert out["label"][0].tolist() == ["sink", "induction", "positional",
                                      "syntactic", "other"]
  assert out["clears"]["positional"][0].tolist() == [False, True, True,
                                                     False, False]
  assert out["counts"] == {"sink": 1, "induction": 1, "positional": 1,
                           "syntactic": 1, "other": 1}


def test_ngram_bits_and_repeated_batch(tmp_path):
  _write(tmp_path, {f"{i}.py": "ab" * 30 for i in range(4)})
  config = text_config.get_config("smoke")
  config.task.update(corpus=str(tmp_path), seq_len=8)
  batch = survey.held_out_batch(config, 4, seed=0)
  bits = survey.ngram_bits(config, batch)
  # Three training files: 90 "a" and 90 "b"; 90 "ab" pairs and 87 "ba"
  # (29 per file: none across two files).
  p_uni = 91 / (180 + 256)
  assert bits["unigram"] == pytest.approx(-math.log2(p_uni))
  p_next = {"a": (90 + p_uni) / (90 + 1), "b": (87 + p_uni) / (87 + 1)}
  x = np.asarray(batch["inputs"]).ravel() - FIRST
  want = np.mean([-math.log2(p_next[chr(b)]) for b in x])
  assert bits["bigram"] == pytest.approx(want)
  rep = survey.repeated_batch(batch, 4)
  x = np.asarray(rep["inputs"])
  np.testing.assert_array_equal(x[:, :4], x[:, 4:])
  np.testing.assert_array_equal(rep["targets"][:, 4:7], x[:, 5:8])
  assert rep["loss_mask"][0].tolist() == [1, 1, 1, 0, 1, 1, 1, 1]


# ------------------------------------------------------------ entry point


def test_smoke_run_reports_what_results_json_holds(tmp_path):
  corpus = _write(tmp_path / "corpus", {
      f"m{i}.py": "".join(f"def f{j}(x):\n    return x + {i * j}\n"
                          for j in range(8)) for i in range(6)})
  config = text_config.get_config("smoke")
  config.task.corpus = str(corpus)
  workdir = tmp_path / "run"
  results = entry_points.load("text_heads").run(config, workdir)
  saved = json.loads((workdir / "results.json").read_text())
  assert saved == results
  report = (workdir / "report.md").read_text()
  for name in results["figures"]:
    assert (workdir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert "<html" in (workdir / "explorer.html").read_text()[:200].lower()
  v = results["variants"]["L2"]
  bpb = v["bpb"]
  values = [results["runs"][f"L2_seed{s}"]["bpb"] for s in (0, 1)]
  assert bpb["values"] == values
  assert bpb["std"] == pytest.approx(np.std(values, ddof=1))
  row = [r for r in report.splitlines() if r.startswith("| L2 |")][0]
  cells = [c.strip() for c in row.strip("|").split("|")]
  assert cells[1] == (f"{bpb['mean']:.3f} ± {bpb['std']:.3f} "
                      f"{report_lib.interval(bpb['ci95'])}")
  assert cells[2] == f"{v['unigram']['mean']:.3f}"
  assert cells[3] == f"{v['bigram']['mean']:.3f}"
  # Taxonomy counts add up to the heads of the model.
  counts = results["runs"]["L2_seed0"]["taxonomy"]["counts"]
  assert sum(counts.values()) == config.model.num_layers * (
      config.model.num_heads)
  dyn = results["runs"]["L2_seed0"]["dynamics"]
  # Step 0 (the untrained model) and every checkpoint, evaluations
  # included.
  assert dyn["steps"][0] == 0 and {3, 6} <= set(dyn["steps"])
  assert len(dyn["icl"]) == len(dyn["steps"])
  assert dyn["bpb"][-1] == pytest.approx(results["runs"]["L2_seed0"]["bpb"],
                                         rel=1e-5)
  # The controls: experiment 1's models at both depths, every seed, each
  # best head beside the same model untrained, summarised with ddof 1,
  # and their table row in the report.
  ctl = results["control"]
  assert set(ctl["runs"]) == {f"L{d}_seed{s}" for d in (1, 2)
                              for s in config.experiment.control.seeds}
  for depth in ("L1", "L2"):
    for which in ("trained", "init"):
      for k in control.DETECTORS:
        x = ctl["summary"][depth][k][which]
        want = [ctl["runs"][f"{depth}_seed{s}"][which]["best"][k]
                for s in (0, 1)]
        assert x["values"] == want
        assert x["std"] == pytest.approx(np.std(want, ddof=1))
  # Trained and untrained are different models (smoke windows are too
  # short for a strict key, so that score is 0 in both).
  assert (ctl["summary"]["L2"]["span_induction"]["trained"]["values"]
          != ctl["summary"]["L2"]["span_induction"]["init"]["values"])
  x = ctl["summary"]["L2"]["repeat_induction"]
  row = [r for r in report.splitlines()
         if r.startswith("| repeated text (the taxonomy's) | L2 trained |")]
  assert row and row[0].endswith(f"| {x['seeds_firing']} of 2 |")
  # The strict span score sits beside the plain one for every run.
  v = results["variants"]["L2"]
  assert v["best_span_induction_strict"]["values"] == [
      float(np.max(results["runs"][f"L2_seed{s}"]["scores"]
                   ["span_induction_strict"])) for s in (0, 1)]
