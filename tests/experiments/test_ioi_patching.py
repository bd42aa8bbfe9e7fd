"""IOI's activation patching is the library's at per-example positions:
its per-prompt logit differences equal a plain loop over layers, heads
and roles that patches one head's `z` with a `jnp.where` on the model's
own call (every position and every block, no END-only readout, no late
start) and reads each prompt's logit difference at its END."""

from __future__ import annotations

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.ioi import head_patching
from experiments.ioi import run
from experiments.ioi_task import forward
from experiments.ioi_task import paths
from experiments.ioi_task import models
from experiments.ioi_task import prompts

TOK = models.word_tokenizer()
P = prompts.subset(prompts.build(TOK, prompts.single_token_names(TOK),
                                 per_template_order=1, seed=5),
                   np.arange(6))
ROLES = ("S1", "IO", "S2", "END", "rest")


@functools.partial(jax.jit, static_argnums=(0, 6))
def _library(graphdef, state, target, source, meta, masks, layers):
  return head_patching.activation_patching(nnx.merge(graphdef, state),
                                           target, source, meta, masks,
                                           layers=layers)


@functools.partial(jax.jit, static_argnums=0)
def _hand_patched(graphdef, state, layer, target, src, on, meta):
  """`[M, N]`: the model's own call on `target` with layer `layer`'s z
  replaced by the source run's (`src`) where `on [M, N, T, H, 1]` is
  True, one run per mask, read at each prompt's END."""
  model = nnx.merge(graphdef, state)
  rows = jnp.arange(target.shape[0])

  def one(on):
    patch = {site: (lambda x, v=v, on=on & (layer == l): jnp.where(on, v, x))
             for l, (site, v) in enumerate(src.items())}
    logits = model(target, patch=patch)
    return forward.logit_diff(logits[rows, meta["end"]], meta["io"],
                              meta["s"])
  return jax.vmap(one)(on)


def _loop(model, target, source, meta):
  """`[L, H, R, N]`, a patched run per layer, head and role."""
  graphdef, state = nnx.split(model)
  c = model.config
  sites = paths.z_sites(c.num_layers)
  _, src = model(source, capture=sites)
  masks = np.asarray(head_patching.role_masks(P, target.shape[1], ROLES))
  out = np.zeros((c.num_layers, c.num_heads, len(ROLES), len(meta["end"])))
  for l, site in enumerate(sites):
    on = np.stack([mask[:, :, None, None] & (np.arange(c.num_heads) == h)[
        None, None, :, None] for h in range(c.num_heads) for mask in masks])
    out[l] = np.asarray(_hand_patched(graphdef, state, l, target, src, on,
                                      meta)).reshape(out.shape[1:])
  return out


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_gemma3"])
def test_ioi_patching_is_a_loop_of_hand_patched_heads(name):
  """Noising (ABC into clean) and, on the 2-layer model, denoising; from
  the first block and from a later one (`layers`)."""
  model, _, _ = models.load(name)
  graphdef, state = nnx.split(model)
  meta = run._meta(P)
  clean, abc = jnp.asarray(P["tokens"]), jnp.asarray(P["corrupted"])
  num_layers = model.config.num_layers
  masks = head_patching.role_masks(P, clean.shape[1], ROLES)
  ways = ((clean, abc), (abc, clean))[:2 if num_layers == 2 else 1]
  for target, source in ways:
    want = _loop(model, target, source, meta)
    got = np.asarray(_library(graphdef, state, target, source, meta, masks,
                              None))
    assert got.shape == want.shape
    # Real changes are compared: patching moves the difference.
    base = np.asarray(forward.logit_diff(model(target)[np.arange(len(
        meta["end"])), meta["end"]], meta["io"], meta["s"]))
    assert np.max(np.abs(want - base)) > 1e-3 * np.max(np.abs(base))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    late = np.asarray(_library(graphdef, state, target, source, meta, masks,
                               (1, num_layers)))
    np.testing.assert_allclose(late, want[1:], rtol=1e-5, atol=1e-5)
