r"""The viewer page of a finished SAE run: top contexts of its features.

  python -m experiments.sae.view --workdir=runs/sae
  python -m experiments.sae.view --config=configs/sae.py:smollm2 \
      --workdir=runs/sae_smollm2

Reads results.json and the first seed's SAE of the config's first kind
(ReLU for the induction model, TopK for SmolLM2) from --workdir, and
writes view.html there (mha_jax/sae/view.py): the induction features
found (then the copying ones) and as many features drawn at random among
the live ones, each with its top contexts among the held-out inputs and
the repeated random tokens, per-token activation, and the DFA of the top
token by source token and by head; then, among the live features, the
PER_HEAD each head of the layer writes most (by decoder share) that are
not already there. `__main__` writes it after the report.

Beside it, explorer.html: the head explorer (mha_jax/interp/explorer.py)
of the run's model with the same features in its features panel. Its
heads are shown on the repeated random tokens, not the held-out inputs:
there an induction head's pattern is the unmistakable stripe one position
after the earlier copy, and its induction score over the batch means the
same for both models, while on held-out text (SmolLM2's) or task batches
(one segment repeated at a random place) the pattern of one example shows
it only in part. The features the page lists are the SAE's induction
features first, so the heads they read are then seen doing it. A head
of the SAE's layer, selected, lists the features it writes most with
their shares, each a button that opens the feature (every one is in the
panel: the list above adds those not picked). For the
induction model the table also has each head's ablation effect on the
next-token loss and the page Treescope's raw-array panel; for SmolLM2
(30 layers x 9 heads) both are left out: 270 ablations take minutes on a
CPU, and the panel would double a page of 10 MB of weights.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from experiments import cli
from experiments.sae import per_sae
from experiments.sae import sources
from mha_jax import hooks
from mha_jax.interp import explorer
from mha_jax.sae import attribution
from mha_jax.sae import buffer
from mha_jax.sae import sae as sae_lib
from mha_jax.sae import train
from mha_jax.sae import view

CONTEXT = 56  # tokens shown before a context's top token
PER_HEAD = 5  # features listed per head: those it writes most


def _pick(run, live, n, seed):
  """`(feature, title)`: induction, then copying features, then random
  live ones, `n` in all."""
  ind = run["induction"]
  chosen = [(f, "induction feature") for f in ind["features"][:n // 2]]
  copying = [f for f in ind.get("copying", []) if f not in ind["features"]]
  chosen += [(f, "copying feature") for f in copying[:n // 2 - len(chosen)]]
  rest = [f for f in live if f not in {c for c, _ in chosen}]
  rng = np.random.default_rng(seed)
  draw = rng.choice(rest, min(n - len(chosen), len(rest)), replace=False)
  return chosen + [(int(f), "drawn at random among live features")
                   for f in draw]


def with_head_tops(picked, tops) -> list:
  """`picked` `[(feature, title)]`, then every feature of `tops` (`{head
  name: [(feature, share)]}`) not among them, titled by the heads that
  list it, in order of first listing: the page opens each listed
  feature, so each needs its dict."""
  shown = {f for f, _ in picked}
  writers = {}  # feature -> the heads that list it
  for name, listed in tops.items():
    for feat, _ in listed:
      if feat not in shown:
        writers.setdefault(feat, []).append(name)
  return list(picked) + [(f, f"written most by {', '.join(heads)}")
                         for f, heads in writers.items()]


def features(config, workdir, *, kind: str | None = None,
             src: sources.Source | None = None,
             per_head: int = PER_HEAD) -> tuple[list, dict]:
  """The viewer's feature dicts for the first seed's `kind` SAE (None:
  the config's first kind), and the features each head of the layer
  writes most: `{head name: [(feature, decoder share)]}`, the `per_head`
  live features of largest share (`attribution.head_top_features`).

  The dicts are the picked features (`_pick`), then each head's listed
  features not among them, so that every listed feature opens in the
  explorer's panel. `src`: the run's source if already loaded.
  """
  e = config.experiment
  kind = kind or e.kinds[0]
  workdir = pathlib.Path(workdir)
  saved = json.loads((workdir / "results.json").read_text())
  seed = e.seeds[0]
  run = next(r for r in saved["runs"] if r["kind"] == kind
             and r["seed"] == seed)
  cfg = per_sae.sae_config(config, kind, seed)
  k = cfg.k if kind == "topk" else None
  width, scale = saved["model"]["width"], saved["data"]["scale"]
  params = train.load(cfg, width, workdir / f"{kind}_seed{seed}")["params"]
  src = src or sources.load(config, workdir)
  sets = [np.concatenate([b["inputs"] for b in src.eval_batches]),
          per_sae.repeated_tokens(e)]
  caps, acts = [], []
  for tokens in sets:
    z, pattern, v = per_sae.capture(src.model, tokens, e.layer).values()
    f = sae_lib.encode(params, buffer.flatten_site(z) * scale, kind=kind,
                       k=k).reshape(z.shape[0], z.shape[1], -1)
    if e.drop_first:  # the SAE never saw first tokens
      f = f.at[:, 0].set(0.0)
    caps.append((z, pattern, v))
    acts.append(np.asarray(f))
  live = np.flatnonzero(acts[0].max((0, 1)) > 0)
  shares = np.asarray(attribution.head_shares(params["w_dec"],
                                              saved["model"]["heads"]))
  names = [hooks.head_name(e.layer, h) for h in range(shares.shape[1])]
  head_tops = dict(zip(names, attribution.head_top_features(
      shares, live=live, k=per_head)))
  out = []
  for feat, title in with_head_tops(_pick(run, live, e.view_features, seed),
                                    head_tops):
    tops = sorted(((v, s, row, pos) for s, a in enumerate(acts)
                   for row, pos, v in attribution.top_contexts(
                       a[..., feat], e.top_contexts)), reverse=True)
    contexts = []
    for v, s, row, pos in tops[:e.top_contexts]:
      _, pattern, vals = caps[s]
      dfa = np.asarray(attribution.dfa_by_source(
          params, pattern[row:row + 1], vals[row:row + 1],
          features=[feat], scale=scale))[0, pos, 0]  # [H, S]
      # The tokens up to CONTEXT before the top one (room for the earlier
      # copy of a repeated input) and a few after it.
      lo, hi = max(0, pos - CONTEXT), pos + 4
      contexts.append({
          "tokens": src.decode(sets[s][row, lo:hi]),
          "acts": [float(x) for x in acts[s][row, lo:hi, feat]],
          "at": pos - lo, "source": [float(x) for x in dfa.sum(0)[lo:hi]],
          "by_head": list(zip(names, (float(x) for x in dfa.sum(1))))})
    out.append({"id": feat, "title": f"{title}; {kind} SAE, seed {seed}",
                "heads": list(zip(names, (float(x) for x in shares[feat]))),
                "contexts": contexts})
  return out, head_tops


def write_explorer(path, model, tokens, decode, feats, *, layer: int,
                   full: bool, title: str, info=(),
                   head_features=None) -> pathlib.Path:
  """The head explorer of `model` on `tokens [N, T]` (example 0 shown,
  labelled by `decode`) with `feats` in its features panel, at `path`;
  `head_features` (`features`' second value): the features each head
  writes most, listed in the selected head's panel.

  `full`: the table's ablation column (each head's increase of the
  next-token loss, every position but the last) and Treescope's panel.
  """
  tokens = np.asarray(tokens, np.int32)
  batch = {"inputs": tokens,
           "targets": np.pad(tokens[:, 1:], ((0, 0), (0, 1))),
           "loss_mask": np.pad(np.ones_like(tokens[:, 1:], np.float32),
                               ((0, 0), (0, 1)))}
  return explorer.write_explorer(
      model, batch, path, loss="xent" if full else None,
      labels={"inputs": decode(tokens[0])}, specials=False, title=title,
      info=info, raw_arrays=full, sae_features=feats, sae_layer=layer,
      sae_head_features=head_features)


def write(config, workdir, src: sources.Source | None = None
          ) -> pathlib.Path:
  """view.html and explorer.html of the run in `workdir`; returns the
  path of view.html. `src`: the run's source if already loaded."""
  e = config.experiment
  workdir = pathlib.Path(workdir)
  saved = json.loads((workdir / "results.json").read_text())
  src = src or sources.load(config, workdir)
  feats, tops = features(config, workdir, src=src)
  title = f"SAE features of layer {e.layer}'s z: {saved['model']['label']}"
  page = view.write_page(workdir / "view.html", feats, title=title)
  tokens = per_sae.repeated_tokens(e)
  write_explorer(
      workdir / "explorer.html", src.model, tokens, src.decode, feats,
      layer=e.layer, full=config.source == "induction", head_features=tops,
      title=f"Heads and SAE features: {saved['model']['label']}",
      info=[("run", str(workdir)), ("model", saved["model"]["label"]),
            ("input", f"repeated random tokens: {len(tokens)} rows, "
             f"{e.repeat_len} ids from [{e.token_range[0]}, "
             f"{e.token_range[1]}) twice, seed {e.data_seed + 1}"),
            ("SAE", f"{e.kinds[0]}, seed {e.seeds[0]}, on layer "
             f"{e.layer}'s z; contexts from the held-out inputs and the "
             "repeated tokens")])
  return page


if __name__ == "__main__":
  _FLAGS = cli.experiment_flags(config="configs/sae.py", workdir="runs/sae")

  def _run(config, workdir, *, reuse_runs=False, command=None):
    del reuse_runs, command  # the pages name no command
    print(f"Viewer: {write(config, workdir)} and explorer.html beside it")
    return {}
  cli.main(_run, _FLAGS)
