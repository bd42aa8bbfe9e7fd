"""Induction on real text: its scores on known answers, and its smoke run.

The detector (prefix matching on repeated random tokens) is checked on a
known positive, experiment 1's 2-layer models trained on its induction
task, and a known negative, the same models at initialisation; the ICL
score and the n-gram baselines on hand-made numbers; the entry point end
to end on a tiny corpus, its report against its results.json.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from configs import induction as induction_config
from configs import text_induction as text_induction_config
from experiments.text_induction import run as run_lib
from experiments.text_induction import scores
from mha_jax.measure import report as report_lib
from mha_jax.measure import runs as runs_lib
from mha_jax.training import held_out
from mha_jax.training import tasks
from mha_jax.training import train_state

import entry_points


@pytest.fixture(scope="module")
def induction_models(tmp_path_factory):
  """Experiment 1's model and task, trained for 400 steps at a learning
  rate of 1e-2 (its own: 800 at 3e-3; this forms the same layer-1
  induction heads, best 0.81, in a quarter of the time), and its
  initialisation."""
  c = runs_lib.variant(induction_config.get_config(),
                       **{"train.num_steps": 400, "train.eval_every": 400,
                          "train.learning_rate": 1e-2})
  state = runs_lib.train_run(c, tmp_path_factory.mktemp("ind"))
  return c, state.model(), train_state.create_train_state(c).model()


def test_prefix_matching_fires_on_induction_models_only(induction_models):
  c, trained, init = induction_models
  ids = np.arange(tasks.NUM_SPECIAL, c.task.vocab_size)
  rep = scores.repeated_random(ids, c.task.seq_len // 2, 32, seed=0)
  threshold = text_induction_config.get_config().experiment.threshold
  got, base = (scores.prefix_matching(m, rep) for m in (trained, init))
  floor = scores.prefix_matching_floor(rep)
  assert got.shape == (2, 4)
  assert got[1].max() >= threshold  # a layer-1 head matches prefixes
  assert got[0].max() < threshold  # layer 0 cannot: nothing came before
  # At initialisation every head is near uniform attention's floor
  # (0.08 on 16 + 16 tokens of 29 symbols, repeats within a copy
  # included), far below the threshold and the trained heads.
  assert floor < threshold / 3
  assert np.all(np.abs(base - floor) < floor / 2)
  assert got[1].max() > 4 * base.max()


def test_ablation_removes_the_gain_of_experiment_1s_induction_heads(
    induction_models):
  """The causal check on a model whose answer is known: on repeated
  random tokens (first copy early, second late) the loss gain comes from
  the layer-1 induction heads; ablating them removes most of it; ablating
  others is drawn and scored as the summary's shares say."""
  c, trained, _ = induction_models
  ids = np.arange(tasks.NUM_SPECIAL, c.task.vocab_size)
  seq = scores.repeated_random(ids, 17, 64, seed=3)  # T + 1 = 34 tokens
  batch = {"inputs": seq[:, :32], "targets": seq[:, 1:33]}
  e = text_induction_config.get_config().experiment
  e.early_positions, e.late_positions = (2, 14), (20, 32)
  pm = scores.prefix_matching(trained, batch["inputs"])
  heads = [(int(l), int(h)) for l, h in zip(*np.nonzero(pm >= e.threshold))]
  assert heads and all(l == 1 for l, _ in heads)
  a = run_lib.ablation(trained, batch, heads, e, seed=0)
  assert a["intact"] < -1.0  # the second copy is cheap: a large ICL gain
  assert len(a["others"]) == e.random_draws
  for draw in a["other_heads"]:
    assert len(draw) == len(heads) and not set(draw) & set(heads)
  want = scores.icl_score(held_out.per_position_loss(
      trained, batch, held_out.head_gates(trained, heads)), (2, 14),
                          (20, 32)).mean()
  assert a["induction"] == pytest.approx(float(want), rel=1e-5)
  res = {"traj": {k: [0.0] for k in ("bits_per_byte", "bits_per_token",
                                     "icl", "uniform_prefix_matching")},
         "landmarks": {"best_prefix_matching": [0.0], "formation_step": 0,
                       "icl_step": 0, "icl_minus_formation": 0}}
  res["traj"].update(previous_token=[np.zeros((2, 4))],
                     duplicate_token=[np.zeros((2, 4))],
                     copying=[np.zeros((2, 4))])
  summary = run_lib._summary([{**res, "ablation": a}] * 2, "m")["m"]
  kept = summary["ablation"]["share_kept_induction"]["mean"]
  assert kept == pytest.approx(a["induction"] / a["intact"])
  assert kept < 0.5  # most of the gain goes with the induction heads
  # (The other heads include layer 0's previous-token head, which the
  # circuit needs as well, so here they are no control: only the share's
  # arithmetic is checked.)
  assert summary["ablation"]["share_kept_others"]["mean"] == pytest.approx(
      np.mean([o / a["intact"] for o in a["others"]]))


def test_repeated_random_and_floor_known_answers():
  rep = scores.repeated_random(np.array([7, 8, 9]), 5, 4, seed=1)
  assert rep.shape == (4, 10) and set(np.unique(rep)) <= {7, 8, 9}
  np.testing.assert_array_equal(rep[:, :5], rep[:, 5:])
  # Distinct tokens: the target of query q >= n is key q - n + 1, seen by
  # uniform attention with weight 1 / (q + 1).
  distinct = np.arange(8, dtype=np.int32)[None].repeat(2, 0)
  seq = np.concatenate([distinct, distinct], axis=1)
  want = np.mean([1 / (q + 1) for q in range(8, 16)])
  assert scores.prefix_matching_floor(seq) == pytest.approx(want, rel=1e-6)


def test_icl_score_and_bits_known_answers():
  loss = np.tile(np.linspace(3.0, 1.0, 10), (2, 1))  # falls 0.222 a step
  np.testing.assert_allclose(scores.icl_score(loss, (0, 2), (8, 10)),
                             [(1.0 + 1.222222) / 2 - (3.0 + 2.777778) / 2] * 2,
                             atol=1e-5)
  b = scores.bits(np.full((1, 4), np.log(2.0)), np.array([[3, 4, 4, 5]]),
                  np.array([0, 0, 0, 1, 2, 3]))
  assert b["bits_per_token"] == pytest.approx(1.0)
  assert b["bits_per_byte"] == pytest.approx(4 / 8)


def test_landmarks_known_answers():
  pm = np.zeros((5, 2, 2))
  pm[:, 1, 0] = [0.0, 0.1, 0.3, 0.5, 0.6]
  traj = {"steps": [0, 10, 20, 30, 40], "prefix_matching": pm,
          "icl": [0.0, 0.0, -0.1, -0.3, -0.4]}
  m = run_lib.landmarks(traj, 0.3)
  assert m["formation_step"] == 20  # reaching the threshold counts
  assert m["icl_step"] == 30  # -0.3 is the first past half of -0.4
  assert m["icl_minus_formation"] == 10
  assert m["induction_heads"] == [(1, 0)]


def _corpus(folder):
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True)
  for i in range(6):
    (folder / f"m{i}.py").write_text("".join(
        f"def name_{j}(value):\n    return value + {i * j}\n"
        for j in range(30)))
  return folder


def test_smoke_run_reports_what_results_json_holds(tmp_path):
  config = entry_points.config("text_induction")
  config.task.corpus = str(_corpus(tmp_path / "corpus"))
  config.task.cache_dir = str(tmp_path / "cache")
  workdir = tmp_path / "run"
  results = entry_points.load("text_induction").run(config, workdir)
  saved = json.loads((workdir / "results.json").read_text())
  assert saved == json.loads(json.dumps(saved)) and saved == results
  report = (workdir / "report.md").read_text()
  for f in ("bump_tokens.png", "trajectories_bytes.png"):
    assert (workdir / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  s = results["summary"]["tokens"]
  values = [results["runs"][f"tokens_seed{k}"]["traj"]["bits_per_byte"][-1]
            for k in (0, 1)]
  assert s["bits_per_byte"]["values"] == values
  assert s["bits_per_byte"]["std"] == pytest.approx(np.std(values, ddof=1))
  row = entry_points.table(report, "| model | bits per byte |")
  assert row[0][:2] == ["tokens", report_lib.summary(s["bits_per_byte"])]
  tr = results["runs"]["tokens_seed0"]["traj"]
  # Step 0 (the untrained model) and every checkpoint.
  assert tr["steps"][0] == 0 and {3, 6} <= set(tr["steps"])
  assert np.shape(tr["prefix_matching"]) == (len(tr["steps"]), 2, 2)
  assert len(tr["loss_by_position"][0]) == config.task.seq_len
  # The byte control is the same model on bytes.
  b = json.loads((workdir / "bytes_seed0" / "config.json").read_text())
  assert b["task"]["name"] == "text" and b["task"]["vocab_size"] == 259
  assert b["model"] == json.loads(
      (workdir / "tokens_seed0" / "config.json").read_text())["model"]


def test_ngram_baselines_known_answer(tmp_path):
  """Unigram (add-one) and bigram (unigram prior of weight one) bits,
  counted by hand from the training files' token lists."""
  rng = np.random.default_rng(0)
  words = ["x", "value", "return", "(", ")", ":", "\n", "def", "  ", "+"]
  folder = tmp_path / "corpus"
  folder.mkdir()
  for i in range(6):  # unequal frequencies, so every count differs
    (folder / f"m{i}.py").write_text(" ".join(rng.choice(
        words, 600, p=np.arange(1, 11) / 55)))
  config = text_induction_config.get_config("smoke")
  config.task.corpus = str(folder)
  config.task.cache_dir = str(tmp_path / "cache")
  tc = tasks.text_tokens_of(config.task)
  v = config.task.vocab_size
  uni, pairs, after = np.zeros(v), {}, np.zeros(v)
  for i in range(len(tc.train.documents)):
    t = tc.train.document_tokens(i).tolist()
    for a in t:
      uni[a] += 1
    for a, b in zip(t[:-1], t[1:]):
      pairs[a, b] = pairs.get((a, b), 0) + 1
      after[a] += 1
  x = tc.held_out.windows(np.arange(3))
  batch = {"inputs": x[:, :-1], "targets": x[:, 1:]}
  got = run_lib.ngram_baselines(config, batch)
  p_uni = (uni + 1) / (uni.sum() + v)
  bits_uni, bits_bi = [], []
  for a, b in zip(batch["inputs"].ravel(), batch["targets"].ravel()):
    bits_uni.append(-np.log2(p_uni[b]))
    bits_bi.append(-np.log2((pairs.get((a, b), 0) + p_uni[b])
                            / (after[a] + 1)))
  nbytes = tc.token_bytes[batch["targets"]].sum()
  assert got["unigram"]["bits_per_token"] == pytest.approx(np.mean(bits_uni))
  assert got["bigram"]["bits_per_token"] == pytest.approx(np.mean(bits_bi))
  assert got["bigram"]["bits_per_byte"] == pytest.approx(
      np.sum(bits_bi) / nbytes)
