"""Euclidean projection onto the pairwise-ball set of Karula.

Karula (Erickson & Johansson, "Personalized Federated Learning under Model Dissimilarity
Constraints", Section 3 and Algorithm 1) trains one
model per client under pairwise dissimilarity constraints and, after every (variance-reduced)
gradient step, projects the stacked models onto

    K = {Theta in R^{n x d} : ||theta_i - theta_j||^2 <= r_ij  for all i < j},   r = t D,

i.e. it solves

    minimize_Theta  f(Theta) = 0.5 ||Theta - Z||_F^2    subject to  Theta in K.          (P)

The paper notes that the projection has no closed form and analyses a *delta-inexact*
projection: a *feasible* point whose objective is within delta of the optimum. This module
returns exactly that: every method ends with a feasibility restoration and reports how inexact
the result is. ``r`` is an ``[n, n]`` symmetric nonnegative matrix; ``r_ij = 0`` forces
``theta_i = theta_j`` and ``r_ij = inf`` switches the constraint off. The diagonal is ignored.

Input: an ``[n, d]`` array (one row per client) or any pytree whose leaves share a leading
client axis ``n``; each client is raveled into one row and the result is unraveled back.

Optimality (KKT) conditions
---------------------------
With one multiplier ``mu_e >= 0`` per edge ``e = (i, j)``, ``a_e = e_i - e_j`` and the weighted
graph Laplacian ``L_mu = sum_e mu_e a_e a_e^T``, the Lagrangian of (P) is
``0.5 ||Theta - Z||^2 + sum_e mu_e / 2 (||a_e^T Theta||^2 - r_e)`` and a point is optimal iff

* primal feasibility    ``||theta_i - theta_j||^2 <= r_ij``;
* stationarity          ``Theta - Z + L_mu Theta = 0``;
* complementarity       ``mu_e (||theta_i - theta_j||^2 - r_e) = 0``;
* dual feasibility      ``mu_e >= 0``.

Edges with ``r_e = 0`` violate constraint qualification (their multipliers need not exist), so
they are eliminated exactly: the zero-radius edges split the clients into connected components
``S`` that must share one model. Projection onto the subspace ``{theta_i = theta_j on S}`` is the
per-component average and ``P_K(Z) = P_K(avg_S(Z))`` because ``K`` lies in that subspace.
Every solver starts from the averaged input; the dual method additionally *contracts* each
component into one weighted node (weight = component size, radius between two components = the
smallest ``r`` between their members). ``pairwise_kkt_residuals`` measures stationarity after
summing it over each component (the zero-radius edges' forces cancel there).

Methods (``method=``)
---------------------
``"dual"`` (default): maximize the concave dual over the edge multipliers,

    g(mu) = min_Theta L(Theta, mu),   Theta(mu) = (I + L_mu)^{-1} Z,
    dg/dmu_e = (||theta_i(mu) - theta_j(mu)||^2 - r_e) / 2,

over ``mu >= 0`` (edges with ``r = inf`` keep ``mu = 0``). Everything happens in the ``n x n``
Gram space: for ``d > n`` the input is replaced once by ``Y = R^T`` from the thin QR
factorisation ``Z^T = Q R`` (``Y Y^T = Z Z^T``, ``O(n^2 d)``; QR rather than an
eigendecomposition of ``Z Z^T``, which squares the condition number and, in float32 with well
separated groups, cost 3e-4 of relative accuracy); for ``d <= n``, ``Y = Z``. Each evaluation of ``g`` then costs one Cholesky factorisation
of ``I + L_mu``, one solve with ``k = min(n, d)`` right-hand sides and one ``n x n x k`` product
for the pairwise distances (``||theta_i - theta_j||^2`` from the Gram matrix of
``Theta(mu) = M Y``, ``M = (I + L_mu)^{-1}``): ``O(n^3)`` per iteration whatever ``d``. Only at
the end is ``Theta = M Z`` formed (``O(n^2 d)``), for the iterate with the best certificate.

For ``d > n`` (neural networks: ``d ~ 1e5 - 1e6`` parameters per client) the whole projection
reads the ``[n, d]`` input a fixed number of times and keeps no ``[n, d]`` array beside the
input and the output (``dual.project_dual_row_space``): the column mean, a *streamed* QR of the
centred input (incremental TSQR over column blocks, ``R <- R(qr([R; block^T]))``: as stable as
one Householder QR, ``O(n * block)`` memory, the centring done block by block), an equality
check of the zero-radius components, and one ``[n, n] x [n, d]`` product that gives the
restored output directly (``Theta = T' Z + (1 - T' 1) shift^T`` with ``T' = a T + (1 - a) 1
mean_rows(T)``, ``T = (M S)[labels]``); the distances that set the restoration factor and the
feasibility of the input are computed from the ``[n, n]`` row-space coordinates. Nothing of size
``n^2 d`` is ever formed. At ``n = 100, d = 1e5`` in float32 this cut XLA's temporary memory
from 3.1 copies of the input to 0.1 and the time of a projection by about 2.5x; ``n = 1000,
d = 1e6`` in float32 (4 GB per copy) fits in about 8 GB.

The optimiser is a projected limited-memory BFGS method (Kim, Sra & Dhillon 2010 style):
Bertsekas' epsilon-active set (multipliers at or near 0 whose gradient points outside) moves
along the scaled gradient; on the free edges the L-BFGS direction is built from the curvature
pairs restricted to them, on top of the *exact diagonal of the dual Hessian*,
``(a_e^T M a_e) ||theta_i - theta_j||^2``, scaled by the usual ``s'y / y'Dy`` factor; a
projected Armijo search along the arc with safeguarded quadratic backtracking globalises it.
The iteration stops on a *certified duality gap*: the restored point ``a Theta(mu)`` (below) is
feasible, hence ``0 <= f(a Theta(mu)) - f* <= f(a Theta(mu)) - g(mu)``, and the method stops when
this gap, relative to ``f(a Theta(mu))``, is at most ``tol``; the gap is evaluated without
cancellation as ``(a - 1)(...) + sum_e mu_e (r_e - d_e^2) / 2``. ``tol`` is used as given down to
64 ulp of the working precision (float32 inputs: ~7.6e-6); the certificate is computed in the
working precision, so it bounds the true suboptimality up to that precision's rounding. The
loop also ends (with ``converged=False``) after 100 iterations without progress, where progress
is a 1% drop of the best certificate *or* a rise of the dual value by more than 8 ulp (the
rounding floor). The certificate is set by the single worst edge (through the restoration
factor) and can stay flat for hundreds of iterations while the dual still converges: on three
well separated groups with ``n = 1000, d = 10^4`` (``instances.separated_groups``) it is flat
from iteration ~120 to ~600 and the method converges at ~700; a rule on the certificate alone
stopped there at 2.6e-3. The L-BFGS memory is 16 pairs (8 needed ~900 iterations on that
instance). ``initial_multipliers`` warm-starts the method (e.g. with the previous round's
multipliers in Karula).

Cost in practice (2-core CPU, cold start; ``benchmarks/projection_scaling.py`` and
``benchmarks/projection_convergence.py``): an iteration at ``n = 1000`` costs ~0.16 s (one
Cholesky, one solve with ``n`` right-hand sides, one ``n x n x n`` product); ``n = 1000,
d = 10^4`` takes ~200 iterations to a certified 1e-6 on the moderately constrained instances of
the scaling benchmark and ~700 (about 2 minutes; float32 at 1e-4: ~400, under a minute) on the
separated-groups instance; ``n <= 300`` takes seconds. Warm starts (Karula's later rounds) need
a handful of iterations. Note that JAX's CPU Cholesky and triangular solves run in OpenBLAS: on small shared
machines set ``OPENBLAS_NUM_THREADS=1`` before importing NumPy / JAX (OpenBLAS threads competing
with XLA's can slow factorisations down 10-100x).

``"admm"``: ADMM on the split ``V = D Theta`` (``D`` the edge-node incidence matrix of the
complete graph, rows ``a_e^T``): the Theta-step solves ``(I + beta L) Theta = Z + beta D^T (V - U)``
in closed form, ``Theta = (R + beta 1 (1^T R)) / (1 + beta n)`` (``L = D^T D = n I - 1 1^T``); the
V-step projects every edge vector onto its ball ``||v_e||^2 <= r_e``; ``U += D Theta - V``.
Boyd et al. (2011, Sec. 3.3) relative primal / dual residual stopping, with residual balancing of
``beta`` (Sec. 3.4.1) every 10 iterations. Edges with ``r = inf`` keep an unconstrained copy so
that the closed form stays valid. Only the scaled duals ``U`` are kept between iterations
(``V`` is recomputed from them), so the state is one ``[m, k]`` edge array.

``"dykstra"``: parallel Dykstra in the product space of per-edge copies. Each edge ``e = (i, j)``
owns copies of rows ``i`` and ``j``; the product space carries the weights ``omega_i = 1/deg(i)``
(``deg`` = number of finite-radius edges at ``i``), which makes the consensus subspace isometric
to the original space, so Dykstra's algorithm for the two sets (product of edge sets,
consensus subspace) converges to the true projection. The edge step is the weighted closed form:
if ``||u_i - u_j|| > sqrt(r)``, keep the weighted mean ``omega_i u_i + omega_j u_j`` and shrink the
difference to length ``sqrt(r)`` (for equal degrees, e.g. all radii finite, this is the symmetric
move toward the midpoint); the consensus step averages the copies of row ``i`` with weights
``1/deg(i)``. With ``Q_e`` the correction of edge ``e`` this collapses to one vector per edge:
``delta_e = theta_i - theta_j + Q_e``, ``Q_e <- (1 - sqrt(r_e)/||delta_e||)_+ delta_e``,
``Theta <- Theta - D^T (kappa * (Q_new - Q_old))`` with ``kappa_e = omega_i omega_j /
(omega_i + omega_j)``; the multiplier estimate is ``mu_e = kappa_e ||Q_e|| / sqrt(r_e)``. Stops when
the relative KKT stationarity residual and the maximum relative violation are below ``tol``.

Memory of ADMM and Dykstra: ``O(n^2 k)`` with ``k = min(n, d)``. For ``d > n`` both run on the
exact ``n``-dimensional row-space coordinates ``Y`` of the centred input (thin QR
``Z_c^T = Q Y^T``, once, ``O(n^2 d)``) and map back with ``Q^T``: the problem only sees norms of
row combinations, so the iterates are the same as on ``Z`` (see ``_row_space_reduce``). For
``n = 1000`` that is still ``~4 GB`` per edge array in float64.

Feasibility restoration (``restore_feasibility=True``, all methods)
-------------------------------------------------------------------
1. Rows of each zero-radius component are replaced by their average (so those pairs coincide
   exactly). 2. With ``a = min(1, min_{r_ij > 0} sqrt(r_ij) / ||theta_i - theta_j||)`` every row is
shrunk toward the unweighted centroid, ``theta_i <- c + a (theta_i - c)``: every pairwise
difference is scaled by exactly ``a``, so the output is feasible (``a`` is reduced by 4 ulp when
``< 1`` to absorb rounding; coinciding rows stay coinciding). The factor ``a`` is reported; for
the exact projection the centroid of ``Theta`` equals the centroid of ``Z``, so the cost of the
restoration is second order in the violation. An input that is already feasible is returned
unchanged (bit for bit).

Everything is jitted with ``method`` / ``max_iterations`` static, uses fixed shapes and
``lax.while_loop`` (no Python loops over clients), and works under ``jit`` / ``vmap``
(validation of values is skipped for traced arguments; shapes are always checked).

Layout of this package: ``problem`` (outputs, preprocessing, validation), ``dual``, ``admm``,
``dykstra`` (one module per method), ``restoration`` (the centroid shrinkage), ``project``
(:func:`project_pairwise`, :func:`compile_projection`, :func:`pairwise_kkt_residuals`) and
``instances`` (hard Karula-like instances and a closed-form one, for tests and benchmarks).
"""

# the solvers' internal face (the public one is fedjax_dro.solvers')
from fedjax_dro.solvers.pairwise.admm import solve_admm as solve_admm
from fedjax_dro.solvers.pairwise.dual import solve_dual as solve_dual
from fedjax_dro.solvers.pairwise.dykstra import solve_dykstra as solve_dykstra
from fedjax_dro.solvers.pairwise.problem import (
  DEFAULT_MAX_ITERATIONS as DEFAULT_MAX_ITERATIONS,
  METHODS as METHODS,
  KKTResiduals as KKTResiduals,
  PairwiseProjectionOutput as PairwiseProjectionOutput,
  SolverOutput as SolverOutput,
  pairwise_sq_distances as pairwise_sq_distances,
)
from fedjax_dro.solvers.pairwise.project import (
  CompiledProjection as CompiledProjection,
  compile_projection as compile_projection,
  pairwise_kkt_residuals as pairwise_kkt_residuals,
  project_pairwise as project_pairwise,
)
from fedjax_dro.solvers.pairwise.restoration import shrink_to_feasible as shrink_to_feasible
