"""Sparse autoencoders on attention outputs: buffer, SAE, training,
metrics, attribution and an offline viewer (see docs/sae.md)."""
