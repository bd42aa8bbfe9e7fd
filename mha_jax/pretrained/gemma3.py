"""Gemma 3 (text): Gemma 2's block with QK-norm and two rotary bases.

Differences from Gemma 2 (`gemma2.py`): q and k are normalised per head
before rotary by Gemma's RMSNorm, (1 + w) with the model's rms_norm_eps
(`qk_norm="rms"`; the norm's eps and offset are the model's own, so the
weights `self_attn.q_norm`/`k_norm` load as they are); the layers with a
sliding window rotate with a local base (`local_rotary_base`, 1e4) and
the global ones with rope_theta (1e6) and, when set, the rope scaling
(Gemma 3 4B's "linear" 8); five of every six layers slide. Soft caps are
off in the released models but read when set. A text-only checkpoint
(`model_type` "gemma3_text") is `Gemma3ForCausalLM` in transformers,
with the base model under `model.` as in Gemma 2.

RoPE fields: transformers 5 writes `rope_parameters` keyed by layer type
(`{"sliding_attention": {...}, "full_attention": {...}}`); older configs
have `rope_theta`, `rope_local_base_freq` and a `rope_scaling` that
applies to the global layers only. Both read the same.

Defaults for fields a config may lack (a GGUF file's metadata has no
local base, no layer pattern and no query_pre_attn_scalar): the values
of the official google/gemma-3-270m config.json, which are also
transformers' Gemma3TextConfig defaults: query_pre_attn_scalar 256,
rope_local_base_freq 1e4, rope_theta 1e6, sliding_window_pattern 6
(layer i slides unless (i + 1) % 6 == 0: full attention on layers 5, 11,
17 of the 270M's 18), hidden_activation gelu_pytorch_tanh, tied
embeddings. Gemma 3 27B's query_pre_attn_scalar is 168, not 256: its
config.json says so, a file without the field would load wrongly.
"""

from __future__ import annotations

import math

from mha_jax.pretrained import family as F
from mha_jax.pretrained import gemma2
from mha_jax.pretrained import llama
from mha_jax.pretrained.family import Rule

QUERY_PRE_ATTN_SCALAR = 256
GLOBAL_BASE = 1e6
LOCAL_BASE = 1e4
SLIDING_WINDOW_PATTERN = 6
_TYPES = ("sliding_attention", "full_attention")

RULES = gemma2.RULES + (
    Rule("layers.{l}.self_attn.q_norm.weight", "d", "blocks.{l}.attn.q_norm",
         "d", gguf="blk.{l}.attn_q_norm.weight"),
    Rule("layers.{l}.self_attn.k_norm.weight", "d", "blocks.{l}.attn.k_norm",
         "d", gguf="blk.{l}.attn_k_norm.weight"),
)


def _rope(hf: F.HFConfig):
  """(global base, global scaling, local base): local is None where the
  sliding layers rotate exactly as the global ones."""
  theta = hf.get("rope_theta", GLOBAL_BASE)
  local_theta = hf.get("rope_local_base_freq", LOCAL_BASE)
  params = hf.get("rope_parameters")
  if params is None:  # transformers 4: rope_scaling is the global layers'
    scaling = hf.get("rope_scaling")
    if isinstance(scaling, dict) and "rope_type" not in scaling and (
        "type" in scaling):
      # transformers 5 merges it into {"rope_type": "default"}, so an
      # older `type` alone would be read as no scaling at all.
      hf.fail("rope_scaling", f"'type' {scaling['type']!r} without "
              "'rope_type': transformers reads Gemma 3's rope_scaling by "
              "rope_type only (as no scaling); expected rope_type")
    full = {"rope_scaling": scaling, "rope_theta": theta}
    sliding = {"rope_theta": local_theta}
  else:
    if hf.get("rope_scaling") is not None:
      hf.fail("rope_scaling", "given beside rope_parameters; expected one "
              "of the two")
    if not (isinstance(params, dict) and params and set(params) <= set(
        _TYPES)):
      hf.fail("rope_parameters", f"expected entries keyed by layer type "
              f"{list(_TYPES)}, got {params!r}")
    # As transformers does: an entry without a theta takes rope_theta or
    # rope_local_base_freq (or their defaults).
    full = dict(params.get("full_attention") or {})
    full.setdefault("rope_theta", theta)
    sliding = dict(params.get("sliding_attention") or {})
    sliding.setdefault("rope_theta", local_theta)
    full, sliding = {"rope_parameters": full}, {"rope_parameters": sliding}
  out = []
  for kind, fields in (("full_attention", full), ("sliding_attention",
                                                 sliding)):
    base, scaling, partial = F.rope(F.HFConfig(
        fields, f"{hf.where} ({kind} layers)"))
    if partial != 1.0:
      hf.fail("rope_parameters", f"{kind}: partial_rotary_factor "
              f"{partial}: Gemma 3 rotates every feature; expected 1")
    out.append((base, scaling))
  (base, scaling), local = out
  if local == (base, scaling):
    return base, scaling, None
  if local[1] is not None:
    hf.fail("rope_parameters", f"sliding_attention: scaling {local[1]} "
            "with its own base; mha_jax scales the global layers' "
            "frequencies only")
  return base, scaling, local[0]


def _from_hf(hf):
  n, d = hf.need("num_hidden_layers"), hf.need("hidden_size")
  hf.only("use_bidirectional_attention", (None, False))
  base, scaling, local = _rope(hf)
  scalar = (hf.need("query_pre_attn_scalar", (int, float))
            if "query_pre_attn_scalar" in hf else QUERY_PRE_ATTN_SCALAR)
  pattern = (hf.need("sliding_window_pattern")
             if "sliding_window_pattern" in hf else SLIDING_WINDOW_PATTERN)
  if pattern < 1:
    hf.fail("sliding_window_pattern", f"expected an int >= 1, got {pattern}")
  # What transformers 4 wrote beside layer_types; transformers 5 reads
  # only sliding_window_pattern, and only without layer_types.
  hf.get("_sliding_window_pattern")
  return dict(
      vocab_size=hf.need("vocab_size"), d_model=d, num_layers=n,
      num_heads=hf.need("num_attention_heads"),
      num_kv_heads=hf.need("num_key_value_heads"),
      head_dim=hf.need("head_dim"), mlp_dim=hf.need("intermediate_size"),
      max_len=hf.need("max_position_embeddings"),
      positions="rotary", rotary_base=base, rotary_scaling=scaling,
      local_rotary_base=local,
      norm="rms", norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      norm_offset=1.0, norm_placement="sandwich", qk_norm="rms",
      use_bias=bool(hf.get("attention_bias", False)),
      mlp_gated=True, mlp_bias=False, readout_bias=False,
      mlp_activation=F.activation(hf, "hidden_activation",
                                  "gelu_pytorch_tanh"),
      embed_scale=math.sqrt(d),
      tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
      attn_scale=float(scalar) ** -0.5,
      logit_soft_cap=hf.get("attn_logit_softcapping"),
      final_soft_cap=hf.get("final_logit_softcapping"),
      layer_windows=F.windows(hf, n, lambda l: (l + 1) % pattern != 0))


def _to_hf(c):
  full = F.rope_to_hf(c)["rope_parameters"]
  sliding = (full if c.local_rotary_base is None else
             {"rope_type": "default", "rope_theta": c.local_rotary_base})
  common = llama.common_to_hf(c)
  del common["hidden_act"]  # Gemma's field is hidden_activation
  return dict(
      common, attention_bias=c.use_bias,
      hidden_activation=F.ACTIVATION_NAMES[c.mlp_activation],
      query_pre_attn_scalar=gemma2.scalar(c.attn_scale),
      attn_logit_softcapping=c.logit_soft_cap,
      final_logit_softcapping=c.final_soft_cap,
      rope_parameters={"full_attention": full,
                       "sliding_attention": sliding},
      **F.windows_to_hf(c))


GEMMA3 = F.Family(name="gemma3", model_types=("gemma3_text",),
                  architecture="Gemma3ForCausalLM", model="decoder",
                  prefix="model.", rules=RULES, ignored=llama.IGNORED,
                  from_hf=_from_hf, to_hf=_to_hf)
