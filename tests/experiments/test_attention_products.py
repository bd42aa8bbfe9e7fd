"""experiments/benchmark/attention_products.py: reading a program's dots."""

import numpy as np
import pytest

from experiments.benchmark import attention_products as ap

# A compiled program's text as XLA's CPU backend prints it (abridged by
# hand): a score product inside a YNNPACK fusion, and a key-gradient
# product left as a plain dot whose lhs contracts its query axis.
_HLO = """HloModule jit_step, is_scheduled=true

%fused_computation (param_0: f32[2,3,5,4], param_1: f32[2,3,6,4]) -> f32[2,3,5,6] {
  %param_0 = f32[2,3,5,4]{3,2,1,0} parameter(0)
  %param_1 = f32[2,3,6,4]{3,2,1,0} parameter(1)
  ROOT %dot_general.0 = f32[2,3,5,6]{3,2,1,0} dot(%param_0, %param_1), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,1}, rhs_contracting_dims={3}, metadata={op_name="jit(step)/jvp(bhqd,bhkd->bhqk)/dot_general"}
}

ENTRY %main.1 (q.1: f32[2,3,5,4], k.1: f32[2,3,6,4], ds.1: f32[2,3,5,6]) -> (f32[2,3,5,6], f32[2,3,6,4]) {
  %q.1 = f32[2,3,5,4]{3,2,1,0} parameter(0), metadata={op_name="q"}
  %k.1 = f32[2,3,6,4]{3,2,1,0} parameter(1), metadata={op_name="k"}
  %ds.1 = f32[2,3,5,6]{3,2,1,0} parameter(2), metadata={op_name="ds"}
  %ynn_fusion = f32[2,3,5,6]{3,2,1,0} fusion(%q.1, %k.1), kind=kCustom, calls=%fused_computation, backend_config={"fusion_config":{"kind":"__ynn_fusion"},"outer_dimension_partitions":[]}
  %dot.2 = f32[2,3,6,4]{3,2,1,0} dot(%ds.1, %q.1), lhs_batch_dims={0,1}, lhs_contracting_dims={2}, rhs_batch_dims={0,1}, rhs_contracting_dims={2}, metadata={op_name="jit(step)/transpose(jvp(bhqd,bhkd->bhqk))/dot_general"}
  ROOT %tuple = (f32[2,3,5,6]{3,2,1,0}, f32[2,3,6,4]{3,2,1,0}) tuple(%ynn_fusion, %dot.2)
}
"""


def test_step_dots_reads_shapes_dims_and_kernels():
  score, dk = ap.step_dots(_HLO)
  assert score["kernel"] == "YNNPACK"
  assert (score["lhs"], score["rhs"], score["out"]) == (
      (2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 5, 6))
  assert score["lhs_contracting"] == (3,) and score["rhs_contracting"] == (3,)
  assert score["op_name"].endswith("jvp(bhqd,bhkd->bhqk)/dot_general")
  assert dk["kernel"] == "Eigen"
  assert (dk["lhs"], dk["rhs"], dk["out"]) == (
      (2, 3, 5, 6), (2, 3, 5, 4), (2, 3, 6, 4))
  assert dk["lhs_batch"] == (0, 1) and dk["lhs_contracting"] == (2,)


def test_form_names_which_operand_a_gemm_reads_transposed():
  score, dk = ap.step_dots(_HLO)
  # Q K^T: the lhs contracts its last dim (N), the rhs its last, not its
  # first after the batch dims (T).
  assert ap.form_of(score) == "NT"
  # dS^T Q: the lhs contracts its query axis (T), the rhs its first (N).
  assert ap.form_of(dk) == "TN"


@pytest.mark.parametrize("which", [0, 1])
def test_gemm_operands_give_the_dots_product(which):
  dot = ap.step_dots(_HLO)[which]
  rng = np.random.default_rng(0)
  lhs = rng.standard_normal(dot["lhs"])
  rhs = rng.standard_normal(dot["rhs"])
  a, b = ap.gemm_operands(dot, lhs, rhs)
  spec = {0: "bhqd,bhkd->bhqk", 1: "bhqk,bhqd->bhkd"}[which]
  np.testing.assert_allclose(a @ b, np.einsum(spec, lhs, rhs), rtol=1e-12)


# A projection's weight gradient dW = x^T dy as XLA's CPU backend left
# it in the train step: a plain (Eigen) dot whose operands are both read
# transposed, x `[BT, D]` contracting its first dim and dy laid out as
# `[E, BT]` contracting its last.
_HLO_2D = """HloModule jit_step, is_scheduled=true

ENTRY %main.2 (x.1: f32[6,4], gt.1: f32[3,6]) -> f32[4,3] {
  %x.1 = f32[6,4]{1,0} parameter(0), metadata={op_name="x"}
  %gt.1 = f32[3,6]{1,0} parameter(1), metadata={op_name="gt"}
  ROOT %dot.3 = f32[4,3]{1,0} dot(%x.1, %gt.1), lhs_contracting_dims={0}, rhs_contracting_dims={1}, metadata={op_name="jit(step)/transpose(jvp())/dot_general"}
}
"""


def test_a_2d_weight_gradient_reads_both_operands_transposed():
  (dw,) = ap.step_dots(_HLO_2D)
  assert dw["kernel"] == "Eigen" and dw["lhs_batch"] == ()
  assert (dw["lhs"], dw["rhs"], dw["out"]) == ((6, 4), (3, 6), (4, 3))
  assert ap.form_of(dw) == "TT"
  rng = np.random.default_rng(1)
  x, gt = rng.standard_normal((6, 4)), rng.standard_normal((3, 6))
  a, b = ap.gemm_operands(dw, x, gt)
  np.testing.assert_allclose(a @ b, x.T @ gt.T, rtol=1e-12)
