"""Numerical solvers used by the algorithms, each checked against CVXPY or a closed form.

* :mod:`fedjax_dro.solvers.pairwise`: Euclidean projection onto Karula's pairwise-ball set
  (dual, ADMM and Dykstra methods, feasibility restoration, KKT residuals).
* :mod:`fedjax_dro.solvers.dro`: the DRO problems (the regularizer psi and its set Lambda) as
  objects, ``chi2(rho)``, ``cvar(alpha)``, ``qffl(q)`` and ``kl(lam)``, with their value, best
  response, robust objective and dual prox step; what the DRO algorithms and the saddle-point
  solver take as ``psi``.
* :mod:`fedjax_dro.solvers.simplex`: exact simplex / capped-simplex projections and the chi^2,
  CVaR and q-FFL dual prox steps of SCAFF-PD (the problems' ``prox``).
* :mod:`fedjax_dro.solvers.saddle`: the centralized high-precision saddle-point solver of
  ``min_x max_lambda sum_i lambda_i f_i(x) - psi(lambda)`` (the oracle of the DRO tests).

The round mechanics every algorithm shares (sampling, local training, aggregation, metrics)
live in :mod:`fedjax_dro.core`.
"""

from fedjax_dro.solvers.dro import DROProblem, as_problem, chi2, cvar, kl, qffl
from fedjax_dro.solvers.pairwise import (
  PairwiseProjectionOutput,
  compile_projection,
  pairwise_kkt_residuals,
  project_pairwise,
  shrink_to_feasible,
)
from fedjax_dro.solvers.saddle import SaddleSolution, best_response, robust_objective, solve_saddle
from fedjax_dro.solvers.simplex import project_capped_simplex, project_simplex

__all__ = [
  "DROProblem",
  "chi2",
  "cvar",
  "qffl",
  "kl",
  "as_problem",
  "solve_saddle",
  "SaddleSolution",
  "best_response",
  "robust_objective",
  "project_pairwise",
  "compile_projection",
  "PairwiseProjectionOutput",
  "pairwise_kkt_residuals",
  "shrink_to_feasible",
  "project_simplex",
  "project_capped_simplex",
]
