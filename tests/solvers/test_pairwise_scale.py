"""The pairwise projection over wide ranges of scale and on hard Karula-like instances.

Oracles:

* closed form: with ``r = a ||z_i - z_j||^2`` every constraint is active for ``a < 1`` and the
  projection is ``mean(z) + sqrt(a) (z - mean(z))``; for ``a >= 1`` the input is feasible and is
  its own projection (``instances.all_active``). That covers ``||z||`` from 1e-4 to 1e4 and the
  radii from 1e-6 to 1e6 *independently* (25 combinations, including ``a = 6e-14``).
* CVXPY (CLARABEL) on the mixed instances of ``test_pairwise`` (active, inactive, ``r = inf``
  and ``r = 0`` edges) at the scale where CLARABEL reports "optimal"; the problem is exactly
  homogeneous (``P(s z; s^2 r) = s P(z; r)``), so the oracle of the scaled instance is ``s^2``
  times that objective. ``||z||`` from 1e-4 to 1e4 and three tightness levels: median radius from
  ~1e-12 to ~1e8.
* the hard instances (``instances.separated_groups``: three well separated groups, ``d = 10^4``):
  the certified gap must reach ``tol`` (1e-6 float64, 1e-4 float32), the point must be exactly
  feasible, and its objective (in float64) must be within ``tol`` of a float64 solve at 1e-10.
  n = 100 runs by default; n = 300 and 1000 under ``-m slow``.
"""

import functools

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro.solvers.pairwise import instances, pairwise_sq_distances, project_pairwise

cp = pytest.importorskip("cvxpy")
from tests.solvers.test_pairwise import assert_feasible, make_instance, objective  # noqa: E402

SCALES_Z = (1e-4, 1e-2, 1.0, 1e2, 1e4)  # ||z||_F
SCALES_R = (1e-6, 1e-3, 1.0, 1e3, 1e6)  # median radius


# ----------------------------------------------------------------------------------------------
# Closed form: every constraint active (or none)
# ----------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _unit_all_active():
  z, _, _ = instances.all_active(10, 5, separation=3.0, scale=1.0)
  z = z / np.linalg.norm(z)
  d2 = np.asarray(pairwise_sq_distances(z))
  return z, d2, float(np.median(d2[np.triu_indices(10, 1)]))


@pytest.mark.parametrize("z_norm", SCALES_Z)
@pytest.mark.parametrize("r_median", SCALES_R)
def test_all_active_closed_form_over_scales(z_norm, r_median):
  z1, d21, med = _unit_all_active()
  z, a = z1 * z_norm, r_median / (med * z_norm**2)
  r = a * d21 * z_norm**2
  mean = z.mean(0)
  solution = z if a >= 1 else mean + np.sqrt(a) * (z - mean)
  out = project_pairwise(z, r, tol=1e-9)
  assert bool(out.converged), (int(out.iterations), float(out.dual_residual))
  theta = np.asarray(out.theta)
  assert_feasible(theta, r)
  if a >= 1:
    np.testing.assert_array_equal(theta, z)  # feasible input returned bit for bit
    return
  f, f_star = objective(theta, z), objective(solution, z)
  assert -1e-12 <= (f - f_star) / f_star <= 1e-9, (f, f_star)
  assert float(out.dual_residual) <= 1e-9
  # the point itself, relative to the distance it moved
  assert np.linalg.norm(theta - solution) <= 1e-4 * np.linalg.norm(z - solution)


@pytest.mark.parametrize("dtype,tol", [("float64", 1e-6), ("float32", 1e-4)])
def test_all_active_closed_form_large_d(dtype, tol):
  """n = 100, d = 10^4, three separated groups: the certificate is honest in float32 too."""
  z, r, solution = instances.all_active(100, 10_000)
  out = project_pairwise(jnp.asarray(z, dtype), jnp.asarray(r, dtype), tol=tol)
  assert bool(out.converged)
  gap = float(out.dual_residual)
  theta = np.asarray(out.theta, np.float64)
  f, f_star = objective(theta, z), objective(solution, z)
  rel = (f - f_star) / f_star
  assert rel <= tol, rel
  # the certified gap bounds the true suboptimality up to the working precision's rounding
  # (the certificate is computed in dtype; 256 ulp = 3e-5 in float32). With the Gram matrix
  # eigendecomposition it used before, float32 certified 6.5e-5 at a true error of 2.7e-4.
  assert rel <= gap + 256 * np.finfo(dtype).eps, (rel, gap)


# ----------------------------------------------------------------------------------------------
# CVXPY on mixed instances over scales
# ----------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _mixed(tightness):
  z, r = make_instance(3, 10, 5)
  r = r * tightness
  i, j = np.triu_indices(10, 1)
  keep = np.isfinite(r[i, j])
  i, j = i[keep], j[keep]
  inc = np.zeros((len(i), 10))
  inc[np.arange(len(i)), i] = 1.0
  inc[np.arange(len(i)), j] = -1.0
  zero = r[i, j] == 0
  T = cp.Variable(z.shape)
  constraints = [cp.sum(cp.square(inc[~zero] @ T), axis=1) <= r[i, j][~zero]]
  if zero.any():
    constraints.append(inc[zero] @ T == 0)
  prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(T - z)), constraints)
  prob.solve(
    solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10, tol_ktratio=1e-9
  )
  assert prob.status == "optimal", prob.status
  return z, r, float(prob.value)


@pytest.mark.parametrize("z_norm", SCALES_Z)
@pytest.mark.parametrize("tightness", [0.01, 1.0, 30.0])
def test_mixed_instances_match_cvxpy_over_scales(z_norm, tightness):
  z0, r0, value = _mixed(tightness)
  s = z_norm / np.linalg.norm(z0)
  z, r = z0 * s, r0 * s * s
  out = project_pairwise(z, r, tol=1e-9)
  assert bool(out.converged), (int(out.iterations), float(out.dual_residual))
  theta = np.asarray(out.theta)
  assert_feasible(theta, r)
  f, ref = objective(theta, z), value * s * s
  assert -1e-7 <= (f - ref) / ref <= 1e-6, (f, ref)


def test_scale_grid_covers_the_requested_ranges():
  finite = []
  for t in (0.01, 1.0, 30.0):
    z0, r0, _ = _mixed(t)
    for z_norm in SCALES_Z:
      s = z_norm / np.linalg.norm(z0)
      r = r0 * s * s
      finite.append(np.median(r[np.isfinite(r) & (r > 0)]))
  assert min(finite) <= 1e-6 and max(finite) >= 1e6
  assert min(SCALES_Z) <= 1e-4 and max(SCALES_Z) >= 1e4


# ----------------------------------------------------------------------------------------------
# Hard instances: three well separated groups, d = 10^4
# ----------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _separated_reference(n):
  z, r = instances.separated_groups(n, 10_000)
  out = project_pairwise(z, r, tol=1e-10)
  assert bool(out.converged)
  return z, r, objective(np.asarray(out.theta), z)


def check_separated(n, dtype, tol):
  z, r, reference = _separated_reference(n)
  out = project_pairwise(jnp.asarray(z, dtype), jnp.asarray(r, dtype), tol=tol)
  assert bool(out.converged), (int(out.iterations), float(out.dual_residual))
  assert float(out.dual_residual) <= tol
  theta = np.asarray(out.theta, np.float64)
  r32 = np.asarray(jnp.asarray(r, dtype), np.float64)
  # float32 coordinates of size |theta| carry rounding of eps |theta| in distances of size
  # sqrt(r) << |theta| (separated groups), so float32 feasibility holds to ~1e-6, not 4 ulp.
  # Distances from the centred float64 Gram matrix (explicit [n, n, d] differences would need
  # 75 GB at n = 1000); no r = 0 or r = inf edges here.
  d2 = np.asarray(pairwise_sq_distances(theta))
  off = ~np.eye(n, dtype=bool)
  worst = np.max((d2[off] - r32[off]) / r32[off])
  assert worst <= (1e-9 if dtype == "float64" else 1e-5), worst
  rel = (objective(theta, z) - reference) / reference
  assert -1e-9 <= rel <= tol + 1e-10, rel


@pytest.mark.parametrize("dtype,tol", [("float64", 1e-6), ("float32", 1e-4)])
def test_separated_groups_converge(dtype, tol):
  check_separated(100, dtype, tol)


@pytest.mark.slow
@pytest.mark.parametrize("n", [300, 1000])
@pytest.mark.parametrize("dtype,tol", [("float64", 1e-6), ("float32", 1e-4)])
def test_separated_groups_converge_large(n, dtype, tol):
  check_separated(n, dtype, tol)
