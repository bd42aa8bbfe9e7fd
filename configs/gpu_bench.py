r"""mha_jax on one accelerator: training steps, real LMs, long context, precision.

  python -m experiments.gpu_bench --workdir=runs/gpu_bench

Five parts, each timed as ratios within the one run (experiments/gpu_bench):
`train_step` times a training step of the train-step benchmark's shapes
against the same model in PyTorch on the same device (eager and
torch.compile) in float32 at the library's exact policy, in TF32 (both
libraries opted in) and in bf16 mixed precision; `lms` times SmolLM2-135M
and Gemma 3 270M built from their configs with random weights against
transformers holding the same weights (forward, loss + gradient, greedy
decoding with the KV cache; bf16 and float32) and measures their float32
logits against transformers' own float32 error; `long_context` finds the
longest causal bf16 sequence whose attend trains, for `auto` and each
named path; `policy` times the standard attend shape in the three
precisions with its error against float64; `flex` times the Pallas GPU
kernel on five attention rules against cuDNN, FlexAttention and the
blockwise path.

`budget_s` bounds the run: the parts share it (`shares`), time left by one
goes to the next, and a case that would start after its part's share is
spent is skipped and the report says so. Written for `make gpu-check`
(scripts/gpu_check.sh), which passes the time it has left; a run of its
own can take more (--config.budget_s=900). On a CPU every part runs, far
slower, and torch.compile is tried (the smoke run skips it, saying why).
`--config=configs/gpu_bench.py:smoke`: tiny shapes and models, every code
path but torch.compile (42 s on 2 CPU cores at load 2.5; 100 s at load 7).
"""

import ml_collections

from configs import benchmark
from configs import default


def get_config(arg=None):
  """The benchmark's settings; no training run, so no model/task/train."""
  smoke = default.is_smoke(arg, "configs/gpu_bench.py")
  c = ml_collections.ConfigDict()
  c.smoke = smoke  # a smoke report draws no conclusion
  # Seconds for all parts together (soft: a case already started runs to
  # its end). The parts run in the order of `parts`, each with its share
  # of the time left (`shares`, renormalised over the parts still to run).
  c.budget_s = 240.0
  # Comma-separated, in run order: long_context first, while no other
  # part holds device memory.
  c.parts = "long_context,flex,policy,train_step,lms"
  c.shares = ml_collections.ConfigDict(dict(
      long_context=0.15, flex=0.3, policy=0.06, train_step=0.25, lms=0.24))
  c.seed = 0  # random ids, weights and inputs

  # a. One optimizer step (experiments/benchmark/train_step.py) of the
  # train-step benchmark's shapes (configs/benchmark.py), mha_jax against
  # its PyTorch twin (experiments/benchmark/torch_models.py) on the device.
  ts_bench = benchmark.get_config().train_step
  c.train_step = ts = ml_collections.ConfigDict()
  ts.shapes = "text,random"  # keys of `specs`, or "random"
  ts.specs = ts_bench.specs
  ts.random = ts_bench.random
  ts.paths = "auto"  # mha_jax attend paths (comma-separated)
  # float32 at the policy ("exact"), TF32 ("tf32": jax.default_matmul_
  # precision("tensorfloat32") and torch's allow_tf32), bf16 mixed
  # precision ("bf16": compute in bf16, float32 parameters; torch.autocast).
  ts.precisions = "exact,tf32,bf16"
  ts.torch_compile = True  # also time torch.compile(model)
  ts.warmup = 2  # untimed steps per contestant after its first (compiling)
  ts.rounds = 5  # interleaved timed rounds (medians, per-round ratios)
  ts.min_block_s = 0.02  # each timed block of steps lasts about this long

  # b. Real decoder LMs from their configs (experiments/gpu_bench/lms.py
  # holds the config dicts), random weights, against transformers.
  c.lms = lm = ml_collections.ConfigDict()
  lm.models = "smollm2_135m,gemma3_270m"
  lm.tiny = False  # the same families at toy sizes (the smoke run)
  lm.dtypes = "float32,bfloat16"
  lm.implementation = "auto"  # mha_jax's attend path
  lm.tokens = 512  # forward and loss + gradient: one sequence of this many
  lm.prompt = 16  # decoding: prompt tokens
  lm.new_tokens = 128  # decoding: greedy tokens with the KV cache
  lm.rounds = 3  # timed calls per task and contestant, after one untimed
  lm.decode_rounds = 2  # the same for decoding (transformers: seconds)

  # c. The longest causal bf16 sequence whose attend forward + backward
  # runs at B=1, H=8, Dh=64: n doubles from n_start until it fails (out of
  # memory), reaches n_max, or one step takes over max_step_s (the next
  # would take about four times as long). Each length: compiled, then one
  # timed call.
  c.long_context = lc = ml_collections.ConfigDict()
  # In this order (a spent budget skips the last): auto, the fused
  # kernels, then the dense paths, whose end (out of memory) is foreseen.
  lc.paths = "auto,cudnn,flash,xla,einsum,vmap,pallas_tpu"
  lc.B, lc.H, lc.Dh = 1, 8, 64
  lc.dtype = "bfloat16"
  lc.n_start = 8192
  lc.n_max = 2 ** 18
  lc.max_step_s = 2.0
  # A child process runs the search, so that an out-of-memory error or a
  # crash cannot take the whole run down; it may use this share of the
  # device's memory (XLA_PYTHON_CLIENT_MEM_FRACTION).
  lc.subprocess = True
  lc.mem_fraction = 0.9

  # d. The exact float32 policy's cost: the attend benchmark's standard
  # shape (configs/benchmark.py) through multi_head_attention, forward and
  # forward + backward, in each precision; the training step's figures
  # come from part a.
  c.policy = po = ml_collections.ConfigDict()
  po.shape = ml_collections.ConfigDict(benchmark.get_config().shape)
  po.paths = "auto"
  po.precisions = "exact,tf32,bf16"
  po.warmup = 2
  po.repeats = 5

  # e. User rules on the GPU (experiments/gpu_bench/flex.py): the Pallas
  # GPU kernel against cuDNN (causal), FlexAttention (torch.compile) and
  # the blockwise path, bf16, in the order of these lists (the most
  # telling first: a spent share skips the rest).
  c.flex = fx = ml_collections.ConfigDict()
  fx.head_dims = "64,128"
  fx.lengths = "8192,32768"
  fx.rules = "causal,documents,window,prefix_lm,alibi"
  fx.modes = "fwd,fwdbwd"
  fx.contestants = "pallas_gpu,cudnn,flex,flash"
  fx.B, fx.H = 1, 8
  fx.block = 64  # the block mask's (and so the kernels') block length
  fx.flash_max_n = 8192  # the blockwise path beyond: skipped (too slow)
  fx.warmup = 2
  fx.repeats = 5

  if smoke:
    c.budget_s = 300.0
    ts.shapes = "random"
    ts.random.update(num_layers=(1, 2), num_heads=(2,), head_dim=(8,),
                     seq_len=(16, 32), batch_size=(2, 4))
    # torch.compile on a CPU builds C++ kernels: a minute or more.
    ts.torch_compile = False
    ts.update(warmup=1, rounds=2, min_block_s=0.0)
    # One model (Gemma 3's family has the most to convert: QK-norm,
    # sandwich norms, sliding layers); tests/experiments/test_gpu_bench.py
    # checks both in float32.
    lm.models = "gemma3_270m"
    lm.tiny = True
    lm.update(tokens=24, prompt=5, new_tokens=4, rounds=2, decode_rounds=2)
    lc.paths = "auto,einsum,cudnn,pallas_tpu"
    lc.update(n_start=16, n_max=32, max_step_s=10.0)
    po.shape.update(B=1, n=32, D=16, h=2)
    po.precisions = "exact,bf16"  # train_step covers TF32's context
    po.update(warmup=1, repeats=2)
    # The kernel in interpret mode: tiny, two rules.
    fx.update(head_dims="16", lengths="32", rules="causal,documents",
              block=16, flash_max_n=32, warmup=0, repeats=1)
  return c
