"""Layer 6, training: synthetic and text tasks, experiment configs, the
AdamW loop with resumable checkpoints, held-out batches. Imports parallel,
models, core and hooks (docs/architecture.md, "The layers").
"""
