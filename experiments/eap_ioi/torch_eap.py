"""Edge attribution patching (EAP, EAP-IG) in PyTorch on transformers'
`LlamaForCausalLM`: the peer `mha_jax.interp.eap.edge_scores` is checked
and timed against, written from the definition, not from eap.py.

Shape letters: B batch, T tokens, D d_model, V vocabulary, H query heads,
K kv heads, E head width, S senders, R receivers.

The graph. Senders write into the residual stream: the token embedding,
each attention head's own output z_h W_O^h (o_proj's columns of head h)
and each MLP's output. Receivers read it: each query head's q, each kv
head's k and v, each MLP and the logits, each through its RMSNorm. The
labels and their order are `eap_graph`'s (embed, then per layer L{l}H{h}
and MLP{l}; receivers per layer q, k, v heads, the MLP, then the logits),
so the two libraries' `[S, R]` arrays compare entry by entry. An edge runs
where the sender writes before the receiver reads (`stages`).

The score of edge (s, r):

  sum over batch and positions of (a_s(corrupted) - a_s(clean)) . g_r,

g_r = dMetric/dx_r, where x_r is the stream receiver r reads (before its
norm). In the model every receiver of a layer reads one shared stream;
here each reads its own copy, x + eps_r with eps_r = 0, so one backward
pass gives every receiver's gradient alone (`_forward`: head h's q is
computed from its own copy only, kv head j's k and v from theirs). EAP
takes g at the clean run. EAP-IG averages it over `steps` runs whose
EMBEDDING (the first sender, which is all the tokens feed in Llama) lies
on the straight line from the corrupted one to the clean one, at k /
steps for k = 1..steps, the rest of each run computed from it: where
eap.py interpolates (its `embed`), so steps=1 is EAP.

Torch is imported inside the functions (a test-only and benchmark-only
peer): importing this module needs no torch.
"""

from __future__ import annotations

import math


def _sizes(config):
  """`(layers, H, K, E)` of a transformers Llama config."""
  h = config.num_attention_heads
  e = getattr(config, "head_dim", None) or config.hidden_size // h
  return config.num_hidden_layers, h, config.num_key_value_heads, e


def labels(config) -> tuple[list[str], list[str]]:
  """`(senders [S], receivers [R])`: the names and order of `eap_graph`."""
  n_layers, h, k, _ = _sizes(config)
  senders, receivers = ["embed"], []
  for l in range(n_layers):
    senders += [f"L{l}H{i}" for i in range(h)] + [f"MLP{l}"]
    for kind, n in (("q", h), ("k", k), ("v", k)):
      receivers += [f"L{l}H{i}.{kind}" for i in range(n)]
    receivers.append(f"MLP{l}")
  return senders, receivers + ["logits"]


def stages(config) -> tuple[list[int], list[int]]:
  """When each sender writes and each receiver reads, in the order of
  `labels`: the embedding at 0; layer l's attention reads and writes at
  2l + 1, its MLP at 2l + 2; the logits read at 2L + 1. An edge runs
  where the sender's stage is below the receiver's (`exists`)."""
  n_layers, h, k, _ = _sizes(config)
  send, read = [0], []
  for l in range(n_layers):
    send += [2 * l + 1] * h + [2 * l + 2]
    read += [2 * l + 1] * (h + 2 * k) + [2 * l + 2]
  return send, read + [2 * n_layers + 1]


def exists(config):
  """`[S, R]` bool tensor: True where an edge runs."""
  import torch  # pylint: disable=import-outside-toplevel
  send, read = stages(config)
  return torch.tensor(send)[:, None] < torch.tensor(read)[None, :]


def _rms(norm, x):
  """Llama's RMSNorm with `norm`'s weight and epsilon, in `x`'s own dtype
  (transformers' module computes in float32 even for a float64 model,
  which would cap the float64 reference at float32's precision)."""
  import torch  # pylint: disable=import-outside-toplevel
  scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
  return norm.weight * (x * scale)


def _per_head(linear, x, n):
  """`x [B, T, n, D]` (stream i for head i) -> `[B, n, T, E]`: head i of
  `linear`'s output (rows i*E..(i+1)*E of its weight) from stream i."""
  import torch  # pylint: disable=import-outside-toplevel
  w = linear.weight.view(n, -1, x.shape[-1])  # [n, E, D]
  y = torch.einsum("btnd,ned->bnte", x, w)
  if linear.bias is not None:
    y = y + linear.bias.view(n, 1, -1)
  return y


def _rotate(x, cos, sin):
  """Rotary positions on `x [B, n, T, E]` (Llama's half-split pairs)."""
  import torch  # pylint: disable=import-outside-toplevel
  half = x.shape[-1] // 2
  turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
  return x * cos + turned * sin


def _forward(hf, tokens, *, embed=None, eps=None):
  """`(logits [B, T, V], senders [B, T, S, D])` of one run in which every
  receiver reads its own copy of the stream.

  `embed [B, T, D]` replaces the embedding of `tokens [B, T]` (EAP-IG's
  points); `eps` (a list, one `[B, T, n, D]` per receiver group in
  `labels`' order: per layer q [H], k [K], v [K], MLP [1]; then logits
  [1]) is added to the copies (zeros: their gradients are the g_r).
  """
  import torch  # pylint: disable=import-outside-toplevel
  model = hf.model
  n_layers, h, k, e = _sizes(hf.config)
  x = model.embed_tokens(tokens) if embed is None else embed
  b, t, d = x.shape
  groups = iter(eps) if eps is not None else None

  def own(n):
    """The stream copied n times `[B, T, n, D]`, plus its eps."""
    copies = x[:, :, None].expand(b, t, n, d)
    return copies if groups is None else copies + next(groups)

  rope = model.rotary_emb
  angles = torch.arange(t, dtype=x.dtype)[:, None] * rope.inv_freq.to(x.dtype)
  angles = torch.cat((angles, angles), dim=-1)  # [T, E]
  cos = torch.cos(angles) * rope.attention_scaling
  sin = torch.sin(angles) * rope.attention_scaling
  future = torch.ones(t, t, dtype=torch.bool).triu(1)
  # Query head i attends with kv head i // (H / K) (grouped-query).
  kv_of = torch.arange(h) // (h // k)
  senders = [x[:, :, None]]
  for layer in model.layers:
    attn, norm = layer.self_attn, layer.input_layernorm
    q = _rotate(_per_head(attn.q_proj, _rms(norm, own(h)), h), cos, sin)
    key = _rotate(_per_head(attn.k_proj, _rms(norm, own(k)), k), cos, sin)
    value = _per_head(attn.v_proj, _rms(norm, own(k)), k)
    match = torch.einsum("bnte,bnse->bnts", q, key[:, kv_of]) / math.sqrt(e)
    pattern = torch.softmax(match.masked_fill(future, -math.inf), dim=-1)
    z = torch.einsum("bnts,bnse->bnte", pattern, value[:, kv_of])
    w_o = attn.o_proj.weight.view(d, h, e)  # o_proj's columns by head
    heads = torch.einsum("bnte,dne->btnd", z, w_o)  # [B, T, H, D]
    x = x + heads.sum(2)
    if attn.o_proj.bias is not None:  # a constant: not a sender
      x = x + attn.o_proj.bias
    mlp = layer.mlp(_rms(layer.post_attention_layernorm, own(1)[:, :, 0]))
    x = x + mlp
    senders += [heads, mlp[:, :, None]]
  logits = hf.lm_head(_rms(model.norm, own(1)[:, :, 0]))
  return logits, torch.cat(senders, dim=2)


def _zeros(hf, shape_btd, dtype):
  """One zero eps `[B, T, n, D]` per receiver group (`_forward`)."""
  import torch  # pylint: disable=import-outside-toplevel
  n_layers, h, k, _ = _sizes(hf.config)
  b, t, d = shape_btd
  sizes = [h, k, k, 1] * n_layers + [1]
  return [torch.zeros(b, t, n, d, dtype=dtype, requires_grad=True)
          for n in sizes]


def edge_scores(hf, clean, corrupted, metric, *, method: str = "eap",
                steps: int = 5):
  """`[S, R]` torch tensor of every edge's score (module docstring); 0
  where no edge runs. Rows and columns in the order of `labels`.

  Args:
    hf: a transformers `LlamaForCausalLM` (its parameters' dtype is the
      computation's).
    clean, corrupted: `[B, T]` token ids (torch, int64).
    metric: logits `[B, T, V]` -> scalar tensor.
    method: "eap" or "eap-ig" (`steps` points, ignored by "eap").
  """
  import torch  # pylint: disable=import-outside-toplevel
  if method not in ("eap", "eap-ig"):
    raise ValueError(f"torch_eap: `method` must be 'eap' or 'eap-ig', got "
                     f"{method!r}")
  with torch.no_grad():
    _, a_clean = _forward(hf, clean)
    _, a_corrupt = _forward(hf, corrupted)
  alphas = [None] if method == "eap" else [i / steps
                                           for i in range(1, steps + 1)]
  grads = None
  for alpha in alphas:
    embed = None if alpha is None else (
        a_corrupt[:, :, 0] + alpha * (a_clean[:, :, 0] - a_corrupt[:, :, 0]))
    eps = _zeros(hf, a_clean[:, :, 0].shape, a_clean.dtype)
    logits, _ = _forward(hf, clean, embed=embed, eps=eps)
    g = torch.autograd.grad(metric(logits), eps)
    grads = g if grads is None else [a + c for a, c in zip(grads, g)]
  delta = a_corrupt - a_clean  # [B, T, S, D]
  g = torch.cat(grads, dim=2) / len(alphas)  # [B, T, R, D]
  scores = torch.einsum("btsd,btrd->sr", delta, g)
  return torch.where(exists(hf.config), scores, torch.zeros_like(scores))
