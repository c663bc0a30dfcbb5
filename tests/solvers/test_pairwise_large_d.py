"""The dual projection for d > n (neural-network sizes): its program, read from the jaxpr, does
the d-dependent work a fixed number of times (never inside the L-BFGS loop), never builds an
``[n, n, d]`` array nor any ``[n, d]`` intermediate beside the input and the output; and its
result equals the projection computed through the full ``[n, d]`` Householder QR (``method=
"dual"`` on the data's row-space coordinates, mapped back with an explicit ``Q``) and satisfies
every constraint. The streamed QR (:func:`row_space_factor`) is checked against ``Z_c Z_c^T``
over several column blocks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro.solvers.pairwise import pairwise_kkt_residuals, project_pairwise
from fedjax_dro.solvers.pairwise.dual import row_space_block, row_space_factor

N, D = 6, 997  # D prime: no block or reshape of the program has D by accident


def _instance(n=N, d=D, seed=0, zero_pair=False):
  rng = np.random.default_rng(seed)
  groups = rng.integers(0, 3, n)
  z = 5.0 + 2.0 * rng.normal(size=(3, d))[groups] + rng.normal(size=(n, d))
  d2 = np.sum((z[:, None] - z[None]) ** 2, -1)
  a = rng.uniform(0.5, 1.5, (n, n))
  r = 0.3 * np.median(d2[~np.eye(n, dtype=bool)]) * (a + a.T) / 2
  r[~np.isfinite(r)] = 0
  np.fill_diagonal(r, 0.0)
  if zero_pair:
    r[0, 1] = r[1, 0] = 0.0
    r[2, 3] = r[3, 2] = np.inf
  return z, r


def _equations(jaxpr, in_loop=False):
  """``(equation, inside a while loop)`` for every equation, recursively."""
  for eqn in jaxpr.eqns:
    loop = in_loop or eqn.primitive.name == "while"
    yield eqn, in_loop
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else [value]:
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          yield from _equations(inner, loop)


def _shapes(eqn):
  return [tuple(v.aval.shape) for v in list(eqn.invars) + list(eqn.outvars) if hasattr(v, "aval")]


def test_d_dependent_work_is_outside_the_loop_and_no_n_n_d_array():
  z, r = _instance()
  mu = np.zeros((N, N))
  jaxpr = jax.make_jaxpr(lambda z, r, mu: project_pairwise(z, r, tol=1e-8, initial_multipliers=mu))(
    z, r, mu
  ).jaxpr
  eqns = list(_equations(jaxpr))
  assert any(e.primitive.name == "while" for e, _ in eqns)  # the L-BFGS loop is there
  d_work = []
  for eqn, in_loop in eqns:
    shapes = _shapes(eqn)
    touches_d = any(dim >= D for s in shapes for dim in s)
    assert not (in_loop and touches_d), (eqn.primitive.name, shapes)
    for s in shapes:
      size = int(np.prod(s, dtype=np.int64))
      assert not (len(s) >= 3 and D in s and s.count(N) >= 2), s
      assert size <= (N + D) * N, (eqn.primitive.name, s)  # the QR block [n + d, n] at most
    if touches_d and eqn.primitive.name in ("dot_general", "qr"):
      d_work.append((eqn.primitive.name, shapes))
  # O(n^2 d) work: one QR of the centred input (streamed) and one product for the output
  names = sorted(name for name, _ in d_work)
  assert names == ["dot_general", "qr"], d_work


@pytest.mark.parametrize("zero_pair", [False, True])
def test_row_space_path_equals_the_full_qr_projection(zero_pair):
  z, r = _instance(zero_pair=zero_pair)
  out = project_pairwise(z, r, tol=1e-10)
  # the oracle: the same dual on the explicit row-space coordinates (d = n: no row-space path),
  # mapped back with the explicit Q of a Householder QR of the whole centred input
  shift = z.mean(0)
  q, upper = np.linalg.qr((z - shift).T)
  small = project_pairwise(upper.T, r, tol=1e-10)
  expected = np.asarray(small.theta) @ q.T + shift
  theta = np.asarray(out.theta)
  scale = np.sqrt(np.mean((z - shift) ** 2))
  np.testing.assert_allclose(theta, expected, rtol=0, atol=1e-9 * scale)
  np.testing.assert_allclose(np.asarray(out.multipliers), np.asarray(small.multipliers), atol=1e-8)
  assert bool(out.converged) and int(out.iterations) > 0
  d2 = np.sum((theta[:, None] - theta[None]) ** 2, -1)
  off = ~np.eye(N, dtype=bool) & np.isfinite(r)
  assert np.all(d2[off] <= r[off] * (1 + 1e-12) + 1e-12 * scale**2)
  assert np.max(d2[off] / np.where(r[off] > 0, r[off], 1.0)) > 0.999  # active constraints
  kkt = pairwise_kkt_residuals(theta, z, r, out.multipliers)
  assert float(kkt.stationarity) < 1e-6 and float(kkt.complementarity) < 1e-6
  if zero_pair:
    np.testing.assert_array_equal(theta[0], theta[1])


def test_feasible_input_is_returned_bit_for_bit_and_restore_flag():
  z, _ = _instance()
  r = np.full((N, N), 1e9)
  out = project_pairwise(z, r)
  assert int(out.iterations) == 0 and float(out.restoration_scale) == 1.0
  np.testing.assert_array_equal(np.asarray(out.theta), z)
  _, r = _instance()
  raw = project_pairwise(z, r, tol=1e-10, restore_feasibility=False)
  restored = project_pairwise(z, r, tol=1e-10)
  a = float(restored.restoration_scale)
  # the restored point is the raw one shrunk toward its centroid by the reported factor
  raw_t = np.asarray(raw.theta)
  c = raw_t.mean(0)
  np.testing.assert_allclose(np.asarray(restored.theta), c + a * (raw_t - c), atol=1e-9)
  assert a == float(raw.restoration_scale) <= 1.0


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_streamed_qr_over_several_blocks(dtype):
  n = 3
  d = 3 * row_space_block(n, 10**9) + 123  # three full blocks and a remainder
  rng = np.random.default_rng(1)
  z = (10.0 + rng.normal(size=(n, d))).astype(dtype)
  shift = z.mean(0, dtype=np.float64).astype(dtype)
  y = np.asarray(row_space_factor(jnp.asarray(z), jnp.asarray(shift)), np.float64)
  zc = z.astype(np.float64) - shift.astype(np.float64)
  gram = zc @ zc.T
  tol = 1e-12 if dtype == jnp.float64 else 2e-5
  np.testing.assert_allclose(y @ y.T, gram, rtol=0, atol=tol * np.abs(gram).max())


def test_vmap_over_t_equals_separate_calls_and_t_zero_is_the_mean():
  """Karula's sweeps vmap the projection over t: the row-space path under vmap (its conds become
  selects) gives each t's own result; t = 0 is the common mean, huge t returns z unchanged."""
  z, r = _instance(n=5, d=211)
  ts = jnp.asarray([0.0, 0.5, 1e12])
  project = lambda t: project_pairwise(z, t * r, tol=1e-10).theta  # noqa: E731
  batched = jax.vmap(project)(ts)
  for k in range(3):
    np.testing.assert_array_equal(np.asarray(batched[k]), np.asarray(project(ts[k])))
  np.testing.assert_allclose(
    np.asarray(batched[0]), np.broadcast_to(z.mean(0), z.shape), atol=1e-12
  )
  np.testing.assert_array_equal(np.asarray(batched[2]), z)
