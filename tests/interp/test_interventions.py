"""Head ablation, gradient importance and pruning on a tiny decoder."""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mha_jax import hooks
from mha_jax.interp import interventions
from mha_jax.training import train_state
from mha_jax.models import transformer

L, H, T, V = 2, 2, 6, 11


def tiny_model(seed=0):
  return transformer.DecoderLM(
      transformer.ModelConfig(vocab_size=V, d_model=8, num_layers=L,
                              num_heads=H, max_len=T, attention_only=True),
      rngs=nnx.Rngs(params=jax.random.PRNGKey(seed)))


def tiny_batch(b=3, seed=1):
  toks = jax.random.randint(jax.random.PRNGKey(seed), (b, T + 1), 0, V)
  return {"inputs": toks[:, :-1], "targets": toks[:, 1:],
          "loss_mask": jnp.ones((b, T), jnp.float32)}


class InterventionTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.model, self.batch = tiny_model(), tiny_batch()

  def test_gradient_matches_finite_differences(self):
    grad = interventions.gradient_importance(self.model, self.batch, "xent")
    f = interventions.loss_fn(self.model, self.batch, "xent")
    eps = 1e-2
    ones = jnp.ones((L, H))
    for l in range(L):
      for h in range(H):
        up, down = ones.at[l, h].add(eps), ones.at[l, h].add(-eps)
        fd = (f(up) - f(down)) / (2 * eps)
        np.testing.assert_allclose(grad[l, h], fd, rtol=2e-2, atol=1e-4)

  def test_per_example_gradient_matches_a_loop(self):
    got = interventions.per_example_gradient_importance(
        self.model, self.batch, "xent")
    grads = [interventions.gradient_importance(
        self.model, jax.tree.map(lambda x, i=i: x[i:i + 1], self.batch),
        "xent") for i in range(self.batch["inputs"].shape[0])]
    np.testing.assert_allclose(got, np.mean(np.abs(grads), axis=0),
                               rtol=1e-4, atol=1e-7)

  def test_zero_ablation_equals_zeroing_the_heads_output_weights(self):
    # Independent route: zero the rows of W^O that read head h.
    got = interventions.zero_ablation(self.model, self.batch, "xent")
    clean = float(train_state.compute_loss(self.model, self.batch, "xent")[0])
    for l in range(L):
      for h in range(H):
        m = nnx.clone(self.model)
        attn = m.blocks[l].attn
        attn.w_o[...] = attn.w_o[...].at[h].set(0.0)
        loss = float(train_state.compute_loss(m, self.batch, "xent")[0])
        np.testing.assert_allclose(got[l, h], loss - clean, rtol=1e-4,
                                   atol=1e-6)
    self.assertGreater(np.max(np.abs(got)), 1e-4)

  def test_mean_ablation_is_per_position(self):
    # One example: its per-position mean is itself, so nothing changes (a
    # mean over positions as well would change it: T = 6 positions).
    batch = jax.tree.map(lambda x: x[:1], self.batch)
    got = interventions.mean_ablation(self.model, batch, "xent")
    np.testing.assert_allclose(got, 0.0, atol=1e-5)
    # On a real batch it is a different intervention from zero ablation.
    mean = interventions.mean_ablation(self.model, self.batch, "xent")
    zero = interventions.zero_ablation(self.model, self.batch, "xent")
    self.assertGreater(np.max(np.abs(mean - zero)), 1e-5)

  def test_resample_ablation_equals_patching_another_examples_output(self):
    # Independent route: capture z, then patch head h of layer l with the
    # previous example's captured value through the hook API.
    got = interventions.resample_ablation(self.model, self.batch, "xent")
    sites = interventions.z_sites(self.model)
    clean_loss, _ = train_state.compute_loss(self.model, self.batch, "xent")
    z = self.model(self.batch["inputs"], capture=sites)[1]
    for l, site in enumerate(sites):
      for h in range(H):
        patch = hooks.replace(site, jnp.roll(z[site], 1, axis=0), heads=h)
        loss, _ = train_state.compute_loss(self.model, self.batch, "xent",
                                           patch=patch)
        np.testing.assert_allclose(got[l, h], loss - clean_loss, rtol=1e-4,
                                   atol=1e-6)
    self.assertGreater(np.max(np.abs(got)), 1e-4)
    # Copies of one example: another example's output is the same output.
    same = jax.tree.map(lambda x: jnp.repeat(x[:1], 3, axis=0), self.batch)
    np.testing.assert_allclose(
        interventions.resample_ablation(self.model, same, "xent"), 0.0,
        atol=1e-5)

  def test_normalise_per_layer(self):
    np.testing.assert_allclose(
        interventions.normalise_per_layer([[3.0, 4.0], [0.0, 0.0]]),
        [[0.6, 0.8], [0.0, 0.0]])

  def test_iterative_pruning_reranks_after_each_removal(self):
    rank, test = self.batch, tiny_batch(seed=2)
    losses, order = interventions.iterative_prune_curve(
        self.model, rank, test, "xent")
    self.assertEqual(sorted(order.tolist()), list(range(L * H)))
    f = interventions.loss_fn(self.model, test, "xent")
    gates = np.ones((L, H), np.float32)
    np.testing.assert_allclose(losses[0], f(jnp.asarray(gates)), rtol=1e-6)
    for k, idx in enumerate(order[:2]):  # (each check compiles anew)
      # The head removed at step k is the least important of those left,
      # by Michel's score at the gates of that step.
      score = interventions.normalise_per_layer(
          interventions.per_example_gradient_importance(
              self.model, rank, "xent", gates=gates)).ravel()
      left = [i for i in range(L * H) if i not in order[:k]]
      self.assertEqual(idx, left[int(np.argmin(score[left]))])
      gates.ravel()[idx] = 0.0
      np.testing.assert_allclose(losses[k + 1], f(jnp.asarray(gates)),
                                 rtol=1e-6)
    np.testing.assert_allclose(losses[-1], f(jnp.zeros((L, H))), rtol=1e-6)

  def test_prune_curve_ends(self):
    f = interventions.loss_fn(self.model, self.batch, "xent")
    order = [3, 0, 2, 1]
    losses = interventions.prune_curve(self.model, self.batch, "xent", order)
    self.assertLen(losses, L * H + 1)
    np.testing.assert_allclose(losses[0], f(jnp.ones((L, H))), rtol=1e-6)
    np.testing.assert_allclose(losses[-1], f(jnp.zeros((L, H))), rtol=1e-6)
    np.testing.assert_allclose(
        losses[1], f(jnp.ones((L, H)).at[1, 1].set(0.0)), rtol=1e-6)

  def test_rank_correlation(self):
    a = np.array([0.1, 0.5, 0.3, 0.9])
    self.assertAlmostEqual(interventions.rank_correlation(a, 2 * a), 1.0)
    self.assertAlmostEqual(interventions.rank_correlation(a, -a), -1.0)


if __name__ == "__main__":
  absltest.main()
