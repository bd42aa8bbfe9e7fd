"""Layer 3, parallel: meshes and shardings of models and batches over
devices (heads over a model axis, batch over a data axis, many hosts).
Imports models and below.
"""
