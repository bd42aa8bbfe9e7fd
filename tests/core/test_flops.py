"""The source's cost claim: 8 B n D^2 + 4 B n^2 D matmul FLOPs, whatever h is."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mha_jax
from mha_jax.core import flops

B, N, D = 2, 8, 32
HEADS = (1, 2, 4, 8, 16)
IMPLS = ("vmap", "einsum")


def test_dot_general_flops_known_answers():
  # [M, K] @ [K, N]: 2 M N K.
  assert flops.dot_general_flops((3, 5), (5, 7), (((1,), (0,)), ((), ()))) \
      == 2 * 3 * 5 * 7
  # Batched [G, M, K] x [G, N, K] contracting K: 2 G M N K.
  assert flops.dot_general_flops((4, 3, 5), (4, 7, 5),
                                 (((2,), (2,)), ((0,), (0,)))) \
      == 2 * 4 * 3 * 7 * 5


def test_walker_reaches_sub_jaxprs():
  a, b = jnp.ones((3, 5)), jnp.ones((5, 7))
  mm = 2 * 3 * 5 * 7

  @jax.custom_vjp
  def cv(a, b):
    return a @ b

  cv.defvjp(lambda a, b: (a @ b, (a, b)), lambda res, g: (g @ res[1].T,
                                                           res[0].T @ g))

  def scanned(a, b):
    def body(c, _):
      return c, a @ b
    return jax.lax.scan(body, 0.0, None, length=4)[1]

  def branch(a, b):  # only one branch runs: the dearer one is counted
    return jax.lax.cond(True, lambda: (a @ b) @ b.T @ b, lambda: a @ b)

  assert flops.jaxpr_matmul_flops(jax.jit(lambda a, b: a @ b), a, b) == mm
  assert flops.jaxpr_matmul_flops(cv, a, b) == mm
  assert flops.jaxpr_matmul_flops(scanned, a, b) == 4 * mm
  assert flops.jaxpr_matmul_flops(branch, a, b) == mm + 2 * 3 * 7 * 5 + mm
  assert flops.jaxpr_matmul_flops(lambda a: jnp.tanh(a) * 2, a) == 0


def _layer(h):
  # numpy values: eager jax.random would compile anew for every head count.
  rng = np.random.default_rng(h)
  shapes = {"w_q": (D, h, D // h), "w_k": (D, h, D // h),
            "w_v": (D, h, D // h), "w_o": (h, D // h, D)}
  params = {n: jnp.asarray(rng.normal(size=s), jnp.float32)
            for n, s in shapes.items()}
  return params, jnp.asarray(rng.normal(size=(B, N, D)), jnp.float32)


def _forward(impl):
  return lambda p, x: mha_jax.multi_head_attention(p, x, implementation=impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("h", HEADS)
def test_jaxpr_matmul_flops_equal_the_formula_for_every_head_count(h, impl):
  counted = flops.jaxpr_matmul_flops(_forward(impl), *_layer(h))
  assert counted == flops.analytic_mha_flops(B, N, D)
  # Known answer (B=2, n=8, D=32), worked by hand: 131,072 for the four
  # projections plus 16,384 for QK^T and AV.
  assert counted == 147_456


@pytest.mark.cpu_only("XLA's cost analysis of the CPU backend's compiled "
                      "program (4 + 3/n FLOPs per weight measured on "
                      "CPU); the GPU compiler and cost model count "
                      "otherwise")
@pytest.mark.parametrize("impl", IMPLS)
def test_xla_count_exceeds_the_formula_only_by_softmax_work(impl):
  # XLA also counts elementwise work: the softmax's max, subtract, sum and
  # divide on the B*h*n^2 attention weights, plus O(B*h*n) row reductions,
  # and the 1/sqrt(Dh) scale, which in float32 multiplies q (B*n*D
  # elements, for any h) rather than the scores. We measured 4 + 3/n FLOPs
  # per weight plus 1 per element of q on CPU (jax 0.10.2; 6 + 3/n per
  # weight when the scale multiplied the scores); the bound allows 8 per
  # weight, i.e. O(h n^2), and the excess must grow with h while the
  # matmul part stays fixed.
  analytic = flops.analytic_mha_flops(B, N, D)
  q_scale = B * N * D
  excess = {}
  for h in HEADS:
    excess[h] = flops.xla_flops(_forward(impl), *_layer(h)) - analytic
    assert 0 < excess[h] - q_scale <= 8 * B * h * N ** 2, (h, excess[h])
  assert excess[16] > excess[1]


def _matmul_flops_by_stage(b, n, d, h):
  """2 M N K summed over the matmuls of one layer with h heads of width
  d / h, written stage by stage as FORMULAS.md derives them."""
  dh = dv = d // h
  projections = 3 * 2 * (b * n) * d * (h * dh)  # Q, K, V: [Bn, D] @ [D, hDh]
  scores = h * 2 * b * n * n * dh  # per head [n, Dh] @ [Dh, n]
  mix = h * 2 * b * n * n * dv  # per head [n, n] @ [n, Dv]
  out = 2 * (b * n) * (h * dv) * d  # concat [Bn, hDv] @ W^O [hDv, D]
  return projections + scores + mix + out


@pytest.mark.parametrize("b,n,d", [(2, 8, 32), (1, 4, 16), (3, 5, 48)])
def test_analytic_formula_equals_the_stage_count_for_every_head_count(b, n,
                                                                      d):
  counts = {h: _matmul_flops_by_stage(b, n, d, h)
            for h in (1, 2, 4, 8, 16) if d % h == 0}
  assert len(set(counts.values())) == 1, counts  # h cancels out
  assert flops.analytic_mha_flops(b, n, d) == counts[1]


def test_analytic_formula_known_answers():
  assert flops.analytic_mha_flops(1, 1, 1) == 12  # 8 + 4
  assert flops.analytic_mha_flops(2, 8, 32) == 147_456
  assert flops.analytic_mha_flops(1, 4, 16) == 9_216  # 8192 + 1024


def test_compiled_count_is_the_work_xla_kept():
  """Hand-counted: a product nobody reads is gone from the compiled
  program (the jaxpr still asks for it), a scan's body counts its length
  times, a batched product its batch, a runtime cond its dearer branch."""
  a, b, c = jnp.ones((6, 4)), jnp.ones((4, 5)), jnp.ones((3, 5, 5))

  def f(a, b, c, flag):
    unused = (a @ b) @ b.T  # dropped by XLA, counted by the jaxpr
    x = jax.lax.scan(lambda x, _: (jnp.tanh(x @ c[0]), None), a @ b, None,
                     length=7)[0]
    y = jnp.einsum("gij,gjk->gik", c, c)
    z = jax.lax.cond(flag, lambda: (x @ c[1]) @ c[2], lambda: x)
    return x.sum() + y.sum() + z.sum()

  args = (a, b, c, jnp.bool_(True))
  kept = (2 * 6 * 4 * 5 + 7 * 2 * 6 * 5 * 5 + 2 * 3 * 5 * 5 * 5
          + 2 * (2 * 6 * 5 * 5))
  compiled = jax.jit(f).lower(*args).compile()
  assert flops.compiled_matmul_flops(compiled) == kept
  assert flops.compiled_matmul_flops(compiled.as_text()) == kept
  assert flops.jaxpr_matmul_flops(f, *args) == kept + 2 * (2 * 6 * 4 * 5)


def test_compiled_count_refuses_what_it_cannot_count():
  def until(x):  # a loop whose length depends on the data
    return jax.lax.while_loop(lambda v: v.sum() < 100.0,
                              lambda v: v @ jnp.full((3, 3), 1.5), x)

  compiled = jax.jit(until).lower(jnp.ones((3, 3))).compile()
  with pytest.raises(ValueError, match="while loop .* no known trip count"):
    flops.compiled_matmul_flops(compiled)
  with pytest.raises(ValueError, match="expected an HLO module with an "
                                       "ENTRY"):
    flops.compiled_matmul_flops("not a module")
  gemm = ("ENTRY %main (p: f32[2,2]) -> f32[2,2] {\n"
          "  %p = f32[2,2]{1,0} parameter(0)\n"
          "  ROOT %g = f32[2,2]{1,0} custom-call(%p, %p), "
          "custom_call_target=\"__cublas$gemm\"\n}\n")
  with pytest.raises(ValueError, match="%g hands a product to a custom call"):
    flops.compiled_matmul_flops(gemm)
