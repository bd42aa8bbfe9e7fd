"""Layer 2, core: pure functions of attention, nothing jitted.

The five stages (project, split heads, attend vmapped over heads, merge,
project out), masks, rotary positions, score rules (windows, soft caps,
sinks, ALiBi), the KV cache as data, FLOP counting, converters from Flax's
attention modules and the source's worked example. `kernels/` holds the
`attend` paths other than the reference vmap and einsum ones. Imports only
`mha_jax.hooks` from the project.
"""
