"""One head's low-rank bottleneck (experiment 3, part B)."""

import jax

from experiments.head_dim import low_rank


def test_low_rank_fit_exact_at_full_width_not_at_width_one():
  n = 5
  target = low_rank.random_targets(jax.random.PRNGKey(0), 1, n, 2.0)[0]
  x = jax.random.normal(jax.random.PRNGKey(1), (n, n))
  fit = jax.jit(lambda d_k: low_rank.fit_attention(
      target, x, d_k, steps=3000, lr=0.05, key=jax.random.PRNGKey(2)),
                static_argnums=0)
  kl_full, err_full = fit(n)
  kl_one, _ = fit(1)
  assert kl_full < 1e-4 and err_full < 1e-2
  assert kl_one > 100 * kl_full
  # A rank-1 fit of a full-support target keeps a visible error.
  assert kl_one > 1e-2


def test_width_sweep_lists_every_width_and_target():
  out = low_rank.width_sweep(2, n=3, d_model=3, steps=5, lr=0.05,
                             temperature=2.0)
  assert out["d_k"] == [1, 2, 3]
  assert [len(v) for v in out["kl"]] == [2, 2, 2]
  assert all(k >= 0 for v in out["kl"] for k in v)
