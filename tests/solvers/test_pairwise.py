"""Tests of fedjax_dro.solvers.pairwise: projection onto {||theta_i - theta_j||^2 <= r_ij}.

Oracle: CVXPY (``cp.sum_squares(T[i] - T[j]) <= r_ij``, vectorised over the edges) solved by
CLARABEL with tight tolerances on random instances that mix active, inactive (``r = inf``) and
equality (``r = 0``) constraints. Every method must match the oracle objective to 1e-5 (relative)
and return an exactly feasible point (checked with explicit row differences). The default run
uses 20 instances on two shapes (so that each solver compiles once or twice); 30 more instances
with n up to 30 and d up to 200 run under ``-m slow``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

cp = pytest.importorskip("cvxpy")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

from fedjax_dro.solvers import pairwise  # noqa: E402
from fedjax_dro.solvers.pairwise import (  # noqa: E402
  admm as pw_admm,  # noqa: E402
  dykstra as pw_dykstra,  # noqa: E402
  pairwise_kkt_residuals,
  problem as pw_problem,  # noqa: E402
  project_pairwise,
  shrink_to_feasible,
)


# ----------------------------------------------------------------------------------------------
# Instances and the CVXPY oracle
# ----------------------------------------------------------------------------------------------
def make_instance(seed, n, d, *, frac_inf=0.15, zero_degree=0.3, tightness=0.25):
  """Clustered client models z and radii r = t D from a noisy latent geometry.

  About ``frac_inf`` of the pairs are unconstrained (r = inf) and each client has on average
  ``zero_degree`` equality partners (r = 0); ``tightness`` sets t relative to the data so that
  part of the finite constraints are active and part inactive.
  """
  rng = np.random.default_rng(seed)
  groups = rng.integers(0, 3, size=n)
  z = 2.0 * rng.normal(size=(3, d))[groups] + rng.normal(size=(n, d))
  p = 2.0 * rng.normal(size=(3, 2))[groups] + rng.normal(size=(n, 2))
  dis = ((p[:, None] - p[None]) ** 2).sum(-1) * rng.uniform(0.7, 1.3, size=(n, n))
  dis = np.minimum(dis, dis.T)
  zd2 = ((z[:, None] - z[None]) ** 2).sum(-1)
  iu = np.triu_indices(n, 1)
  r = tightness * np.median(zd2[iu]) / np.median(dis[iu]) * dis
  inf_mask = np.triu(rng.uniform(size=(n, n)) < frac_inf, 1)
  zero_mask = np.triu(rng.uniform(size=(n, n)) < zero_degree / max(n - 1, 1), 1)
  r[inf_mask | inf_mask.T] = np.inf
  r[zero_mask | zero_mask.T] = 0.0
  np.fill_diagonal(r, 0.0)
  return z, r


@functools.lru_cache(maxsize=None)
def cvxpy_solution(seed, n, d):
  z, r = make_instance(seed, n, d)
  i, j = np.triu_indices(n, 1)
  keep = np.isfinite(r[i, j])
  i, j = i[keep], j[keep]
  inc = np.zeros((len(i), n))
  inc[np.arange(len(i)), i] = 1.0
  inc[np.arange(len(i)), j] = -1.0
  zero = r[i, j] == 0
  T = cp.Variable((n, d))
  # sum_squares(T[i] - T[j]) <= r_ij, vectorised over the edges; the r = 0 pairs are written
  # as the (identical) equalities T[i] == T[j]: CLARABEL reports the degenerate zero-radius
  # cones as "optimal_inaccurate" with ~1e-6 relative objective error.
  constraints = [cp.sum(cp.square(inc[~zero] @ T), axis=1) <= r[i, j][~zero]]
  if zero.any():
    constraints.append(inc[zero] @ T == 0)
  prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(T - z)), constraints)
  prob.solve(
    solver=cp.CLARABEL,
    tol_gap_abs=1e-10,
    tol_gap_rel=1e-10,
    tol_feas=1e-10,
    tol_ktratio=1e-9,
    max_iter=500,
  )
  assert prob.status == "optimal", prob.status
  return float(prob.value)


def objective(theta, z):
  return 0.5 * float(np.sum((np.asarray(theta, np.float64) - z) ** 2))


def assert_feasible(theta, r, rtol=1e-9):
  """Exact check with explicit differences: r = 0 pairs coincide, others within rtol."""
  theta = np.asarray(theta, np.float64)
  d2 = ((theta[:, None] - theta[None]) ** 2).sum(-1)
  n = theta.shape[0]
  off = ~np.eye(n, dtype=bool)
  zero = off & (r == 0)
  assert np.all(d2[zero] == 0.0), "pairs with r = 0 must coincide exactly"
  pos = off & np.isfinite(r) & (r > 0)
  if pos.any():
    worst = np.max((d2[pos] - r[pos]) / r[pos])
    assert worst <= rtol, f"max relative violation {worst}"


FAST_CASES = (
  [("dual", 10, 5, s) for s in range(4)]
  + [("dual", 12, 40, s) for s in range(4)]  # d > n: Gram-space iteration
  + [("admm", 10, 5, s) for s in range(6)]
  + [("dykstra", 10, 5, s) for s in range(6)]
)
# The acceptance grid: 56 further instances (n up to 30, d up to 200, with inactive, r = inf and
# r = 0 constraints), each solved by *all three* methods and compared with CLARABEL.
SLOW_SHAPES = [(10, 5), (12, 40), (20, 15), (25, 15), (24, 30), (30, 40), (16, 100), (30, 200)]
SLOW_SEEDS = range(10, 17)
SLOW_CASES = [
  (method, n, d, seed)
  for (n, d) in SLOW_SHAPES
  for seed in SLOW_SEEDS
  for method in ("dual", "admm", "dykstra")
]
TOL = {"dual": 1e-9, "admm": 1e-9, "dykstra": 1e-7}
KKT_TOL = {"dual": 1e-6, "admm": 1e-5, "dykstra": 1e-5}


def check_against_cvxpy(method, n, d, seed):
  z, r = make_instance(seed, n, d)
  ref = cvxpy_solution(seed, n, d)
  out = project_pairwise(z, r, method=method, tol=TOL[method])
  theta = np.asarray(out.theta)
  assert theta.shape == z.shape and theta.dtype == z.dtype
  assert bool(out.converged), (method, int(out.iterations), float(out.dual_residual))
  assert_feasible(theta, r)
  f = objective(theta, z)
  rel = (f - ref) / ref
  assert -1e-7 <= rel <= 1e-5, (method, f, ref, rel)
  a = float(out.restoration_scale)
  assert 0.0 < a <= 1.0
  assert np.isfinite(float(out.primal_residual)) and float(out.primal_residual) >= 0.0
  kkt = pairwise_kkt_residuals(theta, z, r, out.multipliers)
  assert float(kkt.primal_infeasibility) <= 1e-9 * np.max(r[np.isfinite(r)])
  assert float(kkt.dual_infeasibility) == 0.0
  assert float(kkt.stationarity) <= KKT_TOL[method], kkt
  assert float(kkt.complementarity) <= KKT_TOL[method], kkt


@pytest.mark.parametrize("method,n,d,seed", FAST_CASES)
def test_matches_cvxpy(method, n, d, seed):
  check_against_cvxpy(method, n, d, seed)


@pytest.mark.slow
@pytest.mark.parametrize("method,n,d,seed", SLOW_CASES)
def test_matches_cvxpy_large(method, n, d, seed):
  check_against_cvxpy(method, n, d, seed)


def test_acceptance_grid_has_50_instances_for_every_method():
  for method in ("dual", "admm", "dykstra"):
    instances = {(n, d, seed) for m, n, d, seed in FAST_CASES + SLOW_CASES if m == method}
    assert len(instances) >= 50, (method, len(instances))
  assert max(n for _, n, _, _ in SLOW_CASES) == 30 and max(d for *_, d, _ in SLOW_CASES) == 200


def test_instances_exercise_all_constraint_kinds():
  """The random instances really mix active, inactive, r = inf and r = 0 constraints."""
  kinds = np.zeros(4, int)
  for seed in range(4):
    z, r = make_instance(seed, 10, 5)
    out = project_pairwise(z, r, tol=1e-9)
    theta = np.asarray(out.theta)
    d2 = ((theta[:, None] - theta[None]) ** 2).sum(-1)
    iu = np.triu_indices(10, 1)
    rr, dd = r[iu], d2[iu]
    pos = np.isfinite(rr) & (rr > 0)
    kinds += [
      np.sum(pos & (dd > rr * (1 - 1e-6))),
      np.sum(pos & (dd < 0.9 * rr)),
      np.sum(np.isinf(rr)),
      np.sum(rr == 0),
    ]
  assert np.all(kinds > 0), kinds


# ----------------------------------------------------------------------------------------------
# Special structure
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["dual", "admm", "dykstra"])
def test_all_zero_radii_give_the_average(method):
  z, _ = make_instance(0, 10, 5)
  out = project_pairwise(z, np.zeros((10, 10)), method=method)
  np.testing.assert_allclose(
    np.asarray(out.theta), np.broadcast_to(z.mean(0), z.shape), rtol=1e-12, atol=1e-12
  )
  assert_feasible(out.theta, np.zeros((10, 10)))


def test_infinite_radii_return_input():
  z, _ = make_instance(1, 10, 5)
  r = np.full((10, 10), np.inf)
  out = project_pairwise(z, r)
  assert np.array_equal(np.asarray(out.theta), z)
  assert int(out.iterations) == 0 and float(out.restoration_scale) == 1.0


def test_dual_reports_exact_multipliers_and_gap():
  """For the dual method stationarity holds by construction and the gap certifies the value."""
  z, r = make_instance(2, 10, 5)
  out = project_pairwise(z, r, tol=1e-9)
  f = objective(out.theta, z)
  ref = cvxpy_solution(2, 10, 5)
  # certified: f - f* <= gap * f
  assert f - ref <= float(out.dual_residual) * f + 1e-9 * ref
  mu = np.asarray(out.multipliers)
  assert np.all(mu >= 0) and np.allclose(mu, mu.T)
  assert np.all(mu[~np.isfinite(r)] == 0) and np.all(mu[r == 0] == 0)


def test_restore_feasibility_false_returns_raw_iterate():
  z, r = make_instance(3, 10, 5)
  raw = project_pairwise(z, r, method="dykstra", tol=1e-5, restore_feasibility=False)
  fixed = project_pairwise(z, r, method="dykstra", tol=1e-5)
  assert float(raw.primal_residual) > 0 and float(raw.restoration_scale) < 1
  assert float(raw.restoration_scale) == float(fixed.restoration_scale)
  assert_feasible(fixed.theta, r)
  with pytest.raises(AssertionError):
    assert_feasible(raw.theta, r)


def test_shrink_to_feasible_scales_all_differences():
  rng = np.random.default_rng(0)
  _, r = make_instance(4, 10, 5)
  r = np.where(r == 0, 1.0, r)  # no equality pairs: rows are not averaged
  np.fill_diagonal(r, 0.0)
  theta = rng.normal(size=(10, 5)) * 5
  out, a = shrink_to_feasible(theta, r)
  a = float(a)
  assert 0 < a < 1
  assert_feasible(out, r)
  out = np.asarray(out)
  np.testing.assert_allclose(out - out.mean(0), a * (theta - theta.mean(0)), atol=1e-12)
  np.testing.assert_allclose(out.mean(0), theta.mean(0), atol=1e-12)


def _components(r):
  rs = pw_problem.sanitize_r(jnp.asarray(r))
  labels = pw_problem.zero_components(rs)
  counts = jax.ops.segment_sum(jnp.ones(r.shape[0]), labels, num_segments=r.shape[0])
  return labels, counts


def test_zero_components_of_a_chain():
  n = 7
  r = np.full((n, n), 5.0)
  for a, b in [(0, 3), (3, 5), (5, 6), (1, 2)]:
    r[a, b] = r[b, a] = 0.0
  labels, counts = _components(r)
  assert list(np.asarray(labels)) == [0, 1, 1, 0, 4, 0, 0]
  assert list(np.asarray(counts)) == [4, 2, 0, 0, 1, 0, 0]


# ----------------------------------------------------------------------------------------------
# Properties (hypothesis), one shape so that each solver compiles once
# ----------------------------------------------------------------------------------------------
N, D = 10, 5
_coord = st.floats(-10, 10, allow_nan=False, allow_infinity=False, allow_subnormal=False)
_points = hnp.arrays(np.float64, (N, D), elements=_coord)


def _sym(mask):
  upper = np.triu(mask, 1)
  return upper | upper.T


@st.composite
def _radii(draw):
  vals = draw(hnp.arrays(np.float64, (N, N), elements=st.floats(1e-2, 60.0)))
  r = np.minimum(vals, vals.T)
  zero = _sym(draw(hnp.arrays(np.float64, (N, N), elements=st.floats(0, 1))) < 0.04)
  inf = _sym(draw(hnp.arrays(np.float64, (N, N), elements=st.floats(0, 1))) < 0.2)
  r[inf] = np.inf
  r[zero] = 0.0
  np.fill_diagonal(r, 0.0)
  return r


@settings(max_examples=25, deadline=None)
@given(z=_points, slack=st.floats(0.0, 2.0), inf_frac=st.floats(0.0, 0.5), seed=st.integers(0, 9))
def test_feasible_input_is_returned_unchanged(z, slack, inf_frac, seed):
  d2 = ((z[:, None] - z[None]) ** 2).sum(-1)
  r = d2 * (1.0 + slack) + 1e-9 * (1.0 + np.max(z * z))
  same = np.all(z[:, None] == z[None], axis=-1)
  r[same] = 0.0  # coincident rows may use r = 0
  inf = _sym(np.random.default_rng(seed).uniform(size=(N, N)) < inf_frac)
  r[inf] = np.inf
  out = project_pairwise(z, r)
  assert np.array_equal(np.asarray(out.theta), z)
  assert int(out.iterations) == 0 and bool(out.converged)


@settings(max_examples=20, deadline=None)
@given(z=_points, r=_radii())
def test_projection_is_idempotent(z, r):
  first = project_pairwise(z, r, tol=1e-10)
  assert_feasible(first.theta, r)
  second = project_pairwise(first.theta, r, tol=1e-10)
  scale = 1.0 + np.max(np.abs(z))
  np.testing.assert_allclose(
    np.asarray(second.theta), np.asarray(first.theta), rtol=0, atol=1e-9 * scale
  )


def _suboptimality_radius(out, z):
  """Certified ||P~(z) - P(z)|| <= sqrt(2 (f(P~) - f*)) <= sqrt(2 gap f(P~)) (dual method)."""
  f = objective(out.theta, z)
  return np.sqrt(2.0 * float(out.dual_residual) * f)


@settings(max_examples=25, deadline=None)
@given(a=_points, b=_points, r=_radii())
def test_projection_is_nonexpansive(a, b, r):
  pa = project_pairwise(a, r, tol=1e-11)
  pb = project_pairwise(b, r, tol=1e-11)
  lhs = np.linalg.norm(np.asarray(pa.theta) - np.asarray(pb.theta))
  slack = _suboptimality_radius(pa, a) + _suboptimality_radius(pb, b)
  assert lhs <= np.linalg.norm(a - b) + slack + 1e-9 * (1 + np.abs(a).max() + np.abs(b).max())


# ----------------------------------------------------------------------------------------------
# Pytrees, jit, vmap, warm start
# ----------------------------------------------------------------------------------------------
def test_pytree_input_matches_flat_rows():
  z, r = make_instance(5, 10, 5)
  tree = {"w": jnp.asarray(z[:, :4].reshape(10, 2, 2)), "b": (jnp.asarray(z[:, 4]),)}
  out = project_pairwise(tree, r, tol=1e-9)
  flat = project_pairwise(z, r, tol=1e-9)
  assert jax.tree.structure(out.theta) == jax.tree.structure(tree)
  assert out.theta["w"].shape == (10, 2, 2) and out.theta["b"][0].shape == (10,)
  rows = np.concatenate(
    [np.asarray(out.theta["w"]).reshape(10, 4), np.asarray(out.theta["b"][0])[:, None]], axis=1
  )
  np.testing.assert_allclose(rows, np.asarray(flat.theta), rtol=1e-12, atol=1e-12)


def test_works_under_jit():
  z, r = make_instance(0, 10, 5)
  f = jax.jit(lambda z, t: project_pairwise(z, t * r, method="dykstra", tol=1e-9).theta)
  eager = project_pairwise(z, r, method="dykstra", tol=1e-9).theta
  np.testing.assert_allclose(
    np.asarray(f(jnp.asarray(z), 1.0)), np.asarray(eager), rtol=1e-10, atol=1e-10
  )


@pytest.mark.slow
def test_vmap_over_radius_scale():
  z, r = make_instance(0, 10, 5)
  ts = jnp.asarray([0.5, 1.0, 2.0])
  batched = jax.vmap(lambda t: project_pairwise(jnp.asarray(z), t * r, tol=1e-9).theta)(ts)
  for k, t in enumerate(np.asarray(ts)):
    single = project_pairwise(z, t * r, tol=1e-9).theta
    np.testing.assert_allclose(np.asarray(batched[k]), np.asarray(single), rtol=1e-7, atol=1e-7)


@pytest.mark.slow
def test_warm_start_converges_faster():
  z, r = make_instance(6, 20, 15)
  cold = project_pairwise(z, r, tol=1e-9)
  rng = np.random.default_rng(0)
  z2 = z + 1e-3 * rng.normal(size=z.shape)
  warm = project_pairwise(z2, r, tol=1e-9, initial_multipliers=cold.multipliers)
  cold2 = project_pairwise(z2, r, tol=1e-9)
  assert bool(warm.converged)
  assert int(warm.iterations) < int(cold2.iterations)
  np.testing.assert_allclose(np.asarray(warm.theta), np.asarray(cold2.theta), atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["dual", "admm", "dykstra"])
def test_float32_input(method):
  z, r = make_instance(0, 10, 5)
  out = project_pairwise(z.astype(np.float32), r.astype(np.float32), method=method, tol=1e-5)
  assert out.theta.dtype == jnp.float32
  assert_feasible(np.asarray(out.theta, np.float64), r, rtol=1e-5)
  rel = (objective(out.theta, z) - cvxpy_solution(0, 10, 5)) / cvxpy_solution(0, 10, 5)
  assert abs(rel) < 1e-3


def test_tolerance_below_float32_precision_is_floored_not_chased():
  """A float32 input with tol = 1e-12 stops at the 64-ulp floor (~7.6e-6) and says converged,
  instead of running to the iteration cap."""
  z, r = make_instance(0, 10, 5)
  out = project_pairwise(z.astype(np.float32), r.astype(np.float32), tol=1e-12)
  assert bool(out.converged) and int(out.iterations) < 200
  assert float(out.dual_residual) <= 64 * np.finfo(np.float32).eps
  rel = (objective(out.theta, z) - cvxpy_solution(0, 10, 5)) / cvxpy_solution(0, 10, 5)
  assert abs(rel) < 1e-4


@pytest.mark.slow
def test_raw_solvers_agree():
  z, r = make_instance(7, 12, 40)
  sols = [
    pairwise.solve_dual(z, r, tol=1e-10),
    pairwise.solve_admm(z, r, tol=1e-10),
    pairwise.solve_dykstra(z, r, tol=1e-10),
  ]
  for s in sols:
    assert bool(s.converged)
  for s in sols[1:]:
    np.testing.assert_allclose(np.asarray(s.theta), np.asarray(sols[0].theta), atol=1e-4)


def _textbook_admm(z, r, iterations, balance_every=10):
  """Plain NumPy scaled ADMM with (Theta, V, U) state (Boyd et al. 2011, 3.1.1 and 3.4.1)."""
  n, d = z.shape
  zc = z - z.mean(0)
  i, j = np.triu_indices(n, 1)
  rad = np.sqrt(r[i, j])

  def ball(v):
    nrm = np.linalg.norm(v, axis=1)
    return v * np.where(nrm > rad, rad / np.where(nrm > 0, nrm, 1.0), 1.0)[:, None]

  def dt(w):
    out = np.zeros((n, d))
    np.add.at(out, i, w)
    np.add.at(out, j, -w)
    return out

  beta = 1.0 / n
  theta, v, u = zc.copy(), ball(zc[i] - zc[j]), np.zeros((len(i), d))
  for it in range(1, iterations + 1):
    rhs = zc + beta * dt(v - u)
    theta = np.linalg.solve(np.eye(n) + beta * (n * np.eye(n) - np.ones((n, n))), rhs)
    dth = theta[i] - theta[j]
    v_new = ball(dth + u)
    u = u + dth - v_new
    pri = np.linalg.norm(dth - v_new) / max(np.linalg.norm(dth), np.linalg.norm(v_new))
    dual = beta * np.linalg.norm(dt(v_new - v)) / (beta * np.linalg.norm(dt(u)))
    v = v_new
    if it % balance_every == 0 and pri > 10 * dual:
      beta, u = 2 * beta, u / 2
    elif it % balance_every == 0 and dual > 10 * pri:
      beta, u = beta / 2, u * 2
  return theta + z.mean(0)


@pytest.mark.parametrize("d", [4, 15])  # d > n: the row-space reduction is used
def test_admm_matches_textbook_iterates(d):
  """The one-edge-array ADMM (and its row-space reduction for d > n) reproduces the textbook
  iteration: same iterate after a fixed number of steps, including residual balancing."""
  rng = np.random.default_rng(3)
  n = 7
  z = rng.normal(size=(n, d))
  r = 0.3 * np.abs(rng.normal(size=(n, n))) * np.median(np.sum((z[:, None] - z[None]) ** 2, -1))
  r = np.minimum(r, r.T)
  r[0, 1] = r[1, 0] = np.inf
  for iters in (1, 9, 35):
    out = pairwise.solve_admm(z, r, tol=1e-300, max_iterations=iters)
    assert int(out.iterations) == iters
    np.testing.assert_allclose(
      np.asarray(out.theta), _textbook_admm(z, r, iters), rtol=0, atol=1e-10
    )


def test_row_space_reduction_gives_the_same_iterates():
  """For d > n, Dykstra / ADMM on the QR coordinates Y (Z_c = Y Q^T) mapped back equal the
  solver run on Z itself, iterate for iterate."""
  z, r = make_instance(2, 8, 30)
  prep = pw_problem.prepare(jnp.asarray(z), jnp.asarray(r))
  for solver in (
    lambda p: pw_admm.run_admm(p, 1e-300, 25),
    lambda p: pw_dykstra.run_dykstra(p, 1e-300, 25),
  ):
    full = solver(prep)
    reduced = pw_problem.solve_reduced(solver, prep)
    np.testing.assert_allclose(
      np.asarray(reduced.theta), np.asarray(full.theta), rtol=0, atol=1e-11
    )
    np.testing.assert_allclose(
      np.asarray(reduced.multipliers), np.asarray(full.multipliers), rtol=1e-9, atol=1e-12
    )


# ----------------------------------------------------------------------------------------------
# Input validation: every bad input raises and names the argument
# ----------------------------------------------------------------------------------------------
def _good():
  z, r = make_instance(0, 4, 3)
  return z, r


@pytest.mark.parametrize(
  "make_bad,exc,name",
  [
    (lambda z, r: (z, r[:3]), ValueError, "r"),  # not square
    (lambda z, r: (z, np.ones((5, 5))), ValueError, "r"),  # wrong size
    (lambda z, r: (z, np.ones((4, 4, 1))), ValueError, "r"),  # not a matrix
    (lambda z, r: (z, r + np.triu(np.ones((4, 4)), 1)), ValueError, "r"),  # not symmetric
    (lambda z, r: (z, -np.ones((4, 4))), ValueError, "r"),  # negative
    (lambda z, r: (z, np.where(np.eye(4) > 0, 0.0, np.nan)), ValueError, "r"),  # NaN
    (lambda z, r: (z, "ones"), TypeError, "r"),  # not numeric
    (lambda z, r: ({"a": z, "b": z[:3]}, r), ValueError, "z"),  # client axes differ
    (lambda z, r: ({}, r), ValueError, "z"),  # no leaves
    (lambda z, r: ({"a": z, "s": np.float64(1.0)}, r), ValueError, "z"),  # scalar leaf
    (lambda z, r: (np.array([["a"] * 3] * 4), r), TypeError, "z"),  # strings
    (lambda z, r: (z.astype(np.complex128), r), TypeError, "z"),  # complex
  ],
)
def test_bad_arrays_raise_naming_the_argument(make_bad, exc, name):
  z, r = make_bad(*_good())
  with pytest.raises(exc, match=f"`{name}`"):
    project_pairwise(z, r)


@pytest.mark.parametrize(
  "kwargs,exc,name",
  [
    ({"method": "newton"}, ValueError, "method"),
    ({"method": 3}, ValueError, "method"),
    ({"tol": 0.0}, ValueError, "tol"),
    ({"tol": -1e-3}, ValueError, "tol"),
    ({"tol": float("nan")}, ValueError, "tol"),
    ({"tol": np.ones(2)}, ValueError, "tol"),
    ({"max_iterations": 0}, ValueError, "max_iterations"),
    ({"max_iterations": 2.5}, ValueError, "max_iterations"),
    ({"max_iterations": True}, ValueError, "max_iterations"),
    ({"restore_feasibility": "yes"}, TypeError, "restore_feasibility"),
    ({"initial_multipliers": np.ones((3, 3))}, ValueError, "initial_multipliers"),
    ({"initial_multipliers": -np.ones((4, 4))}, ValueError, "initial_multipliers"),
    ({"initial_multipliers": np.ones((4, 4)), "method": "admm"}, ValueError, "initial_multipliers"),
  ],
)
def test_bad_options_raise_naming_the_argument(kwargs, exc, name):
  z, r = _good()
  with pytest.raises(exc, match=f"`{name}`"):
    project_pairwise(z, r, **kwargs)


def test_kkt_helper_validates_shapes():
  z, r = _good()
  with pytest.raises(ValueError, match="`theta`"):
    pairwise_kkt_residuals(z[:, :2], z, r, np.zeros((4, 4)))
  with pytest.raises(ValueError, match="`initial_multipliers` / `mu`"):
    pairwise_kkt_residuals(z, z, r, np.zeros((3, 3)))


def test_compile_projection_equals_project_pairwise_and_reports_compile_time():
  rng = np.random.default_rng(3)
  z = rng.normal(size=(7, 5))
  r = np.full((7, 7), 0.5)
  for method in pairwise.METHODS:
    direct = pairwise.project_pairwise(z, r, method=method, tol=1e-9)
    compiled = pairwise.compile_projection(z, r, method=method, tol=1e-9)
    assert compiled.compile_time > 0
    out = compiled(jnp.asarray(z), jnp.asarray(r))
    np.testing.assert_array_equal(np.asarray(out.theta), np.asarray(direct.theta))
    assert int(out.iterations) == int(direct.iterations)
    tree = {"a": jnp.asarray(z[:, :2]), "b": jnp.asarray(z[:, 2:])}
    out_tree = pairwise.compile_projection(tree, r, method=method, tol=1e-9)(tree, r)
    np.testing.assert_allclose(
      np.concatenate([out_tree.theta["a"], out_tree.theta["b"]], 1), direct.theta, atol=1e-12
    )
  with pytest.raises(ValueError, match="method"):
    pairwise.compile_projection(z, r, method="newton")
