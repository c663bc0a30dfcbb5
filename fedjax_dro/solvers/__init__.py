"""Numerical solvers used by the algorithms, each checked against CVXPY or a closed form.

* :mod:`fedjax_dro.solvers.pairwise`: Euclidean projection onto Karula's pairwise-ball set
  (dual, ADMM and Dykstra methods, feasibility restoration, KKT residuals).
* :mod:`fedjax_dro.solvers.simplex`: exact simplex / capped-simplex projections and the chi^2,
  CVaR and q-FFL dual prox steps of SCAFF-PD.
* :mod:`fedjax_dro.solvers.saddle`: the centralized high-precision saddle-point solver of
  ``min_x max_lambda sum_i lambda_i f_i(x) - psi(lambda)`` (the oracle of the DRO tests).

The round mechanics every algorithm shares (sampling, local training, aggregation, metrics)
live in :mod:`fedjax_dro.core`.
"""

from fedjax_dro.solvers import pairwise, saddle, simplex
from fedjax_dro.solvers.pairwise import (
  KKTResiduals,
  PairwiseProjectionOutput,
  compile_projection,
  pairwise_kkt_residuals,
  project_pairwise,
  shrink_to_feasible,
)
from fedjax_dro.solvers.saddle import (
  SaddleSolution,
  best_response,
  distance_to_optimum,
  robust_objective,
  solve_saddle,
)
from fedjax_dro.solvers.simplex import (
  PSI_NAMES,
  dual_prox,
  project_capped_simplex,
  project_simplex,
  prox_chi2,
  prox_cvar,
  prox_qffl,
  psi_value,
)

__all__ = [
  "pairwise",
  "saddle",
  "simplex",
  "KKTResiduals",
  "PairwiseProjectionOutput",
  "compile_projection",
  "pairwise_kkt_residuals",
  "project_pairwise",
  "shrink_to_feasible",
  "SaddleSolution",
  "best_response",
  "distance_to_optimum",
  "robust_objective",
  "solve_saddle",
  "PSI_NAMES",
  "dual_prox",
  "project_capped_simplex",
  "project_simplex",
  "prox_chi2",
  "prox_cvar",
  "prox_qffl",
  "psi_value",
]
