"""Each head's direct effect at END split by token, and where it attends.

Shape letters: N prompts, T tokens, L layers, H query heads, Dv per-head
value width, D d_model, M names of the pool, V vocabulary.

A head's direct effect on logit(IO) - logit(S) (`detectors.head_terms`:
its output at END through the final norm, and a sandwich block's
post-norm, frozen at the run) is the difference of two dot products,
its effect on logit(IO) and on logit(S). Those two parts say whether a
head raises IO or lowers S; but a head can also move every name's logit
alike, which changes neither the difference nor the prediction. So the
third part, its mean effect on the names of the pool that are NOT in the
prompt, is the baseline each part is read against: a head that writes
-logit(S) lowers S more than it lowers names it never saw.

`measure` returns `{name: [N, L, H]}`:

  io, s, other   effect on logit(IO), on logit(S), and the mean over the
                 pool's other names
  effect         io - s (the IOI experiment's `dla`, the same numbers)
  end_io, end_s  attention from END to IO, and to S1 + S2
  copy           the IOI experiment's copy score (its value at IO read
                 out: IO's logit minus the other names')
  agree          copy suppression in context (McDougall et al. 2023):
                 1 where the name the head attends to more (IO against
                 S1 + S2) is the name of the two whose logit it lowers
                 more, relative to the other names, and does lower
                 (below the other names' mean)
"""

from __future__ import annotations

import jax.numpy as jnp

from experiments.ioi_task import detectors
from experiments.ioi_task import forward


def measure(model, tokens, meta, name_ids) -> dict:
  """`{name: [N, L, H]}` (module docstring) on clean `tokens [N, T]`;
  `meta`: END, IO, S and the roles' positions per prompt; `name_ids [M]`
  the pool's names (the baseline's names are those that are neither the
  prompt's IO nor its S)."""
  c = model.config
  end, io, s = (jnp.asarray(meta[k]) for k in ("end", "io", "s"))
  last = f"blocks.{c.num_layers - 1}.resid_post"
  sites = (last,) + tuple(f"blocks.{l}.attn.z" for l in range(c.num_layers))
  _, acts = forward.end_logits(model, tokens, end, capture=sites)
  rows = jnp.arange(tokens.shape[0])
  scale = forward.final_scale(model, acts[last][rows, end])  # [N, D]
  name_ids = jnp.asarray(name_ids)
  u_names = forward.unembed(model, name_ids)  # [M, D]
  u_io, u_s = forward.unembed(model, io), forward.unembed(model, s)
  absent = ((name_ids[None] != io[:, None])
            & (name_ids[None] != s[:, None])).astype(jnp.float32)  # [N, M]
  parts = {"io": [], "s": [], "other": []}
  for l in range(c.num_layers):
    z_end = acts[f"blocks.{l}.attn.z"][rows, end]  # [N, H, Dv]
    term, _ = detectors.head_terms(model, l, z_end, scale)  # [N, H, D]
    parts["io"].append(jnp.einsum("nhd,nd->nh", term, u_io))
    parts["s"].append(jnp.einsum("nhd,nd->nh", term, u_s))
    names = jnp.einsum("nhd,md->nhm", term, u_names)
    parts["other"].append(jnp.einsum("nhm,nm->nh", names, absent)
                          / absent.sum(-1)[:, None])
  out = {k: jnp.stack(v, axis=1) for k, v in parts.items()}
  out["effect"] = out["io"] - out["s"]
  det = detectors.measure(model, tokens, meta, name_ids)
  out |= {k: det[k] for k in ("end_io", "end_s", "copy")}
  out["agree"] = agreement(out)
  return out


def agreement(m: dict):
  """`[N, L, H]` 0/1 (module docstring, `agree`) from `io`, `s`,
  `other`, `end_io`, `end_s` of `measure`."""
  io_sp, s_sp = m["io"] - m["other"], m["s"] - m["other"]
  attends_io = m["end_io"] > m["end_s"]
  lowers_io = io_sp < s_sp
  lowers = jnp.minimum(io_sp, s_sp) < 0
  return ((attends_io == lowers_io) & lowers).astype(jnp.float32)
