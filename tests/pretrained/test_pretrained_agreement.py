"""Loaded checkpoints agree with transformers on the same weights.

For each family, a tiny random transformers model (tests/hf_models.py)
is saved in safetensors and loaded by mha_jax; logits,
every layer's residual stream and every attention pattern are compared
with transformers' float64 run of the same model.

Bounds. Two float32 runs of transformers give identical bits, so its
noise floor is its distance from float64: 0.9e-7 to 6.9e-7 relative in
norm (1.5 to 12 float32 roundings) over the families and quantities.
mha_jax in float32 measured 0.86 to 1.19 times that distance, so each
quantity must be within twice transformers' own float32 error. bfloat16:
the parameters are rounded to bf16 on both sides (so only the compute
differs) and the reference is the float64 run on those weights. One
bf16 rounding errs by u = 2**-8 relative; a layer is held to 4 u
(docs/testing.md), and these 2-3 layer stacks add a rounded residual sum
per sublayer: measured 0.86 to 3.4 u for mha_jax and 0.97 to 4.0 u for
transformers' own bf16 run, so the bound is 8 u.

A cast that truncates instead of rounding errs by at most one bf16 ulp
per weight, which these bounds absorb (a truncating loader passed them
for every family); so the bf16 parameters are also checked bit for bit
against torch's own rounding of the file's float32 tensors.
"""

import copy

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.torch
import torch
from flax import nnx

import mha_jax
from mha_jax.pretrained import layout
from mha_jax.pretrained import weights
from tests.pretrained import compare
import hf_models

FAMILIES = tuple(hf_models.CONFIGS)
QUANTITIES = ("main", "stream", "patterns")


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_within_twice_transformers_own_error(built, family):
  b = built(family)
  model = mha_jax.load_pretrained(b.directory)
  ours = compare.run(model, family, b.batch)
  for q in QUANTITIES:
    assert ours[q].shape == b.out64[q].shape, q
    floor = compare.rel(b.out32[q], b.out64[q])
    assert 0 < floor < 50 * compare.U32, (q, floor)  # a real float32 run
    err = compare.rel(ours[q], b.out64[q])
    assert err <= 2 * floor, (q, err, floor)


@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_within_8_roundings(built, family):
  b = built(family)
  model = mha_jax.load_pretrained(b.directory, param_dtype=jnp.bfloat16)
  assert model.blocks[0].attn.w_q[...].dtype == jnp.bfloat16
  # The reference: float64 compute on the same bf16-rounded weights.
  ref = copy.deepcopy(b.model).to(torch.bfloat16).double()
  ref_out = hf_models.run(ref, b.batch)
  ours = compare.run(model, family, b.batch)
  for q in QUANTITIES:
    err = compare.rel(ours[q], ref_out[q])
    assert err <= 8 * compare.U_BF16, (q, err / compare.U_BF16)


@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_parameters_are_torchs_rounding(built, family):
  """Each bf16 parameter has the bits of torch's `.to(torch.bfloat16)` of
  the float32 tensor of the file it comes from (read by safetensors' own
  torch reader; torch's bits laid out by the family's table, which only
  moves them)."""
  b = built(family)
  fam = mha_jax.pretrained.FAMILIES[family]
  model = mha_jax.load_pretrained(b.directory, param_dtype=jnp.bfloat16)
  ours = {".".join(map(str, p)): np.asarray(v[...]) for p, v in
          nnx.to_flat_state(nnx.state(model, nnx.Param))}
  theirs = safetensors.torch.load_file(b.directory / "model.safetensors")
  sizes = weights.axis_sizes(model.config)
  seen, inexact = set(), 0
  for source, rule, paths in weights.expand(fam, model.config.num_layers):
    if not all(p in ours for p in paths):
      continue  # a row this config does not use (biases, a tied head)
    w = theirs[weights.checkpoint_name(fam, source, paths)]
    rounded = w.to(torch.bfloat16)
    inexact += int((rounded.float() != w).sum())
    bits = rounded.view(torch.int16).numpy()
    for p, want in zip(paths, layout.to_params(bits, rule.src, rule.dst,
                                               sizes)):
      np.testing.assert_array_equal(ours[p].view(np.int16), want, err_msg=p)
      seen.add(p)
  assert seen == set(ours)
  assert inexact > 0  # weights that bf16 cannot hold: rounding is tested
