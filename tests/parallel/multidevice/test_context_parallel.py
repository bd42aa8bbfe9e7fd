"""Context parallelism on 8 simulated devices equals the one-device kernel.

Every check runs the blockwise kernel (`flash.flash_attention`) on one
device as the reference, on the same inputs in natural order, and the
ring or all-to-all path on a mesh with a "sequence" axis.

The bound. Both paths compute every score q.k alike (a length-Dh dot
product whatever the blocking), so they differ only in how the per-key
and per-query sums are grouped: blocks of another length, slices merged
one device at a time, rescaled by other running maxima. A float32 sum of
n terms in any grouping is within (n - 1) u sum|terms| of the exact sum
(u = 2^-24), and each rescale or exp adds at most a few u to a term, so
two groupings differ by at most 2 (n + c) u S with S = sum|terms| and a
small constant c. The backward's probabilities exp(s - lse) inherit the
forward's lse error (at most (Tk + c) u relative), hence per element

    |ring - one device| <= 2 (n + Tk + 8) u S

where, from the reference's weights P, dS = P (dP - delta) with dP =
dO V^T and delta = dO . O, each rounded over Dh terms. dS can cancel to 0
where its rounding does not, so its size is taken as |dS|' = P (|dO| |V|^T
+ |dO| . |O|) (and |d softcap| <= 1 only shrinks it):
  out: n = Tk, S = sum_j P_ij |v_j|;
  dq: n = Tk + Dh, S = scale sum_j |dS_ij|' |k_j|;
  dk: n = G Tq + Dh, S = scale sum_i |dS_ij|' |q_i|;  dv: n = G Tq,
  S = sum_i P_ij |dO_i|;  d sinks: n = B Tq + Dh, S = sum P_sink |dO| . |O|;
  d slopes: n = B Tq Tk + Dh, S = sum |dS_ij|' |i - j|.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mha_jax.core import attention
from mha_jax.core import score_rules
from mha_jax.core.kernels import flash
from mha_jax.parallel import all_to_all
from mha_jax.parallel import context
from mha_jax.parallel import ring
from mha_jax.parallel import sharding

U = 2.0 ** -24
B, T, H, DH = 2, 96, 8, 8
# C = 12 tokens per device on 8 (runs of 6 with "zigzag"): blocks of 5 leave
# a partial block on every device, and one device's 96 on the reference.
BLOCK = 5


def _inputs(kv_heads, seed=0, tq=T):
  """q and d_out of length `tq`, k and v of length T."""
  ks = jax.random.split(jax.random.PRNGKey(seed), 6)
  q = jax.random.normal(ks[0], (B, tq, H, DH))
  k = jax.random.normal(ks[1], (B, T, kv_heads, DH))
  v = jax.random.normal(ks[2], (B, T, kv_heads, DH))
  d_out = jax.random.normal(ks[3], (B, tq, H, DH))
  sinks = jax.random.normal(ks[4], (H,))
  slopes = jnp.linspace(0.0, 0.3, H)
  return q, k, v, d_out, sinks, slopes


# Two packed documents per row, split where no device boundary falls.
SEGMENTS = jnp.asarray(np.stack([np.r_[np.zeros(41), np.ones(55)],
                                 np.r_[np.zeros(7), np.ones(89)]]), jnp.int32)


def _rules(kind, sinks, slopes, tq=T):
  """With tq < T the queries are the last tq positions (the bottom-right
  alignment), so their segment ids are the keys' last tq."""
  q_seg = SEGMENTS[:, T - tq:]
  if kind == "plain":
    return score_rules.NO_RULES
  if kind == "window_segments":
    return score_rules.ScoreRules(local_window=(17, 3),
                                  q_segment_ids=q_seg,
                                  kv_segment_ids=SEGMENTS)
  # Every rule at once.
  return score_rules.ScoreRules(
      local_window=(30, 2), soft_cap=3.0, sinks=sinks, alibi_slopes=slopes,
      q_segment_ids=q_seg, kv_segment_ids=SEGMENTS)


def _grads(path, q, k, v, d_out, sinks, slopes, kind, is_causal, mask):
  """out and d(q, k, v, sinks, slopes) of sum(out * d_out) along `path`."""
  def loss(q, k, v, sinks, slopes):
    rules = _rules(kind, sinks, slopes, q.shape[1])
    out = path(q, k, v, rules, is_causal, mask)
    return jnp.sum(out * d_out), out
  (_, out), grads = jax.jit(jax.value_and_grad(
      loss, argnums=(0, 1, 2, 3, 4), has_aux=True))(q, k, v, sinks, slopes)
  return out, grads


def _one_device(q, k, v, rules, is_causal, mask):
  return flash.flash_attention(q, k, v, mask=mask, is_causal=is_causal,
                               rules=rules, block_q=BLOCK, block_k=BLOCK)


def _bounds(q, k, v, d_out, sinks, slopes, kind, is_causal, mask):
  """The elementwise bounds of the module docstring, from the weights
  (Tq = q.shape[1], Tk = T)."""
  tq = q.shape[1]
  rules = _rules(kind, sinks, slopes, tq)
  out, p = attention.attend(q, k, v, mask=mask, is_causal=is_causal,
                            rules=rules, implementation="einsum")
  g = H // k.shape[2]
  rep = lambda x: jnp.repeat(x, g, axis=2)  # kv heads per query head
  # |dP - delta| <= |dO|.|v_j| + |dO|.|O_i|: the size of the terms whose
  # cancellation dS's rounding cannot see (a row with one allowed key has
  # dS = 0 exactly, yet each path rounds dP and delta its own way).
  delta = jnp.einsum("bqhd,bqhd->bhq", jnp.abs(d_out), jnp.abs(out))
  ds = p * (jnp.einsum("bqhd,bkhd->bhqk", jnp.abs(d_out), jnp.abs(rep(v)))
            + delta[..., None])
  scale = score_rules.scale_of(rules, DH)
  per_kv = lambda x: x.reshape(B, T, k.shape[2], g, DH).sum(3)
  dist = jnp.abs(jnp.arange(T - tq, T)[:, None]
                 - jnp.arange(T)[None]).astype(jnp.float32)
  sums = {
      "out": jnp.einsum("bhqk,bkhd->bqhd", p, jnp.abs(rep(v))),
      "q": scale * jnp.einsum("bhqk,bkhd->bqhd", ds, jnp.abs(rep(k))),
      "k": scale * per_kv(jnp.einsum("bhqk,bqhd->bkhd", ds, jnp.abs(q))),
      "v": per_kv(jnp.einsum("bhqk,bqhd->bkhd", p, jnp.abs(d_out))),
      "sinks": jnp.sum((1.0 - p.sum(-1)) * jnp.abs(delta), axis=(0, 2)),
      "slopes": jnp.einsum("bhqk,qk->h", ds, dist)}
  n = {"out": T, "q": T + DH, "k": g * tq + DH, "v": g * tq,
       "sinks": B * tq + DH, "slopes": B * tq * T + DH}
  return {name: 2 * (n[name] + T + 8) * U * s + 1e-30
          for name, s in sums.items()}


def _check(path, kv_heads, kind, is_causal, mask=None, tq=T):
  """Values and gradients of `path` within the bound of the one-device
  kernel's; returns the path's out and gradients for further checks."""
  q, k, v, d_out, sinks, slopes = _inputs(kv_heads, tq=tq)
  args = (q, k, v, d_out, sinks, slopes, kind, is_causal, mask)
  want_out, want = _grads(_one_device, *args)
  got_out, got = _grads(path, *args)
  bound = _bounds(*args)
  names = ("q", "k", "v", "sinks", "slopes")
  pairs = [("out", got_out, want_out)] + list(zip(names, got, want))
  if kind != "all_rules":
    pairs = pairs[:4]  # sinks and slopes unused: their gradients are zero
  for name, a, b in pairs:
    err = np.abs(np.asarray(a) - np.asarray(b))
    worst = float(np.max(err / np.asarray(bound[name])))
    assert worst <= 1.0, (name, worst, float(err.max()))
  return got_out, got


def _ring_path(mesh, layout):
  n = mesh.shape["sequence"]

  def path(q, k, v, rules, is_causal, mask):
    # The caller's data arrives in layout order; put it there and back.
    to = lambda x: context.to_layout(x, n, layout)
    if rules.q_segment_ids is not None:
      rules = rules.replace(q_segment_ids=to(rules.q_segment_ids),
                            kv_segment_ids=to(rules.kv_segment_ids))
    mask = None if mask is None else context.to_layout(mask, n, layout, 3)
    out = ring.ring_attention(to(q), to(k), to(v), mask=mask,
                              is_causal=is_causal, rules=rules, mesh=mesh,
                              layout=layout, block_q=BLOCK, block_k=BLOCK)
    return context.from_layout(out, n, layout)
  return path


def _a2a_path(mesh):
  def path(q, k, v, rules, is_causal, mask):
    return all_to_all.all_to_all_attention(
        q, k, v, mask=mask, is_causal=is_causal, rules=rules, mesh=mesh,
        block_q=BLOCK, block_k=BLOCK)
  return path


def _mesh(**axes):
  assert jax.device_count() == 8, jax.devices()
  return sharding.make_mesh(**axes)


def _key_mask():
  lengths = jnp.array([90, 61])  # padding at the end of each row
  return (jnp.arange(T)[None] < lengths[:, None])[:, None, None, :]


@pytest.mark.parametrize("axes,layout,kv_heads,kind,is_causal,masked", [
    # Sequence axis 8: every rule, causal, GQA; zigzag with a key mask.
    (dict(sequence=8), "contiguous", 2, "all_rules", True, False),
    (dict(sequence=8), "zigzag", 2, "window_segments", True, True),
    # Sequence axis 8, non-causal: every key slice of every device counts
    # (causal hides the later slices, and whatever the ring does with
    # them), and with no window the kernel's full block range.
    (dict(sequence=8), "zigzag", 2, "all_rules", False, True),
    (dict(sequence=8), "contiguous", 1, "plain", False, False),
    # 2 x 4 with heads: GQA split over "model"; MQA picked per device,
    # non-causal.
    (dict(sequence=2, model=4), "zigzag", 4, "all_rules", True, False),
    (dict(sequence=2, model=4), "contiguous", 1, "window_segments", False,
     True),
    # Batch over "data" beside the sequence axis.
    (dict(data=2, sequence=4), "zigzag", 2, "all_rules", True, False),
])
def test_ring_equals_one_device(axes, layout, kv_heads, kind, is_causal,
                                masked):
  _check(_ring_path(_mesh(**axes), layout), kv_heads, kind, is_causal,
         _key_mask() if masked else None)


@pytest.mark.parametrize("axes,kv_heads,kind,is_causal,masked", [
    # 2 kv heads do not split over 8: repeated up to the query heads.
    (dict(sequence=8), 2, "all_rules", True, True),
    # 8 kv heads split over 8 without repeating them; non-causal.
    (dict(sequence=8), 8, "window_segments", False, True),
    (dict(sequence=2, model=4), 8, "window_segments", False, False),
    (dict(sequence=2, model=4), 1, "all_rules", True, False),
])
def test_all_to_all_equals_one_device(axes, kv_heads, kind, is_causal,
                                      masked):
  _check(_a2a_path(_mesh(**axes)), kv_heads, kind, is_causal,
         _key_mask() if masked else None)


def _path(impl, mesh, layout):
  return _ring_path(mesh, layout) if impl == "ring" else _a2a_path(mesh)


@pytest.mark.parametrize("impl,layout", [("ring", "zigzag"),
                                         ("all_to_all", None)])
def test_causal_bottom_right_with_fewer_queries_than_keys(impl, layout):
  """Tq = 48 queries against Tk = 96 keys, causal: query i sits at
  position i + Tk - Tq (the ring adds that offset to the positions its
  layout gives; all-to-all leaves it to the kernel). Every rule that reads
  positions (causal, window, ALiBi) and query segment ids that differ
  from the keys' see the alignment."""
  _check(_path(impl, _mesh(sequence=8), layout), 2, "all_rules", True,
         _key_mask(), tq=48)


def _left_padded_mask():
  """Row 0: keys 0..20 are padding, so under the causal rule queries
  0..20 have no allowed key; row 1: every key is padding."""
  first = jnp.array([21, T])
  return (jnp.arange(T)[None] >= first[:, None])[:, None, None, :]


@pytest.mark.parametrize("impl,layout,kind", [
    ("ring", "contiguous", "window_segments"),
    ("ring", "zigzag", "all_rules"),
    ("all_to_all", None, "window_segments")])
def test_rows_with_no_allowed_key_give_exactly_zero(impl, layout, kind):
  """The one-device policy: a query that may attend to nothing outputs 0
  (not the mean of the values, not NaN) and gets dq = 0. On the ring such
  a row sees slice after slice with no allowed key, where an unguarded
  running max of -inf gives exp(-inf + inf) = NaN and an unguarded
  normaliser 0 / 0; with sinks ("all_rules") the row's only weight is the
  sink, which has no value."""
  out, grads = _check(_path(impl, _mesh(sequence=8), layout), 2, kind, True,
                      _left_padded_mask())
  empty = np.zeros((B, T), bool)
  empty[0, :21] = True
  empty[1] = True
  out, dq = np.asarray(out), np.asarray(grads[0])
  assert np.all(out[empty] == 0.0), np.abs(out[empty]).max()
  assert np.all(dq[empty] == 0.0), np.abs(dq[empty]).max()
  assert np.all(out[~empty].any(-1)), "a row with keys came out 0"
  for g in grads:
    assert np.isfinite(np.asarray(g)).all()


def _collectives(hlo):
  found = {}
  for op in ("all-gather", "all-reduce", "all-to-all", "collective-permute"):
    found[op] = [line for line in hlo.splitlines()
                 if re.search(rf"= \S+ {op}(-start)?\(", line)]
  return found


def test_ring_program_only_permutes_slices_and_never_gathers():
  """Forward and backward of the ring, compiled: no all-gather or
  all-to-all of anything; every collective-permute carries one device's
  slice (12 of the 96 tokens), never the sequence; the only all-reduces
  are the head parameters' gradients."""
  mesh = _mesh(sequence=8)
  q, k, v, d_out, sinks, _ = _inputs(2)

  def loss(q, k, v, sinks, d_out):
    out = ring.ring_attention(q, k, v, is_causal=True, mesh=mesh,
                              rules=score_rules.ScoreRules(sinks=sinks),
                              layout="zigzag", block_q=BLOCK, block_k=BLOCK)
    return jnp.sum(out * d_out)

  spec = sharding.NamedSharding(mesh, sharding.P(None, "sequence"))
  q, k, v, d_out = (jax.device_put(x, spec) for x in (q, k, v, d_out))
  hlo = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).lower(
      q, k, v, sinks, d_out).compile().as_text()
  ops = _collectives(hlo)
  assert ops["all-gather"] == [] and ops["all-to-all"] == [], ops
  assert ops["collective-permute"], "the ring sends nothing?"
  for line in ops["collective-permute"]:
    sizes = [int(x) for x in re.findall(r"\[([\d,]+)\]", line.split("=")[1]
                                        .split("collective-permute")[0])[0]
             .split(",")]
    assert T not in sizes and max(sizes) < T, line
  for line in ops["all-reduce"]:
    assert f"f32[{H}]" in line, line  # d sinks only


@pytest.mark.parametrize("impl", ["ring", "all_to_all"])
def test_model_trains_with_context_parallelism_on_a_sequence_axis(impl):
  """A DecoderLM with implementation 'ring' or 'all_to_all' on a (data 2,
  sequence 2, model 2) mesh: loss and gradients equal the same model with
  'flash' on one device, a captured activation comes back split along the
  sequence, and a head ablated by `head_mask` gives the one-device
  logits. All-to-all here has 2 query heads and 1 kv head per device, so
  it repeats the kv head before the swap."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from configs import default  # pylint: disable=g-import-not-at-top
  from mha_jax.models import transformer  # pylint: disable=g-import-not-at-top
  from mha_jax.training import train_state  # pylint: disable=g-import-not-at-top

  c = default.get_config()
  c.task.update(name="copy", batch_size=4, seq_len=16, vocab_size=16)
  c.model.update(d_model=32, num_layers=1, num_heads=4, num_kv_heads=2,
                 attention_only=False, positions="rotary",
                 implementation=impl)
  c.mesh.update(data=2, sequence=2, model=2)
  mesh = sharding.mesh_from_config(c)
  state = train_state.create_train_state(c)
  batch = train_state.batch_fn(c)(jax.random.PRNGKey(3))

  def loss_and_grad(params, graphdef, batch):
    def loss(p):
      return train_state.compute_loss(nnx.merge(graphdef, p), batch, "xent")[0]
    return jax.value_and_grad(loss)(params)

  flash_model = nnx.merge(state.graphdef, state.params)
  ref_graph, ref_params = nnx.split(
      transformer.with_implementation(flash_model, "flash"))
  l1, g1 = jax.jit(loss_and_grad, static_argnums=1)(ref_params, ref_graph,
                                                     batch)
  params = sharding.shard_tree(state.params, mesh)
  placed = sharding.shard_batch(batch, mesh)
  with jax.set_mesh(mesh):
    l2, g2 = jax.jit(loss_and_grad, static_argnums=1)(params, state.graphdef,
                                                       placed)
  # Same rounding argument as above, compounded by the MLP and readout.
  np.testing.assert_allclose(l2, l1, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g2), jax.tree.leaves(g1), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4,
                               atol=1e-6)
  # Hooks: the captured q is [B, T, H, Dh], split along the sequence.
  model = nnx.merge(state.graphdef, params)
  with jax.set_mesh(mesh):
    _, acts = jax.jit(lambda m, x: m(x, capture=("blocks.0.attn.q",)))(
        model, placed["inputs"])
  q = acts["blocks.0.attn.q"]
  assert q.sharding.spec[1] == "sequence", q.sharding
  _, want = nnx.merge(ref_graph, ref_params)(batch["inputs"],
                                            capture=("blocks.0.attn.q",))
  np.testing.assert_allclose(np.asarray(q), np.asarray(
      want["blocks.0.attn.q"]), rtol=1e-6, atol=1e-6)
  # Ablating head 1 (a patch of the z site) on the mesh: the one-device
  # logits with the same head ablated, which differ from the plain ones.
  ablate = jnp.array([[1.0, 0.0, 1.0, 1.0]])
  with jax.set_mesh(mesh):
    got = jax.jit(lambda m, x, hm: m(x, head_mask=hm))(
        model, placed["inputs"], ablate)
  ref_model = nnx.merge(ref_graph, ref_params)
  want = ref_model(batch["inputs"], head_mask=ablate)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5,
                             atol=1e-5)
  assert np.abs(np.asarray(want - ref_model(batch["inputs"]))).max() > 1e-3
  # The training loop's step on that mesh (run under jax.set_mesh): its
  # loss is the one-device loss of the same batch before the update.
  step, _, make = train_state.step_fns(c, mesh)
  assert make(jax.random.PRNGKey(0))["inputs"].sharding.spec[:2] == (
      "data", "sequence")
  new_state, metrics = step(sharding.shard_tree(state, mesh), placed)
  assert int(new_state.step) == 1
  np.testing.assert_allclose(metrics["loss"], l1, rtol=1e-6)
