"""Karula at the two limits of its constraint level ``t``, against closed forms (ridge, float64).

Karula solves problem (1) of Erickson and Johansson (arXiv:2505.07575)::

    minimize (1/n) sum_i alpha_i f_i(theta_i)   s.t.   ||theta_i - theta_j||^2 <= t D_ij,

with ``alpha_i = n N_i / sum_j N_j`` (``weighting="num_examples"``, the default). Here ``D_ij = 1``
off the diagonal (``dissimilarity="ones"``, no OT), and every client's ``f_i`` is the linear
regression model's ridge loss (``tests/helpers.py``: ``numpy_linreg_grad`` is its gradient)::

    f_i(theta) = mean_{rows of client i} 0.5 (x.w + b - y)^2 + l2/2 (||w||^2 + b^2),

a strictly convex quadratic in ``theta = (w, b)``. With the augmented rows ``x~ = (x, 1)``,
``A_i = X~_i^T X~_i / N_i + l2 I`` and ``r_i = X~_i^T y_i / N_i``, ``grad f_i = A_i theta - r_i``.

1. ``t = 0`` forces ``theta_1 = ... = theta_n = theta``; the problem becomes ``min sum_i alpha_i
   f_i(theta)``, i.e. ``min sum_i N_i f_i(theta) / sum_j N_j`` (the pooled, sample-weighted ridge
   objective), whose unique minimizer solves the normal equations
   ``(sum_i N_i A_i) theta = sum_i N_i r_i``. The uniform-weighted pooled solution
   ``(sum_i A_i) theta = sum_i r_i`` is a different point for clients of unequal sizes: the test
   asserts the two differ by far more than the tolerance, so it would catch ``alpha_i = 1`` (or any
   other wrong weighting).
2. ``t`` large (``1e8``, far above every squared distance between the clients' own ridge
   solutions, which the test asserts) makes every constraint inactive, so the problem separates
   and each ``theta_i`` is client ``i``'s own ridge solution ``A_i theta_i = r_i``. The test
   asserts these local solutions are far apart, so the limit is not the global model in disguise.

Each closed form is also checked to be a stationary point of the loss as ``numpy_linreg_grad``
defines it (so the oracles match the model's loss, intercept and its penalty included).

Karula runs with full participation (``clients_per_round=None``: deterministic projected gradient
descent on ``F``, which is ``L/n``-smooth with ``L = max_i alpha_i L_i``) and ``eta = n / L`` (any
``eta < 2n/L`` converges). The data are strongly convex (``l2 = 1``), so both limits converge
linearly: the worst per-round contraction here is ``1 - min_i alpha_i lambda_min(A_i) / L`` ~ 0.96
for local training (``1 - lambda_min(sum_i alpha_i A_i / n) / L`` ~ 0.81 for ``t = 0``), and 1000
rounds reach rounding error (~1e-15). Tolerance: ``atol = 1e-9`` on every parameter (entries are
O(1)), ``rtol = 0``.
"""

import numpy as np
import pytest

from fedjax_dro import run
from fedjax_dro.algorithms.karula import karula
from tests.helpers import dataset, linreg, numpy_linreg_grad, regression_clients

SIZES = [6, 9, 14, 22, 30]  # unequal N_i, so the sample weighting matters
N, DIM, L2 = len(SIZES), 3, 1.0
ROUNDS = 1000
ATOL = 1e-9  # on every entry of every client's (w, b); the limits are reached to ~1e-15


def _clients(data):
  """Client ``i``'s rows as (augmented features [N_i, d + 1] with a ones column, targets)."""
  x, y, nex = np.asarray(data.x), np.asarray(data.y), np.asarray(data.num_examples)
  return [
    (np.hstack([x[i, : nex[i]], np.ones((nex[i], 1))]), y[i, : nex[i]]) for i in range(len(nex))
  ]


def _normal_equations(data):
  """``A_i = X~_i^T X~_i / N_i + l2 I``, ``r_i = X~_i^T y_i / N_i`` and ``N_i``."""
  clients = _clients(data)
  A = np.stack([xa.T @ xa / len(y) + L2 * np.eye(DIM + 1) for xa, y in clients])
  r = np.stack([xa.T @ y / len(y) for xa, y in clients])
  return A, r, np.array([len(y) for _, y in clients], dtype=float)


def _helper_grad(theta, xa, y):
  gw, gb = numpy_linreg_grad(theta[:DIM], theta[DIM], xa[:, :DIM], y, L2)
  return np.append(gw, gb)


def _stacked(params):
  """Client models ``{"w": [n, d], "b": [n]}`` as ``[n, d + 1]`` rows ``(w, b)``."""
  return np.hstack([np.asarray(params["w"]), np.asarray(params["b"])[:, None]])


@pytest.fixture(scope="module")
def problem():
  data = regression_clients(n=N, d=DIM, sizes=SIZES, seed=0)
  A, r, nex = _normal_equations(data)
  alpha = N * nex / nex.sum()
  L = max(a * np.linalg.eigvalsh(Ai).max() for a, Ai in zip(alpha, A))  # max_i alpha_i L_i, exact
  model = linreg(DIM, l2=L2)
  # one algorithm object for both runs: run() reuses its compiled rounds for other hparams
  alg = karula(model, dissimilarity="ones", projection_tol=1e-12)
  return dict(
    data=data,
    A=A,
    r=r,
    nex=nex,
    L=L,
    alg=alg,
    weighted=np.linalg.solve(np.einsum("i,ijk->jk", nex, A), nex @ r),
    uniform=np.linalg.solve(A.sum(0), r.sum(0)),
    local=np.stack([np.linalg.solve(Ai, ri) for Ai, ri in zip(A, r)]),
  )


def _karula(problem, t):
  hist = run(
    problem["alg"],
    dataset(problem["data"]),
    rounds=ROUNDS,
    seed=0,
    eval_every=ROUNDS,
    hparams={"t": t, "eta": N / problem["L"]},
  )
  return hist, _stacked(problem["alg"].client_models(hist.final_state))


def test_closed_forms_are_stationary_points_of_the_models_loss(problem):
  clients = _clients(problem["data"])
  g_weighted = sum(
    n_i * _helper_grad(problem["weighted"], xa, y) for n_i, (xa, y) in zip(problem["nex"], clients)
  )
  g_uniform = sum(_helper_grad(problem["uniform"], xa, y) for xa, y in clients)
  np.testing.assert_allclose(g_weighted, 0.0, atol=1e-11)
  np.testing.assert_allclose(g_uniform, 0.0, atol=1e-12)
  for theta, (xa, y) in zip(problem["local"], clients):
    np.testing.assert_allclose(_helper_grad(theta, xa, y), 0.0, atol=1e-12)
  # the oracles are distinguishable at the test's tolerance
  assert np.abs(problem["weighted"] - problem["uniform"]).max() > 1e4 * ATOL
  local = problem["local"]
  assert np.abs(local - problem["weighted"]).max() > 1e4 * ATOL
  assert np.abs(local[:, None] - local[None]).max() > 1e4 * ATOL


def test_t_zero_gives_every_client_the_sample_weighted_pooled_ridge_solution(problem):
  hist, theta = _karula(problem, 0.0)
  expected = np.broadcast_to(problem["weighted"], theta.shape)
  np.testing.assert_allclose(theta, expected, atol=ATOL, rtol=0)
  # and not the uniform-weighted pooled solution
  assert np.abs(theta - problem["uniform"]).max() > 1e4 * ATOL
  assert hist.train_metrics["constraint_violation"][-1] < 1e-12


def test_t_large_gives_every_client_its_own_ridge_solution(problem):
  t = 1e8
  local = problem["local"]
  # every constraint ||theta_i - theta_j||^2 <= t is inactive at the local solutions
  assert ((local[:, None] - local[None]) ** 2).sum(-1).max() < 1e-4 * t
  _, theta = _karula(problem, t)
  np.testing.assert_allclose(theta, local, atol=ATOL, rtol=0)
