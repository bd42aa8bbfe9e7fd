"""Layer 4, training: synthetic and text tasks, experiment configs, the
AdamW loop with resumable checkpoints, held-out batches. Imports parallel
and below.
"""
