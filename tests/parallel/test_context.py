"""Context parallelism on one device: layouts, the ring's block range, refusals.

The values are checked on 8 simulated devices (multidevice/
test_context_parallel.py); these checks need no devices at all: every
error is raised from shapes and the mesh's axis sizes, before tracing,
and the ring's block range is read under `vmap`, which stands in for the
mesh's axis index.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mha_jax
from configs import default
from mha_jax.core import score_rules
from mha_jax.core.kernels import flash
from mha_jax.parallel import all_to_all
from mha_jax.parallel import context
from mha_jax.parallel import ring
from mha_jax.parallel import sharding
from mha_jax.training import config as config_lib


def test_zigzag_known_answer_and_round_trip():
  # T = 8 on 2 devices: chunks of 2; device 0 holds chunks 0 and 3.
  np.testing.assert_array_equal(context.layout_order(8, 2, "zigzag"),
                                [0, 1, 6, 7, 2, 3, 4, 5])
  np.testing.assert_array_equal(context.layout_order(8, 2, "contiguous"),
                                np.arange(8))
  x = jnp.arange(24).reshape(1, 24)
  z = context.to_layout(x, 4, "zigzag")
  np.testing.assert_array_equal(context.from_layout(z, 4, "zigzag"), x)
  # The positions each device computes are the ones the order gave it.
  for r in range(4):
    np.testing.assert_array_equal(
        context.local_positions(r, 6, 4, "zigzag"), z[0, 6 * r:6 * r + 6])


def _mesh(**axes):
  return jax.sharding.AbstractMesh(tuple(axes.values()), tuple(axes))


def _qkv(t=32, h=4, kv=2):
  shape = lambda heads: jax.ShapeDtypeStruct((2, t, heads, 8), jnp.float32)
  return (jnp.zeros(shape(h).shape), jnp.zeros(shape(kv).shape),
          jnp.zeros(shape(kv).shape))


@pytest.mark.parametrize("fn", [ring.ring_attention,
                                all_to_all.all_to_all_attention])
@pytest.mark.parametrize("kwargs,match", [
    (dict(mesh=_mesh(data=8)), "no 'sequence' axis"),
    (dict(mesh=_mesh(sequence=3)), "does not divide the length 32"),
    (dict(mesh=_mesh(sequence=4),
          rules=score_rules.ScoreRules(q_positions=jnp.zeros((2, 32),
                                                             jnp.int32))),
     "`q_positions`"),
    (dict(mesh=_mesh(sequence=4), rules=score_rules.ScoreRules(
        mask_mod=lambda b, h, q, kv: q >= kv)), "does not apply `mask_mod` "
     "\\(user rules\\); use one of \\['auto', 'einsum', 'flash', "
     "'pallas_gpu', 'vmap'\\]"),
    (dict(mesh=_mesh(sequence=4), mask=jnp.ones((32, 32), bool)),
     "`mask` of shape \\(32, 32\\) varies over queries"),
    (dict(mesh=_mesh(sequence=4, model=3)), "H=4 query heads do not split"),
    (dict(mesh=_mesh(data=3, sequence=4)), "batch B=2 does not split"),
    (dict(), "no mesh"),
])
def test_bad_input_is_refused_by_name(fn, kwargs, match):
  q, k, v = _qkv()
  with pytest.raises(ValueError, match=f"{fn.__name__}: .*{match}"):
    fn(q, k, v, **kwargs)


def test_ring_layout_checks():
  q, k, v = _qkv(t=36)
  # 36 splits over 4 devices but not into the 8 chunks of "zigzag".
  with pytest.raises(ValueError, match="into 8 equal chunks"):
    ring.ring_attention(q, k, v, mesh=_mesh(sequence=4), layout="zigzag")
  with pytest.raises(ValueError, match="`layout` must be one of"):
    ring.ring_attention(q, k, v, mesh=_mesh(sequence=4), layout="striped")


def test_all_to_all_needs_heads_divisible_by_the_axis():
  q, k, v = _qkv(h=4)
  with pytest.raises(ValueError, match="4 query heads per device .* do not "
                     "split over the 8 devices"):
    all_to_all.all_to_all_attention(q, k, v, mesh=_mesh(sequence=8))


def test_attend_offers_the_paths_by_name_and_refuses_dropout():
  q, k, v = _qkv()
  with pytest.raises(ValueError, match="dropout"):
    mha_jax.attend(q, k, v, implementation="ring", dropout_rate=0.1,
                   dropout_rng=jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match="never forms the attention weights"):
    mha_jax.attend(q, k, v, implementation="all_to_all",
                   hooks=mha_jax.Hooks(capture=("pattern",)))
  with pytest.raises(ValueError, match="no mesh"):  # none set on one device
    mha_jax.attend(q, k, v, implementation="ring")
  for path in ("ring", "all_to_all"):
    with pytest.raises(ValueError, match=f"implementation='{path}'.*`bias` "
                       "is a \\[Tq, Tk\\] array"):
      mha_jax.attend(q, k, v, bias=jnp.zeros((32, 32)), implementation=path)


def test_make_mesh_sequence_axis():
  devices = [object()] * 8
  with pytest.raises(ValueError, match="sequence.*does not divide the 8"):
    sharding.make_mesh(model=2, sequence=3, devices=devices)
  with pytest.raises(ValueError, match="`sequence` must be a positive int"):
    sharding.make_mesh(sequence=0, devices=devices)


@pytest.mark.parametrize("mesh,model,task,match", [
    (dict(sequence=2), {}, {}, "needs model.implementation 'ring' or "
     "'all_to_all'"),
    (dict(sequence=3), dict(implementation="ring"), dict(seq_len=16),
     "must divide task.seq_len=16"),
    (dict(sequence=0), {}, {}, "must be a positive int"),
])
def test_validate_config_checks_the_sequence_axis(mesh, model, task, match):
  c = default.get_config()
  c.mesh.update(**mesh)
  c.model.update(**model)
  c.task.update(**task)
  with pytest.raises(ValueError, match=f"config.mesh.sequence: .*{match}"):
    config_lib.validate_config(c)


def test_mesh_from_config_counts_the_sequence_axis():
  c = default.get_config()
  c.mesh.update(model=2, sequence=3)
  with pytest.raises(ValueError, match="config.mesh.sequence: .*2 x 3 does "
                     "not divide the 8"):
    sharding.mesh_from_config(c, devices=[object()] * 8)


def _ring_block_counts(n, t, block, layout):
  """`[N]`: the key blocks each device's ring visits under the causal rule
  (summed over its query blocks, the N slices that reach it and their
  runs), read from the kernel's block range (`flash.kv_block_range`) at
  the positions and key starts the ring itself builds (`ring._prepare`,
  `ring._for_run`; `vmap` stands in for the mesh's axis index)."""
  mesh = _mesh(sequence=n)
  q = jnp.zeros((1, t, 1, 1))
  plan = context.plan(mesh, q, q, fn="test", layout=layout)
  c, runs = t // n, 2 if layout == "zigzag" else 1
  cfg = flash.block_config(jnp.float32, 1, score_rules.NO_RULES, True, c,
                           c // runs, block, block, halve_backward=False)
  rg = ring._Ring(plan=plan, cfg=cfg, offset=0, kv_local=c)
  local = jnp.zeros((1, c, 1, 1))

  def count(_):
    qt, bundle, ex = ring._prepare(rg, local, local, local, None, None, None,
                                   None, None)
    nq, nk = qt.shape[3] // cfg.bq, bundle[0].shape[3] // cfg.bk
    total = 0
    for step in range(n):
      for run in range(runs):
        ex_r, _ = ring._for_run(rg, ex, bundle, ring._source(rg, step), run)
        for i in range(nq):
          first, end = flash.kv_block_range(i, nk, ex_r, cfg)
          total += jnp.maximum(end - first, 0)
    return total

  return np.asarray(jax.vmap(count, axis_name=context.SEQUENCE)(
      jnp.arange(n)))


def _needed_block_counts(n, t, block, layout):
  """The same count from first principles: device r's positions written
  out from the layout's definition, and a (query block, key block) pair
  counted when some query may see some real key of it (k <= q)."""
  c = t // n
  if layout == "contiguous":
    held = lambda r: [np.arange(r * c, (r + 1) * c)]
  else:
    half = c // 2
    chunk = lambda i: np.arange(i * half, (i + 1) * half)
    held = lambda r: [chunk(r), chunk(2 * n - 1 - r)]
  counts = []
  for r in range(n):
    q = np.concatenate(held(r))
    total = 0
    for src in range(n):
      for keys in held(src):  # one run of consecutive positions
        for qs in range(0, len(q), block):
          for ks in range(0, len(keys), block):
            total += bool(np.any(keys[ks:ks + block][None]
                                 <= q[qs:qs + block][:, None]))
    counts.append(total)
  return np.array(counts)


def test_ring_block_range_known_answer():
  """T = 32 on 4 devices, blocks of 4. Contiguous: device r's two query
  blocks see both blocks of each of the r earlier slices and 3 of its own
  (the diagonal hides one), so 4 r + 3. Zigzag: every run is one block;
  device r's chunks r and 7 - r see r + 1 and 8 - r chunks: 9 each. The
  same 36 blocks in all, spread evenly."""
  np.testing.assert_array_equal(_ring_block_counts(4, 32, 4, "contiguous"),
                                [3, 7, 11, 15])
  np.testing.assert_array_equal(_ring_block_counts(4, 32, 4, "zigzag"),
                                [9, 9, 9, 9])


@pytest.mark.parametrize("block", [5, 3])
@pytest.mark.parametrize("layout", context.LAYOUTS)
def test_ring_block_range_visits_exactly_the_blocks_it_needs(layout, block):
  """T = 96 on 8 devices, runs of C / 2 = 6 (zigzag): the ring visits
  exactly the blocks holding an allowed pair, so none is missed and none
  fully masked is visited, whose cost the value checks cannot see. With
  blocks of 3, which divide the runs, zigzag gives every device the same
  count. Blocks of 5 leave partial blocks in every slice and run, and a
  query block straddling the two runs visits the late run's range: zigzag
  then keeps the busiest device within 1.5x of the idlest (64 down to 50
  blocks). Contiguous: more than 5x either way."""
  got = _ring_block_counts(8, 96, block, layout)
  np.testing.assert_array_equal(got, _needed_block_counts(8, 96, block,
                                                          layout))
  spread = got.max() / got.min()
  if layout == "contiguous":
    assert spread > 5, got
  else:
    assert spread < (1.5 if block == 5 else 1.0 + 1e-9), got
