"""`auto`'s choice per backend: known answers from JAX's documented limits.

Each row states a call, the implementation `auto` must pick, and a phrase
the reason for passing over the faster kernel must contain. The expected
answers come from the limits in JAX's source (jax 0.10), not from the
function under test:
  * cuDNN: float16/bfloat16 only and one dtype for q, k, v; head width <= 128
    (<= 256 from compute capability 9.0) and a multiple of 8; a mask/bias
    becomes a bias spanning [Tq, Tk]; with one, even Tq and Tk
    (jax/_src/cudnn/fused_attention_stablehlo.py: check_layout,
    check_is_flash_attention); `is_causal` is tril of [Tq, Tk], top-left
    (jax/_src/nn/functions.py: _get_causal_mask).
  * Pallas TPU splash attention through mha_jax's adapter: Dv == Dh, Tq
    and Tk multiples of its block of 128, Dh <= 128 or a multiple of 128,
    no dense mask or bias (jax/experimental/pallas/ops/tpu/
    splash_attention; the adapter's own tests are tests/core/test_pallas.py).
Pure Python: nothing is compiled.
"""

import jax
import jax.numpy as jnp
import pytest

import mha_jax
from mha_jax.core import attention
from mha_jax.core.kernels import auto

BF16, F16, F32 = "bfloat16", "float16", "float32"
# The standard benchmark shape, per head: B=8, n=512, h=8, Dh=32.
STD = dict(batch=8, num_heads=8, head_dim=32, q_len=512, kv_len=512)


def _call(**kw):
  return {**STD, **kw}


# The keywords of `_call` that describe the device, not the call.
_DEVICE = ("gpu_capability", "cudnn", "available")


def _select(backend, call, **device):
  """`auto.select` on a `_call` dict: its call facts become an `auto.Call`,
  its device facts keywords."""
  device.update({k: v for k, v in call.items() if k in _DEVICE})
  return auto.select(backend, auto.Call(
      **{k: v for k, v in call.items() if k not in _DEVICE}), **device)


# (id, backend, call, expected implementation, {candidate: phrase in why}).
CASES = [
    # CPU: the measured rule, einsum while the float32 scores fit in 32
    # MiB. The standard shape's are 8*8*512*512*4 bytes = 64 MiB.
    ("cpu-f32", "cpu", _call(q_dtype=F32), "flash",
     {"einsum": "(64 MiB > 32 MiB)"}),
    ("cpu-f32-32mib", "cpu", _call(q_dtype=F32, batch=4), "einsum", {}),
    ("cpu-f32-just-over", "cpu",
     _call(q_dtype=F32, batch=4, q_len=513), "flash", {"einsum": "> 32 MiB"}),
    ("cpu-bf16-mask", "cpu",
     _call(q_dtype=BF16, mask=True, is_causal=True, batch=1), "flash",
     {"einsum": "float32 only"}),
    ("cpu-dropout", "cpu", _call(q_dtype=F32, dropout=True), "einsum",
     {"flash": "never forms the weights"}),
    ("cpu-weights", "cpu", _call(q_dtype=F32, weights=True), "einsum",
     {"flash": "never forms the weights"}),
    # GPU: cuDNN where it takes the call.
    ("gpu-bf16", "gpu", _call(q_dtype=BF16), "cudnn", {}),
    ("gpu-f16-causal", "gpu", _call(q_dtype=F16, is_causal=True), "cudnn", {}),
    ("gpu-bf16-gqa", "gpu", _call(q_dtype=BF16, num_kv_heads=2), "cudnn", {}),
    ("gpu-bf16-full-mask", "gpu",
     _call(q_dtype=BF16, mask=(8, 8, 512, 512)), "cudnn", {}),
    # A padding mask [B, 1, 1, Tk] joined with our causal mask spans [Tq, Tk].
    ("gpu-bf16-pad-causal", "gpu",
     _call(q_dtype=BF16, mask=(8, 1, 1, 512), is_causal=True), "cudnn", {}),
    # Where cuDNN refuses, the Pallas GPU kernel where Triton takes the
    # shapes (one dtype, power-of-two widths of 16-256, no dense mask or
    # bias), then xla.
    ("gpu-f32", "gpu", _call(q_dtype=F32), "pallas_gpu",
     {"cudnn": "float16/bfloat16 only"}),
    ("gpu-mixed", "gpu", _call(q_dtype=BF16, v_dtype=F32), "flash",
     {"cudnn": "one dtype", "pallas_gpu": "share one dtype",
      "xla": "one dtype"}),
    ("gpu-dh-160-unknown", "gpu", _call(q_dtype=BF16, head_dim=160), "xla",
     {"cudnn": "<= 128", "pallas_gpu": "Dh=160 must be a power of two"}),
    ("gpu-dh-160-ampere", "gpu",
     _call(q_dtype=BF16, head_dim=160, gpu_capability=(8, 0)), "xla",
     {"cudnn": "<= 128", "pallas_gpu": "power of two in [16, 256]"}),
    ("gpu-dh-160-hopper", "gpu",
     _call(q_dtype=BF16, head_dim=160, gpu_capability=(9, 0)), "cudnn", {}),
    ("gpu-dh-512-hopper", "gpu",
     _call(q_dtype=BF16, head_dim=512, gpu_capability=(9, 0)), "xla",
     {"cudnn": "<= 256", "pallas_gpu": "Dh=512"}),
    ("gpu-dh-36", "gpu", _call(q_dtype=BF16, head_dim=36), "xla",
     {"cudnn": "multiple of 8", "pallas_gpu": "Dh=36"}),
    ("gpu-dv-differs", "gpu", _call(q_dtype=BF16, value_dim=64),
     "pallas_gpu", {"cudnn": "Dv == Dh"}),
    ("gpu-causal-tq-ne-tk", "gpu",
     _call(q_dtype=BF16, q_len=128, is_causal=True), "pallas_gpu",
     {"cudnn": "top-left"}),
    ("gpu-pad-mask", "gpu", _call(q_dtype=BF16, mask=(8, 1, 1, 512)), "xla",
     {"cudnn": "span [Tq, Tk]", "pallas_gpu": "no dense `mask`"}),
    ("gpu-bias-odd", "gpu",
     _call(q_dtype=BF16, q_len=511, kv_len=511, bias=(1, 8, 511, 511)), "xla",
     {"cudnn": "even Tq and Tk", "pallas_gpu": "no dense `bias`"}),
    ("gpu-no-cudnn", "gpu", _call(q_dtype=BF16, cudnn=False), "xla",
     {"cudnn": "no cuDNN", "pallas_gpu": "not a CUDA device"}),
    # User rules: cuDNN refuses them by name, the Pallas GPU kernel takes
    # them unless one uses a primitive Triton lacks, or a dense mask
    # comes too; then the blockwise path (xla takes no user rule).
    ("gpu-score-mod", "gpu",
     _call(q_dtype=BF16, rules=("score_mod", "block_mask")), "pallas_gpu",
     {"cudnn": "does not take score_mod"}),
    ("gpu-mask-mod-f32-window", "gpu",
     _call(q_dtype=F32, rules=("local_window", "mask_mod")), "pallas_gpu",
     {"cudnn": "mask_mod"}),
    ("gpu-rule-gathers", "gpu",
     _call(q_dtype=BF16, rules=("score_mod",),
           rule_problem="`score_mod` uses `gather`"), "flash",
     {"cudnn": "score_mod", "pallas_gpu": "uses `gather`",
      "xla": "does not take score_mod"}),
    ("gpu-rule-and-mask", "gpu",
     _call(q_dtype=BF16, rules=("mask_mod",), mask=True), "flash",
     {"cudnn": "mask_mod", "pallas_gpu": "no dense `mask`",
      "xla": "does not take mask_mod"}),
    ("gpu-alibi-dh-128", "gpu",
     _call(q_dtype=BF16, head_dim=128, rules=("alibi_slopes",)),
     "pallas_gpu", {"cudnn": "alibi_slopes"}),
    # 4 * 1 * 8 * 32768^2 bytes = 32 GiB of float32 scores: blockwise.
    ("gpu-long-f32", "gpu",
     _call(q_dtype=F32, batch=1, q_len=32768, kv_len=32768, is_causal=True),
     "pallas_gpu", {"cudnn": "float16/bfloat16"}),
    ("gpu-long-bf16", "gpu",
     _call(q_dtype=BF16, batch=1, q_len=32768, kv_len=32768, is_causal=True),
     "cudnn", {}),
    ("gpu-dropout", "gpu", _call(q_dtype=BF16, dropout=True), "einsum",
     {"cudnn": "no dropout", "pallas_gpu": "no dropout", "xla": "no dropout",
      "flash": "no dropout"}),
    # TPU: the splash kernel where its adapter takes the call (GQA and
    # bottom-right causality included), XLA or flash where it does not.
    ("tpu-bf16", "tpu", _call(q_dtype=BF16), "pallas_tpu", {}),
    ("tpu-gqa", "tpu", _call(q_dtype=BF16, num_kv_heads=2), "pallas_tpu",
     {}),
    ("tpu-len-100", "tpu", _call(q_dtype=F32, q_len=100, kv_len=100), "xla",
     {"pallas_tpu": "multiples of its block of 128"}),
    ("tpu-dh-192", "tpu", _call(q_dtype=F32, head_dim=192), "xla",
     {"pallas_tpu": "multiple of 128"}),
    ("tpu-mask", "tpu", _call(q_dtype=F32, mask=True), "xla",
     {"pallas_tpu": "no dense boolean mask"}),
    ("tpu-bias", "tpu", _call(q_dtype=F32, bias=(1, 1, 512, 512)), "xla",
     {"pallas_tpu": "no additive bias"}),
    ("tpu-causal-tq-ne-tk", "tpu",
     _call(q_dtype=F32, q_len=256, is_causal=True), "pallas_tpu", {}),
    ("tpu-long", "tpu", _call(q_dtype=F32, batch=1, q_len=32768,
                              kv_len=32768), "pallas_tpu", {}),
    ("tpu-long-dv", "tpu", _call(q_dtype=F32, batch=1, q_len=32768,
                                 kv_len=32768, value_dim=64), "flash",
     {"pallas_tpu": "Dv == Dh", "xla": "GiB > 1 GiB"}),
]


@pytest.mark.parametrize("backend,call,expected,why",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_choice_and_reasons(backend, call, expected, why):
  choice = _select(backend, call)
  assert choice.implementation == expected, str(choice)
  ruled_out = dict(choice.ruled_out)
  assert set(ruled_out) == set(why), str(choice)
  for name, phrase in why.items():
    assert phrase in ruled_out[name], str(choice)
  assert expected in str(choice)


# Without the adapter among the available implementations, TPU falls back.
@pytest.mark.parametrize("call,expected", [
    (_call(q_dtype=BF16), "xla"),
    (_call(q_dtype=F32, batch=1, q_len=32768, kv_len=32768), "flash"),
])
def test_tpu_without_the_adapter_falls_back(call, expected):
  available = auto.ADAPTED - {"pallas_tpu"}
  choice = _select("tpu", call, available=available)
  assert choice.implementation == expected, str(choice)
  assert "not among the available" in dict(choice.ruled_out)["pallas_tpu"]


def test_without_cudnn_in_available_gpu_falls_back():
  choice = _select("gpu", _call(q_dtype=BF16),
                     available={"xla", "flash"})
  assert choice.implementation == "xla"
  assert "not among the available" in dict(choice.ruled_out)["cudnn"]


def test_cpu_choice_matches_the_measured_rule():
  """CPU: flash for lower precisions or float32 scores over 32 MiB, at
  any width, mask or GQA; einsum under dropout, and for float32 scores
  of at most 32 MiB (B * H * Tq * Tk <= 2**23)."""
  for call in (_call(q_dtype=F32), _call(q_dtype=BF16, head_dim=512),
               _call(q_dtype=F16, mask=True, bias=True, num_kv_heads=1),
               _call(q_dtype=F32, batch=1, q_len=65536, kv_len=65536),
               _call(q_dtype=F32, batch=1, num_heads=1, q_len=2 ** 12,
                     kv_len=2 ** 11 + 1)):
    assert _select("cpu", call).implementation == "flash"
    assert _select("cpu", {**call, "dropout": True}).implementation == "einsum"
  for call in (_call(q_dtype=F32, batch=16, q_len=256, kv_len=256),
               _call(q_dtype=F32, batch=1, num_heads=1, q_len=2 ** 12,
                     kv_len=2 ** 11, mask=True, bias=True, num_kv_heads=1),
               _call(q_dtype=F32, batch=1, q_len=1, kv_len=2 ** 20)):
    choice = _select("cpu", call)
    assert choice.implementation == "einsum", call
    assert choice.ruled_out == ()
    assert _select("cpu", call, available={"flash"}).implementation == "flash"


def test_explain_auto_reads_arrays_and_agrees_with_attend():
  q = jax.ShapeDtypeStruct((2, 128, 4, 16), jnp.bfloat16)
  k = jax.ShapeDtypeStruct((2, 64, 2, 16), jnp.bfloat16)
  pad = jax.ShapeDtypeStruct((2, 1, 1, 64), jnp.bool_)
  assert mha_jax.explain_auto(q, k, backend="cpu").implementation == "flash"
  on_gpu = mha_jax.explain_auto(q, k, mask=pad, backend="gpu")
  assert on_gpu.implementation == "xla"
  assert "span [Tq, Tk]" in dict(on_gpu.ruled_out)["cudnn"]
  causal = mha_jax.explain_auto(q, k, is_causal=True, backend="gpu")
  assert "top-left" in dict(causal.ruled_out)["cudnn"]
  assert mha_jax.explain_auto(q, k, dropout_rate=0.1,
                              backend="gpu").implementation == "einsum"
  # The legacy helper and auto's dispatch agree with the selection.
  assert attention.choose_implementation(q, k, backend="gpu") == "cudnn"
  # 2 * 4 * 128 * 64 float32 scores fit in 32 MiB, but q is bfloat16.
  assert attention.choose_implementation(q, k, backend="cpu") == "flash"


def test_errors_name_the_argument():
  with pytest.raises(TypeError, match="`backend`"):
    _select(None, _call(q_dtype=F32))
  with pytest.raises(TypeError, match="`call` must be an auto.Call, got dict"):
    auto.select("gpu", _call(q_dtype=F32))
  # A Call is checked when it is made, before any backend sees it.
  with pytest.raises(ValueError, match="`num_kv_heads`"):
    auto.Call(**_call(q_dtype=F32, num_kv_heads=3))
  with pytest.raises(ValueError, match="`q_len`"):
    auto.Call(**_call(q_dtype=F32, q_len=0))
  with pytest.raises(TypeError, match="`q_dtype`"):
    auto.Call(**_call(q_dtype="not-a-dtype"))
  with pytest.raises(TypeError, match="`mask`"):
    auto.Call(**_call(q_dtype=F32, mask="yes"))
  q = jax.ShapeDtypeStruct((2, 8, 4), jnp.float32)
  with pytest.raises(ValueError, match="`q`"):
    mha_jax.explain_auto(q, q)
  q = jax.ShapeDtypeStruct((2, 8, 4, 8), jnp.float32)
  with pytest.raises(ValueError, match="`dropout_rate`"):
    mha_jax.explain_auto(q, q, dropout_rate=1.5)


def test_auto_on_gpu_reads_whether_a_user_rule_can_be_lowered():
  # `attend`'s dispatch hands `select_for` the ScoreRules itself: a rule
  # that indexes a float table it closes over is one Triton cannot lower
  # (its gradient is a scatter-add), so the call goes to the blockwise
  # path; a rule of plain arithmetic, or one reading integer ids, goes to
  # the Pallas GPU kernel.
  from mha_jax.core import score_rules  # pylint: disable=g-import-not-at-top
  q = jax.ShapeDtypeStruct((1, 256, 4, 64), jnp.bfloat16)
  table = jnp.arange(8.0)
  gathers = score_rules.ScoreRules(
      score_mod=lambda s, b, h, qi, ki: s + table[(qi - ki) % 8])
  choice = auto.select_for(q, q, q, backend="gpu", rules=gathers)
  assert choice.implementation == "flash"
  assert "indexing a float array" in dict(choice.ruled_out)["pallas_gpu"]
  ids = jnp.arange(256) // 100
  documents = score_rules.ScoreRules(
      mask_mod=lambda b, h, qi, ki: ids[qi] == ids[ki])
  assert auto.select_for(q, q, q, backend="gpu",
                         rules=documents).implementation == "pallas_gpu"
  plain = score_rules.ScoreRules(
      score_mod=lambda s, b, h, qi, ki: s - 0.5 * jnp.abs(qi - ki),
      mask_mod=lambda b, h, qi, ki: ki <= qi)
  assert auto.select_for(q, q, q, backend="gpu",
                         rules=plain).implementation == "pallas_gpu"
  # A block mask on blocks Triton cannot tile (clipped to 40 queries)
  # sends the call to the blockwise path too, naming it.
  from mha_jax.core import block_mask  # pylint: disable=g-import-not-at-top
  short = jax.ShapeDtypeStruct((1, 40, 4, 64), jnp.bfloat16)
  bm = block_mask.create(plain.mask_mod, None, None, 40, 40, 64, 64)
  choice = auto.select_for(short, short, short, backend="gpu",
                           rules=plain.replace(block_mask=bm))
  assert choice.implementation == "flash"
  assert "`block_mask` was built on blocks of 40 x 40" in dict(
      choice.ruled_out)["pallas_gpu"]
  # explain_auto takes the rules as attend does, and says why.
  said = str(mha_jax.explain_auto(q, q, backend="gpu", rules=documents))
  assert said.startswith("auto -> 'pallas_gpu'")
  assert "not 'cudnn': mha_jax's adapter to it does not take mask_mod" in said
  # On CPU nothing changes: the kernel would run interpreted.
  assert auto.select_for(q, q, q, backend="cpu",
                         rules=plain).implementation == "flash"
