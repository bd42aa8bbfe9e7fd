"""Layer 8, interp: what heads do. Head metrics, ablation and gradient
importance, activation / path / attribution patching and how far
attribution stands in for activation, composition scores,
clean/corrupted pairs, the head survey, the browser explorer and its
inline notebook views (`show`). Imports training, parallel, models, core
and hooks (docs/architecture.md, "The layers"); measure, beside it at the
top, is not among them.
"""
