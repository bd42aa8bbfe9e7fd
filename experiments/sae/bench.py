r"""Speed of the SAE lab against the same work in PyTorch, in one run.

  python -m experiments.sae.bench --workdir=docs/results/sae

* Activation collection, tokens/s: SmolLM2-135M's layer-17 `z` for
  batches of 16 x 128 tokens. mha_jax: the experiment's collector (one
  jitted forward that returns only the site, so XLA drops the later
  layers). transformers (torch, 2 threads, float32, the same GGUF file): a
  forward pre-hook on layer 17's `o_proj` reads its input (the heads'
  outputs concatenated, which is `z`) and stops the forward there, as
  SAE libraries do. The two activations are compared first.
* SAE training, steps/s at the committed sizes (configs/sae.py: 64 -> 2048
  for the induction model, 576 -> 2304 for SmolLM2; batch 1024): the
  train step of mha_jax/sae/train.py against the same step written in
  torch (2 threads): loss, backward, the decoder-gradient projection,
  Adam with beta1 0, the renormalisation. One step from the same
  parameters is compared first.

Each measure runs both libraries once untimed, then `repeats` rounds
that time one call of each in an order rotated every round
(`timing.interleaved_times`), so a change of the machine's load falls on
both; the ratio is mha_jax's speed over torch's in the same round, its
median and range over rounds. Speeds are medians over rounds.

The roofline: a plain float32 `[1024, 1024] x [1024, 1024]` product
(`roofline.matmul_yardstick`) is timed in the same rounds, `YARD_REPEAT`
calls a timing after an untimed pause of `YARD_PAUSE_S` (torch's worker
threads spin on for a while after its calls). Each measure's share is
its matrix-multiply FLOPs per second over the yardstick's rate in the
same round, for both libraries. The FLOPs are those of mha_jax's
compiled program (`flops.compiled_matmul_flops`): for collection the
forward up to layer 17, which is all XLA keeps; for an SAE step `12 B d
m` (the encoder and decoder products, the encoder's weight gradient and
the decoder bias's gradient through it, the decoder's input and weight
gradients: six `2 B d m` products; a test checks this against the
compiled ReLU step). TopK's AuxK products run only once a feature has
been silent for `dead_steps` (300 or 400) steps, so not in these 16 steps
of either library, and its count is the same six. The process
keeps freed host memory for reuse first, as the other benchmarks and the
training commands do (`training/host_memory.py`); torch runs under the
same setting. Writes bench.json, with the CPU and the versions, into
--workdir.
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from configs import sae as sae_config
from mha_jax.core import flops
from mha_jax.measure import machine
from mha_jax.measure import roofline
from mha_jax.measure import timing
from mha_jax.pretrained import real_models
from mha_jax.sae import buffer
from mha_jax.sae import train
from mha_jax.training import host_memory

YARD_N, YARD_REPEAT, YARD_PAUSE_S = 1024, 5, 0.2  # the roofline's yardstick


def _rounds(jax_call, torch_call, repeats, work=1.0, roof=None) -> dict:
  """Both calls once untimed (mha_jax compiles), then `repeats`
  interleaved rounds: `{"jax", "torch"}` speeds (`work` per second,
  median over rounds), the per-round ratio of mha_jax's speed over
  torch's (median, min, max) and each round's seconds.

  `roof`: `(yardstick call, its FLOPs, the measure's matmul FLOPs per
  call)`; the yardstick is then timed in the same rounds and `"share"`
  gives each library's share of its rate (`roofline.share`)."""
  jax_call()
  torch_call()
  calls = {"jax": jax_call, "torch": torch_call}
  extra = {}
  if roof is not None:
    calls["yardstick"] = roof[0]
    extra = dict(setups={"yardstick": lambda: time.sleep(YARD_PAUSE_S)},
                 repeat={"yardstick": YARD_REPEAT})
  t = timing.interleaved_times(calls, repeats, **extra)
  ratio = timing.spread([b / a for a, b in zip(t["jax"], t["torch"])])
  out = {"jax": work / statistics.median(t["jax"]),
         "torch": work / statistics.median(t["torch"]),
         "ratio": ratio["median"],
         "ratio_range": [ratio["min"], ratio["max"]], "seconds": t}
  if roof is not None:
    _, yard_flops, mm = roof
    out["roofline"] = {
        "matmul_flops": mm,
        "yardstick_flops_per_s": [yard_flops / y for y in t["yardstick"]],
        "share": {c: roofline.share(mm, t[c], yard_flops, t["yardstick"])
                  for c in ("jax", "torch")}}
  return out


def step_matmul_flops(batch: int, d_in: int, d_sae: int) -> int:
  """Matrix-multiply FLOPs of one SAE train step while no feature is
  dead: six `2 B d m` products (module docstring)."""
  return 6 * 2 * batch * d_in * d_sae


def collection(repeats, yard) -> dict:
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  import mha_jax  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(2)
  layer, shape = 17, (16, 128)
  path = real_models.smollm2_135m()
  tokens = np.random.default_rng(0).integers(1000, 32000, shape).astype(
      np.int32)
  fwd = buffer.collector(mha_jax.load_pretrained(path),
                         f"blocks.{layer}.attn.z")
  hf = transformers.AutoModelForCausalLM.from_pretrained(
      str(path.parent), gguf_file=path.name, dtype=torch.float32,
      attn_implementation="sdpa").eval()

  class Stop(Exception):
    pass
  got = {}

  def hook(_, args):
    got["z"] = args[0]
    raise Stop

  hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(hook)
  t_tokens = torch.as_tensor(tokens, dtype=torch.long)

  def torch_collect():
    with torch.no_grad():
      try:
        hf(t_tokens)
      except Stop:
        pass
    return got["z"]

  mm = flops.compiled_matmul_flops(jax.jit(fwd).lower(tokens).compile())
  jax_z = np.asarray(fwd(tokens)).reshape(shape[0], shape[1], -1)
  diff = float(np.max(np.abs(jax_z - torch_collect().numpy())))
  n = shape[0] * shape[1]
  r = _rounds(lambda: jax.block_until_ready(fwd(tokens)), torch_collect,
              repeats, n, roof=(*yard, mm))
  return {"roofline": r["roofline"],
          "tokens_per_call": n, "jax_tokens_per_s": r["jax"],
          "torch_tokens_per_s": r["torch"], "ratio": r["ratio"],
          "ratio_range": r["ratio_range"], "seconds": r["seconds"],
          "max_abs_diff": diff,
          "max_abs": float(np.max(np.abs(jax_z)))}


def _torch_step(kind, k, l1, lr, beta2):
  import torch  # pylint: disable=import-outside-toplevel

  def step(p, opt, x):
    opt.zero_grad()
    pre = (x - p["b_dec"]) @ p["w_enc"] + p["b_enc"]
    f = torch.relu(pre)
    if kind == "topk":
      vals, idx = f.topk(k, dim=-1)
      f = torch.zeros_like(f).scatter(-1, idx, vals)
    err = x - (f @ p["w_dec"] + p["b_dec"])
    loss = (err ** 2).sum(-1).mean()
    if kind == "relu":
      loss = loss + l1 * (f * p["w_dec"].norm(dim=1)).sum(-1).mean()
    loss.backward()
    with torch.no_grad():
      w, g = p["w_dec"], p["w_dec"].grad
      g -= (g * w).sum(1, keepdim=True) * w
    opt.step()
    with torch.no_grad():
      p["w_dec"] /= p["w_dec"].norm(dim=1, keepdim=True)
  return step


def training(name, cfg, d_in, repeats, yard) -> list:
  import torch  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(2)
  x = np.random.default_rng(0).normal(size=(cfg.batch_size, d_in)).astype(
      np.float32)
  out = []
  for kind in ("relu", "topk"):
    c = sae_config.get_config(None).sae
    c.update(cfg.to_dict())
    c.kind = kind
    hp = train.hyper(c)
    step, _ = train.compiled(hp, float(c.learning_rate), float(c.beta2))
    state = train.init_state(c, d_in, np.zeros(d_in, np.float32))
    p = {n: torch.tensor(np.asarray(a), requires_grad=True)
         for n, a in state["params"].items()}
    opt = torch.optim.Adam(list(p.values()), lr=c.learning_rate,
                           betas=(0.0, c.beta2))
    t_step = _torch_step(kind, c.k, c.l1, c.learning_rate, c.beta2)
    xt = torch.tensor(x)
    # One step from the same parameters, compared.
    after, _ = step(jax.tree.map(jnp.copy, state), jnp.asarray(x))
    t_step(p, opt, xt)
    diff = max(float(np.max(np.abs(np.asarray(after["params"][n])
                                   - p[n].detach().numpy()))) for n in p)
    box = {"s": state}

    def jax_call():
      box["s"], m = step(box["s"], jnp.asarray(x))
      jax.block_until_ready(m)
    r = _rounds(jax_call, lambda: t_step(p, opt, xt), repeats, roof=(
        *yard, step_matmul_flops(c.batch_size, d_in, c.d_sae)))
    out.append({"roofline": r["roofline"], "sae": name, "kind": kind, "d_in": d_in, "d_sae": c.d_sae,
                "k": c.k if kind == "topk" else None,
                "batch": c.batch_size, "jax_steps_per_s": r["jax"],
                "torch_steps_per_s": r["torch"], "ratio": r["ratio"],
                "ratio_range": r["ratio_range"], "seconds": r["seconds"],
                "first_step_max_abs_diff": diff})
  return out


def main(argv):
  del argv
  import torch  # pylint: disable=import-outside-toplevel
  kept = host_memory.keep_freed_memory()
  start = time.perf_counter()
  load = os.getloadavg()[0]
  repeats = flags.FLAGS.repeats
  yard = roofline.matmul_yardstick(YARD_N)
  res = {"collection": collection(repeats, yard), "training": []}
  res["training"] += training("induction", sae_config.get_config(None).sae,
                              64, repeats, yard)
  res["training"] += training("smollm2",
                              sae_config.get_config("smollm2").sae, 576,
                              repeats, yard)
  res["yardstick"] = {"n": YARD_N, "repeat": YARD_REPEAT,
                      "pause_s": YARD_PAUSE_S}
  res["wall_s"] = time.perf_counter() - start
  res["threads"] = {"torch": 2, "note": "XLA uses the machine's 2 cores"}
  res.update({"rounds": repeats, "keep_freed_memory": kept,
              "load_avg_start": load, "load_avg_end": os.getloadavg()[0],
              "cores": os.cpu_count(), "cpu": machine.instruction_sets(),
              "jax": jax.__version__, "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d")})
  out = pathlib.Path(flags.FLAGS.workdir)
  out.mkdir(parents=True, exist_ok=True)
  (out / "bench.json").write_text(json.dumps(res, indent=1) + "\n")
  print(json.dumps(res, indent=1))


if __name__ == "__main__":
  # Defined here, not at import: importing the module sets no flags.
  flags.DEFINE_string("workdir", "runs/sae_bench", "Where bench.json goes.")
  flags.DEFINE_integer("repeats", 5, "Timed rounds per measure.")
  app.run(main)
