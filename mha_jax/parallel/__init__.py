"""Layer 5, parallel: meshes and shardings of models and batches over
devices (heads over a model axis, batch over a data axis, the sequence
over a sequence axis by ring or all-to-all attention, many hosts).
Imports core and hooks (docs/architecture.md, "The layers"); pretrained,
beside it, is not among them.
"""
