r"""Experiment 3: head width d_k against head count h at fixed d_model.

  python -m experiments.head_dim --workdir=runs/head_dim

Part A trains the two-offset retrieval layer of `configs/head_dim.py` for
every h (d_k = d_model / h). Part B fits the query/key maps of ONE head of
width d_k to a random target attention matrix and reports the error against
d_k (the low-rank bottleneck of a head). Writes report.md, results.json and
PNG figures into --workdir.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs import head_dim as head_dim_config
from experiments import common
from experiments import two_offsets
from mha_jax import plots

def fit_attention(target, x, d_k: int, *, steps: int, lr: float, key):
  """Fit one head's W_q, W_k `[D, d_k]` to `target [n, n]` (rows sum to 1).

  Minimises the mean over rows of KL(target || softmax(x W_q W_k^T x^T /
  sqrt(d_k))) with Adam, full batch, no mask. Returns the final mean KL
  (nats) and the largest absolute weight error.
  """
  d = x.shape[1]
  kq, kk = jax.random.split(key)
  params = (jax.random.normal(kq, (d, d_k)) / np.sqrt(d),
            jax.random.normal(kk, (d, d_k)) / np.sqrt(d))
  # Decay to 1% of lr: the last steps polish the fit, so the error floor is
  # the representable error, not optimiser noise.
  tx = optax.adam(optax.cosine_decay_schedule(lr, steps, alpha=0.01))
  log_target = jnp.log(target)

  def predicted_log(p):
    logits = (x @ p[0]) @ (x @ p[1]).T / np.sqrt(d_k)  # [n, n]
    return jax.nn.log_softmax(logits, axis=-1)

  def kl(p):
    return jnp.mean(jnp.sum(target * (log_target - predicted_log(p)), -1))

  def step(carry, _):
    p, opt = carry
    g = jax.grad(kl)(p)
    updates, opt = tx.update(g, opt, p)
    return (optax.apply_updates(p, updates), opt), None

  (params, _), _ = jax.lax.scan(step, (params, tx.init(params)), None,
                                length=steps)
  err = jnp.max(jnp.abs(jnp.exp(predicted_log(params)) - target))
  return kl(params), err


def random_targets(key, num: int, n: int, temperature: float):
  """`num` random row-stochastic `[n, n]` targets with full support."""
  logits = temperature * jax.random.normal(key, (num, n, n))
  return jax.nn.softmax(logits, axis=-1)


def low_rank_sweep(e, seeds):
  """Mean KL and max error per d_k = 1..n over one target per seed."""
  n = e.fit_n
  targets = random_targets(jax.random.PRNGKey(100), len(seeds), n,
                           e.fit_temperature)
  xs = jax.random.normal(jax.random.PRNGKey(200), (len(seeds), n,
                                                   e.fit_d_model))
  keys = jax.random.split(jax.random.PRNGKey(300), len(seeds))
  out = {"d_k": [], "kl": [], "max_error": []}
  for d_k in range(1, n + 1):
    fit = jax.jit(jax.vmap(lambda t, x, k, d_k=d_k: fit_attention(
        t, x, d_k, steps=e.fit_steps, lr=e.fit_lr, key=k)))
    kl, err = fit(targets, xs, keys)
    out["d_k"].append(d_k)
    out["kl"].append(np.asarray(kl).tolist())
    out["max_error"].append(np.asarray(err).tolist())
  return out


def run(config, workdir):
  e = config.experiment
  workdir = pathlib.Path(workdir)
  d = config.model.d_model
  setting_list = [(f"h={h} (d_k={d // h})",
                   {"model.num_heads": h, "model.head_dim": 0})
                  for h in e.heads]
  cont, target_var = two_offsets.sweep(config, workdir,
                                       "two_offset_continuous", setting_list)
  labels = list(cont)
  nmse = [common.mean_std([r["nmse"] for r in cont[k]]) for k in labels]
  plots.line_plot([d // h for h in e.heads],
                  {"two-offset retrieval": ([m for m, _ in nmse],
                                            [s for _, s in nmse])},
                  xlabel="d_k (h = d_model / d_k)", ylabel="normalised MSE",
                  logx=True, title=f"Part A: d_model = {d}, one layer",
                  path=str(workdir / "nmse_vs_dk.png"))
  fit = low_rank_sweep(e, e.seeds)
  kl = [common.mean_std(v) for v in fit["kl"]]
  plots.line_plot(fit["d_k"], {"mean KL to target": ([m for m, _ in kl],
                                                     [s for _, s in kl])},
                  xlabel="d_k", ylabel="KL (nats)", logy=True,
                  title=f"Part B: fit one head to a random {e.fit_n}x"
                  f"{e.fit_n} attention",
                  path=str(workdir / "low_rank_fit.png"))
  report = _report(config, cont, nmse, labels, fit, kl)
  results = {
      "part_a": {k: [{kk: vv for kk, vv in r.items()
                      if kk != "weights_example"} for r in v]
                 for k, v in cont.items()},
      "part_a_target_variance": target_var,
      "part_b": fit}
  common.write_outputs(workdir, results, report)
  return results


def _report(config, cont, nmse, labels, fit, kl):
  e = config.experiment
  d = config.model.d_model
  best = labels[int(np.argmin([m for m, _ in nmse]))]
  rows_a = [[k, common.fmt(*m),
             common.fmt(*common.mean_std([r["offset1"].max()
                                          for r in cont[k]]), digits=2),
             common.fmt(*common.mean_std([r["offset3"].max()
                                          for r in cont[k]]), digits=2)]
            for k, m in zip(labels, nmse)]
  rows_b = [[dk, f"{m:.2e} ± {s:.1e}",
             f"{np.mean(err):.3f}"]
            for dk, (m, s), err in zip(fit["d_k"], kl, fit["max_error"])]
  # Smallest d_k whose mean KL is within 10x of the d_k = n fit.
  floor = kl[-1][0]
  knee = next(dk for dk, (m, _) in zip(fit["d_k"], kl) if m <= 10 * floor)
  lines = [
      "# Experiment 3: the head-width sweet spot",
      "",
      "Command: `python -m experiments.head_dim --workdir=runs/head_dim` "
      "(config `configs/head_dim.py`).",
      "",
      f"## Part A: two-offset retrieval, d_model = {d}, h = {list(e.heads)}",
      "",
      f"One attention-only layer, {config.model.positions} positions, "
      f"{config.train.num_steps} steps, seeds {list(e.seeds)}; normalised "
      f"MSE on {e.analysis_examples} held-out sequences (mean ± std).",
      "",
      common.md_table(["setting", "NMSE", "best head weight on t-1",
                       "best head weight on t-3"], rows_a),
      "",
      "![nmse_vs_dk.png](nmse_vs_dk.png)",
      "",
      f"Best setting: {best}.",
      "",
      f"## Part B: one head of width d_k fitted to a random {e.fit_n}x"
      f"{e.fit_n} attention matrix",
      "",
      f"X: {e.fit_n} random vectors in R^{e.fit_d_model}; target rows = "
      f"softmax({e.fit_temperature} * N(0, 1)); {e.fit_steps} Adam steps "
      f"(lr {e.fit_lr}); {len(e.seeds)} random targets; KL(target || fit) "
      "averaged over rows, and the largest absolute weight error.",
      "",
      common.md_table(["d_k", "mean KL (nats)", "max |error|"], rows_b),
      "",
      "![low_rank_fit.png](low_rank_fit.png)",
      "",
      "## What this shows, next to the source's claim",
      "",
      "The source says that below a sweet spot of d_k, adding heads "
      "degrades quality although the cost does not change.",
      "",
      f"* Part A: NMSE is lowest at {best}; see the table for how it "
      "rises on each side: with one head the layer cannot fetch two "
      "positions (NMSE at the 0.5 bound of experiment 2), and at the "
      "smallest d_k a head's scores have too few dimensions to pick one "
      "offset sharply out of absolute positions (compare the best head "
      "weight on t-1 across rows).",
      f"* Part B: the fit error drops to within 10x of the full-width "
      f"fit at d_k = {knee} (n = {e.fit_n}); a head of width d_k produces "
      "score matrices of rank <= d_k, and since a softmax ignores a "
      "constant per row, rank n - 1 suffices for any full-support target "
      f"(n - 1 = {e.fit_n - 1}). Narrower heads cannot represent an "
      "arbitrary pattern; they rely on the pattern being simple.",
  ]
  return "\n".join(lines)


if __name__ == "__main__":
  common.app_main(run, head_dim_config.get_config, "head_dim")
