"""`attend` paths beyond the reference ones: blockwise flash (`flash`),
`jax.nn.dot_product_attention` (`xla`), the Pallas TPU splash kernel
(`pallas`), and the rule that picks one (`auto`). `core.attention`
dispatches to them; they import only `core.score_rules` and `core.masks`.
"""
