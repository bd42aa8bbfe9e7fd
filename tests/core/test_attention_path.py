"""One record per `attend` path: what a record claims, the paths do.

* The table of paths in docs/architecture.md is the records, row by row.
* Each rule option a record lists is applied: the path's output equals
  the reference's ("vmap") under that option alone; each option it does
  not list is refused naming the option and the paths that take it.
* A new path is one record: registered, it is dispatched to, validated,
  refused what it lacks and kept from the hook sites, with no other edit.
"""

from __future__ import annotations

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mha_jax
from mha_jax.core import attention
from mha_jax.core import attention_path
from mha_jax.core import score_rules
from mha_jax.core.kernels import flash

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs/architecture.md"
B, T, H, K, DH = 2, 6, 4, 2, 8


def _page_rows():
  """The page's table of paths: {name: {column: text}}."""
  text = PAGE.read_text().split("<!-- paths -->", 1)[1].split(
      "<!-- /paths -->", 1)[0]
  lines = [l for l in text.strip().splitlines() if l.startswith("|")]
  head = [c.strip() for c in lines[0].strip("|").split("|")]
  rows = {}
  for line in lines[2:]:
    cells = [c.strip() for c in line.strip("|").split("|")]
    rows[cells[0].strip("`")] = dict(zip(head, cells))
  return rows


def _rules_cell(rules) -> str:
  """A record's rule options as the page writes them."""
  if rules == attention_path.EVERY_RULE:
    return "all"
  missing = attention_path.EVERY_RULE - rules
  if missing == {"q_positions", *score_rules.USER_FIELDS}:
    return "all but `q_positions` and the user rules"
  return ", ".join(f"`{n}`" for n in score_rules.OPTIONS if n in rules)


def test_the_page_lists_every_path_as_its_record():
  rows = _page_rows()
  paths = attention.all_paths()
  assert list(rows) == list(paths)
  for name, p in paths.items():
    want = {
        "computes": p.computes,
        "weights": "yes" if p.forms_weights else "no",
        "rule options": _rules_cell(p.rules),
        "dropout": "yes" if p.dropout else "no",
        "dense scores": {None: "no", "float32": "float32",
                         "input": "input dtype"}[p.dense_scores],
        "backends": ("all" if p.backends is None
                     else ", ".join(sorted(p.backends))),
    }
    got = {k: v for k, v in rows[name].items() if k != "path"}
    assert got == want, name


def _qkv():
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (B, T, H, DH))
  k = jax.random.normal(keys[1], (B, T, K, DH))
  v = jax.random.normal(keys[2], (B, T, K, DH))
  return q, k, v


def _one_option(name):
  """`attend` keywords that turn on the rule option `name` alone."""
  seg = jnp.asarray(np.repeat([[0, 0, 0, 1, 1, 1]], B, 0), jnp.int32)
  rules = {
      "local_window": dict(local_window=(2, 1)),
      "soft_cap": dict(soft_cap=1.5),
      "scale": dict(scale=0.3),
      "q_segment_ids": dict(q_segment_ids=seg, kv_segment_ids=seg),
      "sinks": dict(sinks=jnp.linspace(-1.0, 1.0, H)),
      "alibi_slopes": dict(alibi_slopes=score_rules.alibi_slopes(H)),
      "q_positions": dict(q_positions=jnp.asarray(
          np.tile(np.arange(T)[::-1], (B, 1)), jnp.int32)),
      "score_mod": dict(score_mod=lambda s, b, h, qi, ki: s + 0.5 * (h + 1)
                        * (ki % 2)),
      "mask_mod": dict(mask_mod=lambda b, h, qi, ki: ki != 1),
      "block_mask": dict(block_mask=None),
  }[name]
  # q_positions and ALiBi act through the causal rule and distances.
  return {"is_causal": name in ("q_positions",),
          "rules": score_rules.ScoreRules(**rules)}


# Paths that run on any CPU test quickly; pallas_tpu needs blocks of 128
# (tests/core/test_pallas.py), cudnn a GPU, ring/all_to_all a mesh
# (tests/parallel).
CPU_PATHS = ("vmap", "einsum", "flash", "xla", "auto")


@pytest.mark.parametrize("name", CPU_PATHS)
@pytest.mark.parametrize("option", [o for o in score_rules.OPTIONS
                                    if o != "block_mask"])
def test_a_listed_option_is_applied_and_an_unlisted_one_refused(name,
                                                                option):
  q, k, v = _qkv()
  kwargs = _one_option(option)
  path = attention.PATHS[name]
  if option not in path.rules:
    takers = sorted(n for n, p in attention.all_paths().items()
                    if option in p.rules)
    with pytest.raises(ValueError, match=re.escape(
        f"attend: implementation={name!r} does not apply `{option}` "
        f"({score_rules.OPTION_WORDS[option]}); use one of {takers}")):
      attention.attend(q, k, v, implementation=name, **kwargs)
    return
  want, _ = attention.attend(q, k, v, implementation="vmap", **kwargs)
  plain, _ = attention.attend(q, k, v, implementation="vmap")
  got, _ = attention.attend(q, k, v, implementation=name, **kwargs)
  # The option changes the answer, so equality shows it was applied.
  assert float(jnp.max(jnp.abs(want - plain))) > 1e-3
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _flash_scale_only(q, k, v, mask, bias, keep, *, is_causal,
                      dropout_rate, rules):
  """A new path in a test: the blockwise kernel, taking the scale only."""
  del keep, dropout_rate
  return flash.flash_attention(q, k, v, mask=mask, bias=bias,
                               is_causal=is_causal, rules=rules), None


@pytest.fixture
def new_path():
  record = attention_path.AttentionPath(
      name="scale_only", fn=_flash_scale_only, rules={"scale"},
      computes="a test path: the blockwise kernel, scale only")
  attention.register(record)
  yield record
  del attention._REGISTERED["scale_only"]  # pylint: disable=protected-access


def test_a_new_path_is_one_record(new_path):
  q, k, v = _qkv()
  rules = score_rules.ScoreRules(scale=0.3)
  got, pattern = mha_jax.attend(q, k, v, is_causal=True, rules=rules,
                                implementation=new_path.name)
  want, _ = mha_jax.attend(q, k, v, is_causal=True, rules=rules)
  assert pattern is None
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert attention.known_implementation("scale_only")
  assert not attention.forms_weights("scale_only")
  with pytest.raises(ValueError, match=re.escape(
      "attend: implementation='scale_only' does not apply `soft_cap` "
      "(logit soft-capping); use one of ['all_to_all', 'auto', 'einsum', "
      "'flash', 'pallas_gpu', 'pallas_tpu', 'ring', 'vmap']")):
    mha_jax.attend(q, k, v, implementation="scale_only",
                   rules=score_rules.ScoreRules(soft_cap=2.0))
  with pytest.raises(ValueError, match=re.escape(
      "attend: implementation='scale_only' has no attention dropout (it "
      "never forms the weights to drop); use dropout_rate=0 or one of "
      "['auto', 'einsum', 'vmap']")):
    mha_jax.attend(q, k, v, implementation="scale_only", dropout_rate=0.1,
                   dropout_rng=jax.random.key(1))
  with pytest.raises(ValueError, match="never forms the attention weights"):
    mha_jax.attend(q, k, v, implementation="scale_only",
                   hooks=mha_jax.Hooks(capture=("pattern",)))


def test_a_record_is_checked_when_made():
  with pytest.raises(ValueError, match=re.escape(
      "AttentionPath 'x': unknown rule options ['window']")):
    attention_path.AttentionPath(name="x", fn=None, computes="",
                                 rules={"window"})
  with pytest.raises(TypeError, match="`path` must be an AttentionPath "
                     "record, got function"):
    attention.register(_flash_scale_only)


def test_a_path_on_another_backend_is_refused_naming_it():
  if jax.default_backend() == "gpu":
    pytest.skip("cudnn runs here")
  q, k, v = _qkv()
  with pytest.raises(ValueError, match=re.escape(
      "attend: implementation='cudnn' runs on gpu only, but the JAX "
      f"backend is {jax.default_backend()!r}")):
    mha_jax.attend(q, k, v, implementation="cudnn")
