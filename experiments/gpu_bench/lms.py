"""Part b: SmolLM2-135M and Gemma 3 270M in mha_jax against transformers,
built from their configs with random weights, on the same device.

The models' GGUF files (`make install`, mha_jax.pretrained.real_models)
are not needed: transformers builds each model from its config (below,
as the checkpoints' config.json give them) with its own random
initialisation (seeded), saves it as safetensors, and mha_jax reads that
checkpoint with `load_pretrained`, the loader of every Hugging Face
checkpoint. Both libraries then hold the same weights; agreement of their
float32 logits is a check of the conversion, independent of the GGUF
reader that the real-model tests use.

Tasks (one sequence): forward of `tokens` ids (logits at every position,
no cache); loss + gradient of every weight on them (mean next-token
cross-entropy); greedy decoding of `new_tokens` after a `prompt`-token
prompt with the KV cache (mha_jax `generate.generate`, transformers
`generate`). The calls are experiments/real_lm_bench's (`mha_jax_calls`,
`torch_calls`), with the ids on torch's device and every torch call
ended by a device synchronisation. Each contestant's first call per task
is untimed (`first_s`; mha_jax compiles then), then `rounds` rounds
(`decode_rounds` for decoding) of one call each, in rotated order
(`timing.interleaved_times`); the ratio is mha_jax's median time over
transformers'. Every model runs in float32 before any runs in bf16, and
within a dtype task by task across the models (every forward, then every
gradient, then decoding), so that a time budget spent early costs bf16
and decoding figures first, not a model's float32 agreement.

In float32 (mha_jax at its exact policy, torch without TF32) the forward
logits are compared with transformers' float64 run on the same weights:
transformers' own float32 error (its float32 logits against its float64
ones) is the yardstick, as in tests/real_models. bf16: both libraries
hold the weights in bf16 (mha_jax `param_dtype`, transformers
`.to(bfloat16)`).
"""

from __future__ import annotations

import copy
import gc
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import mha_jax
from experiments import torch_peers
from experiments.gpu_bench import devices
from experiments.real_lm_bench import run as real_lm
from mha_jax.measure import timing

_SLIDING = "sliding_attention"
_FULL = "full_attention"

# HuggingFaceTB/SmolLM2-135M(-Instruct)'s config.json, less token ids and
# bookkeeping; its GGUF file's metadata gives the same model.
SMOLLM2_135M = dict(
    model_type="llama", hidden_size=576, num_hidden_layers=30,
    intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
    head_dim=64, max_position_embeddings=8192, rope_theta=100000.0,
    rms_norm_eps=1e-5, vocab_size=49152, tie_word_embeddings=True,
    hidden_act="silu", attention_bias=False, mlp_bias=False)
# google/gemma-3-270m's config.json (transformers 4's fields), less token
# ids and bookkeeping: five sliding layers of 512 keys, then a global one.
GEMMA3_270M = dict(
    model_type="gemma3_text", hidden_size=640, num_hidden_layers=18,
    intermediate_size=2048, num_attention_heads=4, num_key_value_heads=1,
    head_dim=256, max_position_embeddings=32768, rms_norm_eps=1e-6,
    sliding_window=512, rope_theta=1e6, rope_local_base_freq=1e4,
    vocab_size=262144, tie_word_embeddings=True, attention_bias=False,
    hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=256,
    use_bidirectional_attention=False,
    layer_types=[_FULL if (i + 1) % 6 == 0 else _SLIDING
                 for i in range(18)])
# The same families at toy sizes (config.lms.tiny, the smoke run).
TINY = {
    "smollm2_135m": dict(hidden_size=48, num_hidden_layers=2,
                         intermediate_size=64, num_attention_heads=3,
                         num_key_value_heads=1, head_dim=16,
                         vocab_size=256, max_position_embeddings=64),
    "gemma3_270m": dict(hidden_size=32, num_hidden_layers=2,
                        intermediate_size=48, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=16, vocab_size=256,
                        max_position_embeddings=64, sliding_window=8,
                        query_pre_attn_scalar=16,
                        layer_types=[_SLIDING, _FULL]),
}
MODELS = {"smollm2_135m": ("SmolLM2-135M", SMOLLM2_135M),
          "gemma3_270m": ("Gemma 3 270M", GEMMA3_270M)}
TASKS = ("forward", "loss_grad", "decode")


def model_fields(name: str, tiny: bool) -> dict:
  """The config.json fields of model `name` (a key of `MODELS`)."""
  if name not in MODELS:
    raise ValueError(f"config.lms.models: unknown {name!r}; expected "
                     f"names from {list(MODELS)}")
  fields = dict(MODELS[name][1])
  if tiny:
    fields.update(TINY[name])
  return fields


def build_hf(torch, fields: dict, seed: int):
  """transformers' model of `fields`, its own random initialisation
  (seeded), float32, eval mode, on the CPU."""
  import transformers  # pylint: disable=import-outside-toplevel
  transformers.utils.logging.disable_progress_bar()
  kwargs = {k: v for k, v in fields.items() if k != "model_type"}
  config = transformers.AutoConfig.for_model(fields["model_type"], **kwargs)
  torch.manual_seed(seed)
  return transformers.AutoModelForCausalLM.from_config(config).eval()


def _np(x) -> np.ndarray:
  """A JAX array or torch tensor (any device, any float) as float64."""
  if hasattr(x, "detach"):  # torch
    return x.detach().double().cpu().numpy()
  return np.asarray(x, np.float64)


def errors(ours, ref) -> dict:
  """Max |ours - ref| and ||ours - ref|| / ||ref||."""
  d = ours - ref
  return {"max_abs": float(np.abs(d).max()),
          "rel": float(np.linalg.norm(d) / np.linalg.norm(ref))}


def _synced(torch, device, fn):
  def call():
    out = fn()
    devices.sync(torch, device)
    return out
  return call


def time_task(calls: dict, task: str, rounds: int):
  """`({"first_s": {name: s}, "times": {name: [s]}, "median_s", "ratio"},
  {name: first call's output})` of one task: each contestant's first
  call untimed, then `rounds` interleaved calls."""
  named = {name: c[task] for name, c in calls.items()}
  first, outs = {}, {}
  for name, fn in named.items():
    first[name], outs[name] = timing.timed_call(lambda: None, fn)
  times = timing.interleaved_times(named, rounds)
  med = {name: float(np.median(t)) for name, t in times.items()}
  return {"first_s": first, "times": times, "median_s": med,
          "ratio": med["mha_jax"] / med["transformers"]}, outs


def agreement(entry: dict, task: str, outs: dict, ref64) -> None:
  """What the first calls' outputs of `task` say about agreement, into
  `entry`: logits errors (forward), losses, equal greedy tokens."""
  if task == "forward":
    ours, theirs = _np(outs["mha_jax"]), _np(outs["transformers"])
    entry["logits"] = {"mha_jax_vs_transformers": errors(ours, theirs)}
    if ref64 is not None:
      entry["logits"].update(
          mha_jax_vs_float64=errors(ours, ref64),
          transformers_vs_float64=errors(theirs, ref64),
          max_abs_float64=float(np.abs(ref64).max()))
  elif task == "loss_grad":
    entry["loss"] = {n: float(o[0] if isinstance(o, tuple) else o)
                     for n, o in outs.items()}
  else:
    entry["decode_agreement"] = torch_peers.leading_agreement(
        _np(outs["mha_jax"]), _np(outs["transformers"]))


def dtype_order(text: str) -> list[str]:
  """The dtypes of `config.lms.dtypes`, float32 first: transformers' model
  is cast to bf16 in place after its float32 runs."""
  dtypes = devices.names(text)
  bad = [d for d in dtypes if d not in ("float32", "bfloat16")]
  if bad:
    raise ValueError(f"config.lms.dtypes: unknown {bad}; expected "
                     "float32 and/or bfloat16")
  return sorted(dtypes, key=lambda d: d != "float32")


def prepare(name, lm, torch, device, seed) -> dict:
  """Model `name` in both libraries with the same weights: transformers'
  (float32, on `device`) and mha_jax's in every dtype of `lm.dtypes`,
  with the ids both read."""
  fields = model_fields(name, lm.tiny)
  hf = build_hf(torch, fields, seed)
  res = {"label": MODELS[name][0] + (" (toy sizes)" if lm.tiny else ""),
         "fields": fields, "dtypes": {},
         "params": int(sum(p.numel() for p in hf.parameters()))}
  ids = torch_peers.token_ids(fields["vocab_size"], lm.tokens, seed=seed)
  with tempfile.TemporaryDirectory() as checkpoint:
    start = time.perf_counter()
    hf.save_pretrained(checkpoint)
    models = {dtype: mha_jax.load_pretrained(
        checkpoint, implementation=lm.implementation,
        param_dtype=jnp.dtype(dtype)) for dtype in dtype_order(lm.dtypes)}
    res["convert_s"] = time.perf_counter() - start
  hf = hf.to(device)
  res["attn_implementation"] = hf.config._attn_implementation  # pylint: disable=protected-access
  return {"name": name, "hf": hf, "models": models, "res": res, "ids": ids,
          "ids_t": torch.as_tensor(ids).to(device),
          "prompt_t": torch.as_tensor(ids[:, :lm.prompt]).to(device),
          "ref64": None}


def calls_in(m: dict, dtype: str, lm, torch, device) -> dict:
  """The two contestants' calls (`{"mha_jax": {task: call},
  "transformers": ...}`) of prepared model `m` (`prepare`) in `dtype`;
  in float32 first transformers' float64 logits (the yardstick)."""
  if dtype == "float32":
    double = copy.deepcopy(m["hf"]).double()
    with torch.no_grad():
      m["ref64"] = _np(double(m["ids_t"], use_cache=False).logits)
    del double
    gc.collect()
  # In place, float32 first (dtype_order): transformers' bf16 weights are
  # mha_jax's, both rounded from the same float32 ones.
  m["hf"] = m["hf"].to(getattr(torch, dtype))
  ids = m["ids"]
  t_calls = {k: _synced(torch, device, f) for k, f in real_lm.torch_calls(
      m["hf"], m["ids_t"], m["prompt_t"], lm.new_tokens).items()}
  j_calls = real_lm.mha_jax_calls(m["models"][dtype],
                                  jnp.asarray(ids, jnp.int32),
                                  ids[:, :lm.prompt], lm.new_tokens)
  j_calls = {k: (v if callable(v) else (lambda v=v: v[0](*v[1])))
             for k, v in j_calls.items()}
  return {"mha_jax": j_calls, "transformers": t_calls}


def measure(config, budget) -> dict:
  """Every model of `config.lms.models` in every dtype (float32 first),
  task by task across the models (the forward of every model, then the
  gradients, then decoding), so that a budget spent early costs the
  later tasks, not a model's agreement; skipped, saying why, without
  torch or transformers."""
  lm = config.lms
  torch, why = devices.torch_or_reason()
  if torch is None:
    return {"skipped": why}
  try:
    import transformers  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    return {"skipped": "transformers is not importable here (the test "
                       "extra has it)"}
  device = devices.torch_device(torch)
  out = {"device": device, "models": {}}
  prepared = []
  for name in devices.names(lm.models):
    why = budget.reason()
    if why:
      out["models"][name] = {"skipped": why}
      continue
    m = prepare(name, lm, torch, device, config.seed)
    out["models"][name] = m["res"]
    prepared.append(m)
  rounds = {"forward": lm.rounds, "loss_grad": lm.rounds,
            "decode": lm.decode_rounds}
  # float32 at the policy against torch without TF32; bf16 weights.
  with devices.torch_settings(torch, devices.PRECISIONS["exact"]):
    for dtype in dtype_order(lm.dtypes):
      live = []
      for m in prepared:
        why = budget.reason()
        if why:
          m["res"]["dtypes"][dtype] = {"skipped": why}
          continue
        m["res"]["dtypes"][dtype] = {"tasks": {}}
        live.append((m, calls_in(m, dtype, lm, torch, device)))
      for task in TASKS:
        for m, calls in live:
          entry = m["res"]["dtypes"][dtype]
          why = budget.reason()
          if why:
            entry["tasks"][task] = {"skipped": why}
            continue
          entry["tasks"][task], outs = time_task(calls, task, rounds[task])
          agreement(entry, task, outs, m["ref64"])
          del outs
          gc.collect()
          print(f"[lms] {m['name']} {dtype} {task}: mha_jax / transformers "
                f"{entry['tasks'][task]['ratio']:.2f}", flush=True)
  del prepared
  gc.collect()
  jax.clear_caches()
  if device == "cuda":
    torch.cuda.empty_cache()
  return out
