"""Small SAE fits the SAE tests share: planted data, a smoke-sized
config, and a whole training run as one compiled scan."""

import jax
import jax.numpy as jnp
import numpy as np

from configs import sae as sae_config
from mha_jax.sae import buffer
from mha_jax.sae import train


def planted(seed, n, d, m, active):
  """`(atoms [m, d], x [n, d])`: each x a sum of `active` unit atoms with
  coefficients in [0.5, 1.5]."""
  rng = np.random.default_rng(seed)
  atoms = rng.normal(size=(m, d))
  atoms /= np.linalg.norm(atoms, axis=1, keepdims=True)
  codes = np.zeros((n, m))
  for i in range(n):
    idx = rng.choice(m, active, replace=False)
    codes[i, idx] = rng.uniform(0.5, 1.5, active)
  return atoms, (codes @ atoms).astype(np.float32)


def cfg(**kw):
  c = sae_config.get_config("smoke").sae
  c.update(**kw)
  return c


def fit(cfg, x):
  """The SAE after `num_steps` train steps on the buffer's batches (one
  scan: a single compiled program)."""
  hp = train.hyper(cfg)
  opt = train.make_optimizer(cfg.learning_rate, cfg.beta2)
  state = train.init_state(cfg, x.shape[1], x.mean(0))
  batches = np.stack([buffer.batch_at(x, i, batch_size=cfg.batch_size,
                                      seed=cfg.seed)
                      for i in range(cfg.num_steps)])
  step = lambda s, b: (train.train_step(s, b, hp=hp, optimizer=opt)[0], None)
  state, _ = jax.jit(lambda s, bs: jax.lax.scan(step, s, bs))(
      state, jnp.asarray(batches))
  return state["params"]
