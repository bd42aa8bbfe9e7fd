"""Layer 9, sae: sparse autoencoders on attention outputs: buffer, SAE,
training, metrics, attribution, an offline viewer, and SAELens's folder
format for exchanging them (see docs/sae.md).
Imports training, parallel, models, core and hooks."""
