"""A low-rank matrix kept as its two factors: `Factored(a, b)` is `a @ b`.

Shape letters: m rows, n columns, r the inner (middle) width, `...` any
leading axes shared by both factors (layers, heads), which broadcast.

A head's QK circuit W_Q W_K^T and OV circuit W_V W_O are `[D, D]` of rank
at most Dh, and a full OV circuit through the embedding and unembedding
is `[V, V]`. Everything asked of them here (singular values, eigenvalues,
norms) comes from `r x r` products, so a 50k vocabulary costs a few small
decompositions, never a V x V matrix. `.full()` forms the product for
small cases and for tests.

How, with a = Qa Ra and b^T = Qb Rb (reduced QR, Qa and Qb with
orthonormal columns): a b = Qa (Ra Rb^T) Qb^T, so the singular values of
a b are those of the small core Ra Rb^T, and its singular vectors those
of the core mapped through Qa and Qb. The nonzero eigenvalues of a b
(square) are those of b a `[r, r]`; its squared Frobenius norm is
tr((a^T a)(b b^T)).

Names follow TransformerLens's `FactoredMatrix` (`A`, `B`, `AB`, `BA`,
`T`, `svd`, `S`, `U`, `Vh`, `eigenvalues`, `norm`, `ldim`, `rdim`,
`mdim`, `get_corner`); see docs/weights_and_lens.md for where it differs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mha_jax.core import precision

mm = precision.matmul  # every product here at the library's precision


def _check_pair(a, b):
  """Both factors as arrays of rank >= 2 with matching inner widths."""
  a, b = jnp.asarray(a), jnp.asarray(b)
  for name, x in (("a", a), ("b", b)):
    if x.ndim < 2:
      raise ValueError(f"Factored: `{name}` must have rank >= 2 ([..., m, r]"
                       f" and [..., r, n]), got shape {list(x.shape)}")
  if a.shape[-1] != b.shape[-2]:
    raise ValueError(f"Factored: the inner widths differ: `a` is "
                     f"{list(a.shape)} ([..., m, r]) and `b` is "
                     f"{list(b.shape)} ([..., r, n]); a.shape[-1] must equal "
                     f"b.shape[-2]")
  try:
    jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
  except ValueError:
    raise ValueError(f"Factored: the leading axes of `a` {list(a.shape)} and "
                     f"`b` {list(b.shape)} do not broadcast") from None
  return a, b


@jax.tree_util.register_pytree_node_class
class Factored:
  """The matrix `a @ b` `[..., m, n]` from `a [..., m, r]` and `b [..., r,
  n]`, never formed unless asked (`.full()`, `.AB`).

  A pytree (the two factors are its leaves), so it passes through
  `jax.jit`, `jax.vmap` and `jax.tree.map`. Leading axes index like an
  array's: `qk[layer, head]` is one head's circuit.
  """

  # NumPy arrays then leave `array @ Factored` to `__rmatmul__` instead
  # of turning the object into an array.
  __array_ufunc__ = None

  def __init__(self, a, b):
    self.A, self.B = _check_pair(a, b)

  # -- pytree --------------------------------------------------------------

  def tree_flatten(self):
    return (self.A, self.B), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    del aux
    obj = object.__new__(cls)  # no checks: leaves may be tracers or None
    obj.A, obj.B = children
    return obj

  # -- shape ---------------------------------------------------------------

  @property
  def ldim(self) -> int:
    """m, the rows."""
    return self.A.shape[-2]

  @property
  def rdim(self) -> int:
    """n, the columns."""
    return self.B.shape[-1]

  @property
  def mdim(self) -> int:
    """r, the inner width (an upper bound on the rank)."""
    return self.A.shape[-1]

  @property
  def shape(self) -> tuple[int, ...]:
    """`(..., m, n)`, the product's shape."""
    lead = jnp.broadcast_shapes(self.A.shape[:-2], self.B.shape[:-2])
    return tuple(lead) + (self.ldim, self.rdim)

  @property
  def ndim(self) -> int:
    return len(self.shape)

  def __repr__(self):
    return (f"Factored(shape={list(self.shape)}, mdim={self.mdim}, "
            f"dtype={jnp.result_type(self.A, self.B)})")

  # -- products ------------------------------------------------------------

  def full(self) -> jax.Array:
    """`a @ b` `[..., m, n]`: forms the matrix (small cases only)."""
    return mm(self.A, self.B)

  @property
  def AB(self) -> jax.Array:  # noqa: N802 (TransformerLens's name)
    """The product `[..., m, n]` (as `.full()`)."""
    return self.full()

  @property
  def BA(self) -> jax.Array:  # noqa: N802
    """`b @ a` `[..., r, r]` (square products only): same nonzero
    eigenvalues as `a @ b`."""
    self._check_square("BA")
    return mm(self.B, self.A)

  @property
  def T(self) -> Factored:  # noqa: N802
    """The transpose `b^T a^T` `[..., n, m]`, still factored."""
    return Factored(jnp.swapaxes(self.B, -1, -2), jnp.swapaxes(self.A, -1, -2))

  def __matmul__(self, other):
    """`self @ other`: a `Factored` (the other side's factors joined) for
    an array or a `Factored` on the right."""
    if isinstance(other, Factored):
      if self.rdim != other.ldim:
        raise ValueError(f"Factored @ Factored: {list(self.shape)} @ "
                         f"{list(other.shape)}: columns {self.rdim} != rows "
                         f"{other.ldim}")
      # Keep the smaller inner width in the middle.
      if self.mdim <= other.mdim:
        return Factored(self.A, mm(mm(self.B, other.A), other.B))
      return Factored(mm(self.A, mm(self.B, other.A)), other.B)
    other = jnp.asarray(other)
    if other.ndim < 2 or other.shape[-2] != self.rdim:
      raise ValueError(f"Factored @ array: `other` must be [..., {self.rdim}, "
                       f"k], got shape {list(other.shape)}")
    return Factored(self.A, mm(self.B, other))

  def __rmatmul__(self, other):
    """`other @ self` for an array `other [..., k, m]`."""
    other = jnp.asarray(other)
    if other.ndim < 2 or other.shape[-1] != self.ldim:
      raise ValueError(f"array @ Factored: `other` must be [..., k, "
                       f"{self.ldim}], got shape {list(other.shape)}")
    return Factored(mm(other, self.A), self.B)

  def __mul__(self, scalar):
    """Times a scalar (or an array broadcasting against the leading axes,
    `[..., 1, 1]`), applied to `a`."""
    return Factored(self.A * scalar, self.B)

  __rmul__ = __mul__

  def __getitem__(self, index) -> Factored:
    """Index the leading axes (`qk[1, 3]`: layer 1, head 3). The last two
    axes are the matrix's and cannot be indexed here (use `.full()`)."""
    lead = self.shape[:-2]
    index = index if isinstance(index, tuple) else (index,)
    if any(i is Ellipsis for i in index) or len(index) > len(lead):
      raise IndexError(f"Factored[...]: index {index} must pick leading axes "
                       f"only (of {list(lead)}), without `...`; the matrix "
                       f"axes [m, n]=[{self.ldim}, {self.rdim}] stay whole")
    a = jnp.broadcast_to(self.A, tuple(lead) + self.A.shape[-2:])
    b = jnp.broadcast_to(self.B, tuple(lead) + self.B.shape[-2:])
    return Factored(a[index], b[index])

  # -- decompositions ------------------------------------------------------

  def svd(self) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The compact SVD `(U [..., m, k], S [..., k], Vh [..., k, n])`, k =
    min(m, r, n), with `U diag(S) Vh = a @ b` and S descending, through
    the k x k core (module docstring)."""
    qa, ra = jnp.linalg.qr(self.A)  # [.., m, p], [.., p, r], p = min(m, r)
    qb, rb = jnp.linalg.qr(jnp.swapaxes(self.B, -1, -2))  # [.., n, s]
    core = mm(ra, jnp.swapaxes(rb, -1, -2))  # [.., p, s]
    u, s, vh = jnp.linalg.svd(core, full_matrices=False)
    return mm(qa, u), s, mm(vh, jnp.swapaxes(qb, -1, -2))

  @property
  def S(self) -> jax.Array:  # noqa: N802
    """Singular values `[..., k]`, descending (k = min(m, r, n))."""
    return self.svd()[1]

  @property
  def U(self) -> jax.Array:  # noqa: N802
    """Left singular vectors `[..., m, k]`."""
    return self.svd()[0]

  @property
  def Vh(self) -> jax.Array:  # noqa: N802
    """Right singular vectors, as rows `[..., k, n]`."""
    return self.svd()[2]

  @property
  def eigenvalues(self) -> jax.Array:
    """The r eigenvalues of `b @ a` `[..., r]` (complex): the nonzero
    eigenvalues of `a @ b` and, when r < m, zeros (the other m - r
    eigenvalues of `a @ b` are zero too). Square products only."""
    return jnp.linalg.eigvals(self.BA)

  def norm(self) -> jax.Array:
    """Frobenius norm `[...]`: sqrt(tr((a^T a)(b b^T))), r x r products."""
    ata = mm(jnp.swapaxes(self.A, -1, -2), self.A)  # [..., r, r]
    bbt = mm(self.B, jnp.swapaxes(self.B, -1, -2))  # [..., r, r]
    sq = jnp.sum(ata * bbt, axis=(-2, -1))  # tr(X Y) for symmetric X, Y
    return jnp.sqrt(jnp.maximum(sq, 0.0))

  def get_corner(self, k: int = 3) -> jax.Array:
    """The top-left `[..., k, k]` block of the product (a peek that forms
    only k x k entries)."""
    return mm(self.A[..., :k, :], self.B[..., :, :k])

  def _check_square(self, what):
    if self.ldim != self.rdim:
      raise ValueError(f"Factored.{what}: needs a square product, got "
                       f"[m, n]=[{self.ldim}, {self.rdim}]")
