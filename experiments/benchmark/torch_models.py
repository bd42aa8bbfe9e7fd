r"""The train-step benchmark's PyTorch peers: the same model, written twice.

`Decoder` is the project's attention-only `DecoderLM` written by hand in
PyTorch the way a researcher would (pre-LN blocks, rotary on every
feature of q and k in the "rotate half" pairing, causal
`F.scaled_dot_product_attention`, final LayerNorm, a readout with a bias;
no biases on the attention projections, LayerNorm epsilon 1e-6 as in
Flax). `load_from` copies a `DecoderLM`'s parameters into it, so a test
can check that both compute the same loss and gradients: the benchmark
then times one model in two libraries, not two models.

`hooked_transformer` builds TransformerLens's `HookedTransformer` of the
same sizes (attention only, rotary, LayerNorm), the library most
interpretability work in PyTorch starts from. Its own choices stay (its
LayerNorm epsilon, a bias on every projection): it is timed as users
run it, not made equal.

`train_step` is one AdamW step with global-norm clipping for either, on
the decay groups of `mha_jax.training.train.make_optimizer` (matrices
decay, vectors do not) at its peak learning rate: the schedule's cost is
a scalar and is left out.

torch and transformer_lens are optional here: importing this module
needs torch; `hooked_transformer` raises ImportError without
transformer_lens.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

_EPS = 1e-6  # flax.nnx.LayerNorm's default, which DecoderLM keeps


def _rotate(x, cos, sin):
  """Rotary on `x [B, H, T, Dh]`: pairs (i, i + Dh/2) turned by the angle
  of each position (`cos`, `sin` are `[T, Dh/2]`)."""
  a, b = x.chunk(2, dim=-1)
  return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


class _Block(nn.Module):
  """x + W_O attention(rotary(W_Q LN x), rotary(W_K LN x), W_V LN x)."""

  def __init__(self, d_model, num_heads):
    super().__init__()
    self.num_heads = num_heads
    self.ln = nn.LayerNorm(d_model, eps=_EPS)
    self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
    self.out = nn.Linear(d_model, d_model, bias=False)

  def forward(self, x, cos, sin):
    b, t, d = x.shape
    qkv = self.qkv(self.ln(x)).view(b, t, 3, self.num_heads, -1)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [B, H, T, Dh]
    z = F.scaled_dot_product_attention(_rotate(q, cos, sin),
                                       _rotate(k, cos, sin), v,
                                       is_causal=True)
    return x + self.out(z.transpose(1, 2).reshape(b, t, d))


class Decoder(nn.Module):
  """Embedding -> L attention-only pre-LN blocks -> LayerNorm -> readout."""

  def __init__(self, vocab_size, d_model, num_layers, num_heads, seq_len,
               rotary_base=10000.0):
    super().__init__()
    if d_model % num_heads or (d_model // num_heads) % 2:
      raise ValueError(f"Decoder: d_model={d_model} must split into "
                       f"num_heads={num_heads} heads of even width")
    self.embed = nn.Embedding(vocab_size, d_model)
    self.blocks = nn.ModuleList(_Block(d_model, num_heads)
                                for _ in range(num_layers))
    self.final_ln = nn.LayerNorm(d_model, eps=_EPS)
    self.readout = nn.Linear(d_model, vocab_size)
    dh = d_model // num_heads
    freq = rotary_base ** (-torch.arange(dh // 2, dtype=torch.float32)
                           * 2.0 / dh)
    angle = torch.arange(seq_len, dtype=torch.float32)[:, None] * freq
    self.register_buffer("cos", angle.cos(), persistent=False)
    self.register_buffer("sin", angle.sin(), persistent=False)

  def forward(self, tokens):
    """tokens [B, T] (int64) -> logits [B, T, V]."""
    t = tokens.shape[1]
    x = self.embed(tokens)
    for block in self.blocks:
      x = block(x, self.cos[:t], self.sin[:t])
    return self.readout(self.final_ln(x))


def _np(x):
  """An nnx Param (or array) as a float32 numpy array."""
  return np.array(x.get_value() if hasattr(x, "get_value") else x,
                  dtype=np.float32)


def _t(x):
  return torch.from_numpy(_np(x))


@torch.no_grad()
def load_from(decoder: Decoder, params) -> Decoder:
  """Copy a `DecoderLM`'s parameters (`nnx.state(model, nnx.Param)`,
  attention-only, rotary, untied readout with a bias) into `decoder`."""
  decoder.embed.weight.copy_(_t(params["embed"]["embed"]["embedding"]))
  for i, block in enumerate(decoder.blocks):
    p = params["blocks"][i]
    attn = p["attn"]
    w = [_np(attn[n]) for n in ("w_q", "w_k", "w_v")]  # [D, H, Dh]
    d = w[0].shape[0]
    block.qkv.weight.copy_(_t(np.concatenate(
        [x.reshape(d, -1) for x in w], axis=1).T))
    block.out.weight.copy_(_t(_np(attn["w_o"]).reshape(-1, d).T))
    block.ln.weight.copy_(_t(p["ln_attn"]["scale"]))
    block.ln.bias.copy_(_t(p["ln_attn"]["bias"]))
  decoder.final_ln.weight.copy_(_t(params["final_ln"]["scale"]))
  decoder.final_ln.bias.copy_(_t(params["final_ln"]["bias"]))
  decoder.readout.weight.copy_(_t(params["readout"]["kernel"]).T)
  decoder.readout.bias.copy_(_t(params["readout"]["bias"]))
  return decoder


def hooked_transformer(vocab_size, d_model, num_layers, num_heads, seq_len,
                       seed=0):
  """TransformerLens's HookedTransformer of the same sizes (ImportError
  without transformer_lens)."""
  from transformer_lens import HookedTransformer  # pylint: disable=g-import-not-at-top
  from transformer_lens import HookedTransformerConfig  # pylint: disable=g-import-not-at-top
  cfg = HookedTransformerConfig(
      n_layers=num_layers, d_model=d_model, n_ctx=seq_len,
      d_head=d_model // num_heads, n_heads=num_heads, d_vocab=vocab_size,
      attn_only=True, act_fn="gelu", normalization_type="LN",
      positional_embedding_type="rotary", rotary_dim=d_model // num_heads,
      device="cpu", seed=seed)
  return HookedTransformer(cfg)


def batch_to_torch(batch):
  """A task batch (`inputs`, `targets`, `loss_mask` arrays) as torch
  tensors, ids as int64 (copies: JAX's arrays are read-only)."""
  out = {k: torch.from_numpy(np.array(v)) for k, v in batch.items()}
  out["inputs"], out["targets"] = out["inputs"].long(), out["targets"].long()
  return out


def loss(model, tokens, targets, loss_mask):
  """Mean cross-entropy over the positions where `loss_mask` is 1 (the
  project's `compute_loss`)."""
  logits = model(tokens)
  per_pos = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(),
                            reduction="none")
  mask = loss_mask.flatten()
  return (per_pos * mask).sum() / mask.sum().clamp(min=1.0)


def optimizer(model, train_cfg):
  """AdamW at the config's peak rate; weight decay on matrices only."""
  params = [p for p in model.parameters() if p.requires_grad]
  groups = [{"params": [p for p in params if p.ndim >= 2],
             "weight_decay": train_cfg.weight_decay},
            {"params": [p for p in params if p.ndim < 2],
             "weight_decay": 0.0}]
  return torch.optim.AdamW(groups, lr=train_cfg.learning_rate,
                           betas=(train_cfg.b1, train_cfg.b2))


def train_step(model, opt, batch, grad_clip):
  """One step: loss, backward, clip to `grad_clip` (0: off), update.
  `batch`: torch tensors `inputs`, `targets` (int64), `loss_mask`."""
  opt.zero_grad(set_to_none=True)
  value = loss(model, batch["inputs"], batch["targets"], batch["loss_mask"])
  value.backward()
  if grad_clip > 0:
    nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
  opt.step()
  return value.detach()
