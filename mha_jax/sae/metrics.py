"""How good an SAE is: sparsity, dead and dense features, explained
variance, and the model's loss with the reconstruction spliced in.

Shape letters: N examples, D input width, F features, B batch, T tokens,
H heads, Dv per-head value width.

Loss recovered (Kissane et al. 2024, after Bricken et al. 2023): the SAE's
reconstruction replaces the site through its patch hook, and

  recovered = (CE_ablated - CE_splice) / (CE_ablated - CE_clean),

1 when the splice costs nothing, 0 when it is as bad as removing the
site. Two ablations are the baselines: zero (the site's output set to 0)
and mean (to its mean over the buffer). A ratio near 1 can hide a raw
change that matters, so `losses` reports the CE of every mode, and with
`site_ce_kl_fn` the KL of each patched model's next-token distribution
from the clean one.
"""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from mha_jax.sae import buffer as buffer_lib
from mha_jax.sae import sae as sae_lib

DENSE = 0.1  # a feature firing on more than this share of tokens is dense


def feature_stats(params, acts, *, kind: str, k: int | None = None,
                  chunk: int = 4096) -> dict:
  """On `acts [N, D]`: {"l0", "freq" [F], "dead", "dense",
  "explained_variance"}; dead: fired on none of the N, dense: on more
  than `DENSE` of them; explained variance 1 - |x - x_hat|^2 /
  |x - mean x|^2 summed over all entries."""
  enc = jax.jit(lambda p, x: sae_lib.encode(p, x, kind=kind, k=k))
  fired = np.zeros(params["w_dec"].shape[0])
  err = total = l0 = 0.0
  mean = acts.mean(0)
  for a in range(0, acts.shape[0], chunk):
    x = jnp.asarray(acts[a:a + chunk])
    f = enc(params, x)
    x_hat = sae_lib.decode(params, f)
    fired += np.asarray(jnp.sum(f > 0, 0))
    l0 += float(jnp.sum(f > 0))
    err += float(jnp.sum((x - x_hat) ** 2))
    total += float(jnp.sum((x - mean[None]) ** 2))
  n = acts.shape[0]
  freq = fired / n
  return {"l0": l0 / n, "freq": freq, "dead": float(np.mean(freq == 0)),
          "dense": float(np.mean(freq > DENSE)),
          "explained_variance": 1.0 - err / total}


def splice(params, z, *, kind: str, k: int | None = None,
           scale: float = 1.0):
  """`z [B, T, H, Dv]` (or a block site `[B, T, D]`) -> the SAE's
  reconstruction in the same shape. The SAE reads `scale * x` (its
  training normalisation) and its output is divided back."""
  x = buffer_lib.flatten_site(z) * scale
  x_hat = sae_lib.reconstruct(params, x, kind=kind, k=k) / scale
  return x_hat.reshape(z.shape).astype(z.dtype)


def cross_entropy(logits, targets, mask):
  """Mean next-token loss over the positions where `mask [B, T]` is 1."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
  nll = -jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
  return jnp.sum(nll * mask) / jnp.sum(mask)


MODES = ("clean", "splice", "zero", "mean")


def _site_logits(model, site: str, *, kind: str, k: int | None,
                 keep_first: bool):
  """`(state, run)`: the model's weights and an un-jitted `run(mode,
  state, params, scale, mean_site, tokens) -> logits` with the site
  patched as `mode` says (`site_loss_fn`): the one path both the loss and
  the KL take. The weights are an argument, not a closure, so that a jit
  of `run` does not embed them as constants (which XLA would then try to
  fold, seconds per compile at SmolLM2's size)."""
  graphdef, state = nnx.split(model)

  def run(mode, state, params, scale, mean_site, tokens):
    if mode not in MODES:
      raise ValueError(f"site_loss_fn: `mode` must be one of {MODES}, got "
                       f"{mode!r}")
    patch = {
        "clean": None,
        "splice": lambda z: splice(params, z, kind=kind, k=k, scale=scale),
        "zero": jnp.zeros_like,
        "mean": lambda z: jnp.broadcast_to(
            mean_site.reshape(z.shape[2:]), z.shape).astype(z.dtype)}[mode]
    if patch and keep_first:
      patch = (lambda p: lambda z: jnp.concatenate([z[:, :1], p(z)[:, 1:]],
                                                   1))(patch)
    m = nnx.merge(graphdef, state)
    return m(tokens, patch={site: patch} if patch else None)
  return state, run


def site_loss_fn(model, site: str, *, kind: str, k: int | None = None,
                 keep_first: bool = False):
  """A jitted `(mode, params, scale, mean_site, tokens, targets, mask) ->
  CE`, with the site left alone ("clean"), replaced by the SAE's
  reconstruction ("splice"), zeroed ("zero") or set to `mean_site` (its
  mean, shaped like the flattened site's row, "mean"). `mode` is static.
  `keep_first`: position 0 keeps its clean value in every mode (for an
  SAE trained without first tokens)."""
  state, logits = _site_logits(model, site, kind=kind, k=k,
                               keep_first=keep_first)

  def run(mode, state, params, scale, mean_site, tokens, targets, mask):
    return cross_entropy(logits(mode, state, params, scale, mean_site,
                                tokens), targets, mask)

  jitted = jax.jit(run, static_argnums=0)
  return lambda mode, *args: jitted(mode, state, *args)


def site_ce_kl_fn(model, site: str, *, kind: str, k: int | None = None,
                  keep_first: bool = False):
  """Like `site_loss_fn`, but `-> (CE, KL(p_clean || p_mode))`: the
  mode's loss and the KL of its next-token distribution from the clean
  one, in nats per position, both the mean over the positions where
  `mask` is 1, from one clean and one patched forward (the loss alone
  and the KL alone would take three). Unlike the loss the KL compares
  whole distributions, so a splice that keeps the right token's
  probability but moves the rest still shows."""
  state, logits = _site_logits(model, site, kind=kind, k=k,
                               keep_first=keep_first)

  def run(mode, state, params, scale, mean_site, tokens, targets, mask):
    clean = logits("clean", state, params, scale, mean_site, tokens)
    patched = logits(mode, state, params, scale, mean_site, tokens)
    lp = jax.nn.log_softmax(clean.astype(jnp.float32), -1)
    lq = jax.nn.log_softmax(patched.astype(jnp.float32), -1)
    kl = jnp.sum(jnp.exp(lp) * (lp - lq), -1)  # [B, T]
    return (cross_entropy(patched, targets, mask),
            jnp.sum(kl * mask) / jnp.sum(mask))

  jitted = jax.jit(run, static_argnums=0)
  return lambda mode, *args: jitted(mode, state, *args)


def loss_recovered(ce_clean: float, ce_splice: float, ce_ablated: float
                   ) -> float:
  """(CE_ablated - CE_splice) / (CE_ablated - CE_clean)."""
  return (ce_ablated - ce_splice) / (ce_ablated - ce_clean)


def _mean(fn, mode, batches, params, scale, mean_site):
  """The mean over `batches` of `fn(mode, ...)` (a scalar or a tuple of
  them, as a float or a tuple of floats)."""
  out = [fn(mode, params, scale, mean_site, b["inputs"], b["targets"],
            b["loss_mask"]) for b in batches]
  mean = np.mean(np.asarray(out, np.float64), 0)
  return float(mean) if mean.ndim == 0 else tuple(float(m) for m in mean)


def baselines(loss_fn, batches, params, scale, mean_site, *,
              ce_kl_fn=None) -> dict:
  """Mean CE of the modes that do not involve the SAE ("clean", "zero",
  "mean") over `batches`, and with `ce_kl_fn` (`site_ce_kl_fn`) the
  ablations' mean KL from the clean distribution ("kl_zero", "kl_mean"):
  the same for every SAE on one site, so a run of several SAEs computes
  them once (`params` only fills the signature)."""
  out = {"clean": _mean(loss_fn, "clean", batches, params, scale,
                        mean_site)}
  for mode in ("zero", "mean"):
    if ce_kl_fn is None:
      out[mode] = _mean(loss_fn, mode, batches, params, scale, mean_site)
    else:
      out[mode], out[f"kl_{mode}"] = _mean(ce_kl_fn, mode, batches, params,
                                           scale, mean_site)
  return out


def losses(loss_fn, batches, params, scale, mean_site, *,
           ablations: dict | None = None, ce_kl_fn=None) -> dict:
  """Mean CE per mode over `batches` (dicts of inputs, targets,
  loss_mask), and loss recovered against both ablations; with
  `ce_kl_fn`, also the mean KL(clean || mode) of the splice and both
  ablations ("kl_splice", "kl_zero", "kl_mean"). `ablations`: `baselines`
  of this site and batches (with the same `ce_kl_fn`), if already
  computed."""
  base = dict(ablations or baselines(loss_fn, batches, params, scale,
                                     mean_site, ce_kl_fn=ce_kl_fn))
  if ce_kl_fn is None:
    base["splice"] = _mean(loss_fn, "splice", batches, params, scale,
                           mean_site)
  else:
    base["splice"], base["kl_splice"] = _mean(ce_kl_fn, "splice", batches,
                                              params, scale, mean_site)
  out = {mode: base[mode] for mode in MODES}
  out["recovered_zero"] = loss_recovered(out["clean"], out["splice"],
                                         out["zero"])
  out["recovered_mean"] = loss_recovered(out["clean"], out["splice"],
                                         out["mean"])
  if ce_kl_fn is not None:
    out.update({f"kl_{mode}": base[f"kl_{mode}"] for mode in ("splice",
                                                                "zero",
                                                                "mean")})
  return out
