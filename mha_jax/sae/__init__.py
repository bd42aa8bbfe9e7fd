"""Layer 9, sae: sparse autoencoders on attention outputs: buffer, SAE,
training, metrics, attribution and an offline viewer (see docs/sae.md).
Imports training, parallel, models, core and hooks."""
