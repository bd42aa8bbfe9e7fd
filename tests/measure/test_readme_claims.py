"""Which committed results back each README headline.

`tests/test_docs.py` checks that a decimal outside parentheses in a README
row linking docs/results/<name>/ appears somewhere in that results.json.
That lets a row quote a number from the wrong quantity (0.23 occurs more
than a hundred times in the circuits results) and skips every number in
parentheses, where most floors and baselines sit. Here each row names the
entries that back it (`BACKING`, dotted paths into results.json, each part
a glob on one key or list index), and every decimal of the row, in
parentheses or not, must equal one of those entries to its printed
digits. A new row linking results must add its entry here, which says in
one place what each headline rests on.
"""

from __future__ import annotations

import fnmatch
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


def _claim(name: str, *, role: bool = True) -> list[str]:
  """A circuits claim: the fraction and its reading against chance and,
  for a named head's path (`role`), its floor and its paired lead over
  the best other head."""
  fields = ["mean", "ci95.*", "vs_chance.mean", "vs_chance.ci95.*"]
  if role:
    fields += ["floor.mean", "lead.mean", "lead.ci95.*",
               "lead_vs_chance.mean", "lead_vs_chance.ci95.*"]
  return [f"claims.{name}.{field}" for field in fields]


# Row (the name in its docs/results/<name>/ link) -> the results.json
# entries its numbers may come from; `*` as a whole part is any key or
# index, inside a part any characters of one key.
BACKING = {
    "induction": ["summary.L2.final_loss.mean", "summary.L2.final_loss.std",
                  "summary.chance_loss", "summary.L1.final_loss.mean",
                  "summary.L2.max_induction_last_layer.mean",
                  "summary.L2.uniform_induction.mean"],
    "two_offsets": ["summary.continuous.h=1.nmse.mean",
                    "summary.continuous.h=1 + MLP*.nmse.mean",
                    "continuous.h=1, d_model=*.*.nmse",
                    "summary.continuous.h=2.nmse.mean"],
    "head_dim": ["part_a_summary.*.nmse.mean"],
    "cross_attention": ["summary.last_layer_alignment.mean",
                        "summary.best_head_within_1.mean",
                        "summary.uniform_within_1.mean"],
    "pruning": ["mean.zero_ablation.*", "mean.random.*",
                "two_removed_minus_random.zero_ablation.ci95.*",
                "mean.taylor_estimate.*"],
    "circuits": (_claim("key_prev_k_noise") + _claim("val_cur_v_noise")
                 + _claim("sc_cur_q_noise") + _claim("sc_q_max_noise")
                 + _claim("fc_and_denoise", role=False)),
    "sinks": ["summary.plain.key0_max.mean", "summary.plain.uniform_key0.mean",
              "summary.sinks.key0_max.mean", "summary.soft*.key0_max.mean",
              "summary.sinks.sink_layer0_mean.mean"],
    "pretrained_heads": ["heads.cls.layer_trained.mean.*",
                         "heads.cls.uniform.mean",
                         "single_sentences.trained.cls.mean.*",
                         "single_sentences.uniform.cls.mean",
                         "gradient.cls_over_other.mean.*",
                         "js.against_init.share_*", "js.against_init.ci95.*",
                         "js.against_init.difference"],
    "text_heads": ["variants.L4+MLP.bpb.mean", "variants.L4+MLP.bpb.std",
                   "variants.L4+MLP.bigram.mean"],
    "text_induction": ["summary.tokens.bits_per_byte.mean",
                       "summary.tokens.bits_per_byte.std",
                       "ngram.bigram.bits_per_byte",
                       "summary.bytes.bits_per_byte.mean",
                       "summary.tokens.best_prefix_matching.mean",
                       "summary.tokens.best_prefix_matching_init.mean"],
    "real_heads": [
        "models.smollm2.survey.scores.induction.mean.*.*",
        "models.smollm2.survey.scores.induction.floor",
        "models.smollm2.causal.zero.effect.induction.repeated.change",
        "models.smollm2.causal.zero.effect.induction.repeated.random.mean"],
    "ioi": ["models.smollm2.task.clean.mean", "models.gemma3.task.clean.mean"],
    "sae": ["summary.topk.explained_variance.mean",
            "summary.relu.explained_variance.mean"],
    "score_rules_bench": ["cases.*.paths.flash_all.x_skip.median",
                          "cases.*.paths.torch_flex.x_skip.median"],
    "kv_cache": ["summary.speedup_at_target"],
    "benchmark": ["train_step.*.x_torch.median",
                  "train_step.*.x_torch_compile.median"],
    "kv_behaviour": ["variants.*.eval_loss.mean",
                     "comparisons.*.eval_loss.ci95.*"],
}

_DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])")
_RATIO = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)x(?= faster| slower)")


def _resolve(tree, parts):
  """The numbers at a dotted pattern's `parts` in a JSON tree: each part a
  glob on one key or list index (`*` any one of them), so the walk visits
  only the branches a pattern names."""
  if not parts:
    if isinstance(tree, (int, float)) and not isinstance(tree, bool):
      yield tree
    return
  head, rest = parts[0], parts[1:]
  items = (tree.items() if isinstance(tree, dict) else
           enumerate(tree) if isinstance(tree, list) else ())
  for key, value in items:
    if fnmatch.fnmatchcase(str(key), head):
      yield from _resolve(value, rest)


def backed_values(name: str, folders=None) -> list[float]:
  """Every number `BACKING[name]` names in that experiment's results: in
  docs/results/<name>/results.json, or in each of `folders` (result
  folders below docs/results/, such as "benchmark/xeon", a second run of
  the experiment that a row links beside the first)."""
  out = []
  for folder in folders or [name]:
    data = json.loads((RESULTS / folder / "results.json").read_text())
    out += [v for pat in BACKING[name] for v in _resolve(data, pat.split("."))]
  return out


def rows(readme: str):
  """`(name, folders, row, quoted numbers)` of each table row linking one
  experiment's committed results (`folders`: the result folders its links
  name, docs/results/<name>/ or runs below it); link targets are not
  quoted numbers."""
  for line in readme.splitlines():
    folders = sorted(set(re.findall(r"\(docs/results/([\w/]+)/[\w.]+\)",
                                    line)))
    names = {f.split("/")[0] for f in folders}
    if not line.startswith("|") or len(names) != 1:
      continue
    text = re.sub(r"\]\([^)]*\)", "]", line)
    yield (*names, folders, line,
           _DECIMAL.findall(text) + _RATIO.findall(text))


def unbacked(readme: str) -> list[str]:
  """Each quoted number no backing entry of its row equals to its printed
  digits, and each row without a backing entry."""
  out = []
  for name, folders, line, numbers in rows(readme):
    if name not in BACKING:
      out.append(f"{name}: no BACKING entry for the row {line[:60]!r}")
      continue
    backed = backed_values(name, folders)
    for number in numbers:
      digits = len(number.split(".")[1]) if "." in number else 0
      if not any(f"{abs(v):.{digits}f}" == number for v in backed):
        out.append(f"{name}: {number} is none of {BACKING[name]}")
  return out


def test_every_readme_number_is_backed_by_its_named_results():
  readme = (ROOT / "README.md").read_text()
  assert list(rows(readme)), "the README quotes no committed result"
  assert not unbacked(readme), unbacked(readme)


def test_every_backing_entry_names_results_that_exist():
  """A pattern that matches nothing is stale: its results were renamed."""
  for name, patterns in BACKING.items():
    data = json.loads((RESULTS / name / "results.json").read_text())
    for pat in patterns:
      assert list(_resolve(data, pat.split("."))), f"{name}: {pat}"


@pytest.mark.parametrize("row, expected", [
    # The value path's mean (0.231) and its interval's ends are backed.
    ("| induction circuit | current-token head feeds values 0.23 [0.11, "
     "0.35] | [report](docs/results/circuits/report.md) |", []),
    # 0.66 is in the circuits results (the previous-token score's mean),
    # but no claim the row names: the any-number check would pass it.
    ("| induction circuit | previous-token score 0.66 (chance 9.99) "
     "| [report](docs/results/circuits/report.md) |",
     ["circuits: 0.66", "circuits: 9.99"]),
    ("| new | a number 0.5 | [report](docs/results/new_thing/report.md) |",
     ["new_thing: no BACKING entry"]),
])
def test_unbacked_names_the_number_and_the_row(row, expected):
  found = unbacked(row)
  assert len(found) == len(expected), found
  for f, e in zip(found, expected):
    assert f.startswith(e)
