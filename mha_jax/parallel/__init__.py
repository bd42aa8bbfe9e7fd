"""Layer 3, parallel: meshes and shardings of models and batches over
devices (heads over a model axis, batch over a data axis, the sequence
over a sequence axis by ring or all-to-all attention, many hosts).
Imports models and below.
"""
