"""Layer 3, models: Flax NNX modules built on the core.

`ModelConfig`, the `MultiHeadAttention` module that owns its KV cache,
transformer blocks, `DecoderLM` / `Encoder` / `EncoderDecoder`, and cached
generation. Imports hooks and core.
"""
