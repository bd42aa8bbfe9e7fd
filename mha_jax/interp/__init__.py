"""Layer 6, interp: what heads do. Head metrics, ablation and gradient
importance, activation / path / attribution patching, composition scores,
clean/corrupted pairs, a hand-wired circuit, the head survey, sweeps of
heads, the browser explorer and its inline notebook views (`show`).
Imports measure and below.
"""
