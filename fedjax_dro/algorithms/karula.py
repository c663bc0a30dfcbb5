"""Karula: personalized FL under pairwise model-dissimilarity constraints.

Erickson and Johansson, "Personalized Federated Learning under Model Dissimilarity Constraints",
arXiv:2505.07575, problem (1) and Algorithm 1. The problem is::

    minimize_{theta_1..theta_n}  F(theta) = (1/n) sum_i alpha_i f_i(theta_i)
    subject to                   ||theta_i - theta_j||^2 <= t D_ij   for all pairs i, j

``t = 0`` forces one global model (the minimizer of the alpha-weighted pooled objective);
``t -> infinity`` makes every constraint inactive (local training). ``D`` is a symmetric,
nonnegative, zero-diagonal dissimilarity matrix: Karula's OT-embedding surrogate of the W1
distances between the clients' data (:func:`fedjax_dro.ot.dissimilarity_matrix`, computed once
at ``init`` from the training data when ``dissimilarity="ot"``; by default with the paper's
settings, ``preset="paper"``: exact OT, Euclidean cost, entrywise l1; ``ot_options={"preset":
"entropic"}`` gives the earlier Sinkhorn / W1-like defaults), any precomputed matrix, or
``"ones"`` (``D_ij = 1`` off the diagonal: the constraint ``||theta_i - theta_j||^2 <= t``).

Algorithm 1 (inexact projected gradient with SAGA-style variance reduction). The server keeps the
per-client models ``theta [n, ...]`` and a table of stored gradients ``g [n, ...]``. Every round:

1. sample ``s`` clients ``S`` uniformly without replacement;
2. every ``i in S`` returns ``G_i(theta_i)``, a gradient of ``f_i`` at its current model (full
   batch with ``batch_size=None``, else a minibatch of ``batch_size`` rows drawn with replacement);
3. ``nu = g + (n/s) * 1[i in S] * (g_fresh_i - g_i)`` row-wise, then ``g_i <- g_fresh_i`` for
   ``i in S``;
4. ``theta <- P_K(theta - eta nu)`` with the inexact projection onto
   ``K = {||theta_i - theta_j||^2 <= t D_ij}`` (:func:`fedjax_dro.solvers.pairwise.project_pairwise`,
   method and tolerance are factory options; the result is always feasible (feasibility
   restoration); iterations, residuals, convergence flag and restoration scale are round metrics;
   the ``"dual"`` method is warm-started from the previous round's edge multipliers).

Scaling of the estimator (the paper's reading made precise). The paper writes
``g^0 = (G_1(phi_1), ..., G_n(phi_n)) / n`` and ``nu^k = g^k + (g^{k+1} - g^k) / s`` with ``G_i``
an oracle for ``alpha_i grad f_i`` (Assumption 4.2). We store the *per-block gradient of F*::

    g_i = (alpha_i / n) G_i(phi_i)        (phi_i = theta_i at client i's last participation)

and use ``nu_i = g_i + (n/s) 1[i in S] (g_i^fresh - g_i)``. Since ``P(i in S) = s/n`` under uniform
sampling of ``s`` out of ``n`` without replacement, ``E[nu_i] = g_i + (g_i^fresh - g_i) =
E[g_i^fresh] = (alpha_i / n) grad f_i(theta_i) = d F / d theta_i``: ``nu`` is unbiased for
``grad F`` (for full-batch and minibatch oracles alike). This equals the paper's ``(G^fresh -
G^stored)/s`` written with the unscaled oracles ``G_i``; reading ``1/s`` as applying to the
``1/n``-scaled table would be biased by a factor ``1/n`` on the correction (the Monte Carlo test in
``tests/algorithms/test_karula.py`` shows the chosen estimator is unbiased and that one is not).
The snapshots ``phi_i`` of the paper are only used to evaluate ``G_i(phi_i)`` when it is stored,
so only the table ``g`` is kept.

Loss weights ``alpha_i = n N_i / sum_j N_j`` (sample counts, normalized to mean 1), or
``alpha_i = 1`` with ``weighting="uniform"``. Participation: ``2 <= s <= n``. The paper's theory
takes ``2 <= s <= n - 1``; ``s = n`` (``clients_per_round=None``, the default) is the
deterministic full-participation variant: ``nu = grad F`` exactly (with full-batch oracles) and
the method is plain projected gradient descent on F, converging to the solution of the
constrained problem (tested against CVXPY).

Step size ``eta`` (hyper-parameter). ``nu`` estimates ``grad F``, which carries the factor
``alpha_i / n`` per block, so the block-``i`` step is ``eta alpha_i / n`` times ``grad f_i``. With
``L = max_i alpha_i L_i`` (the paper's Assumption 4.1: every ``alpha_i f_i`` is ``L``-smooth;
:func:`smoothness_constant` computes it) the theory step for ``2 <= s <= n - 1`` is
``eta = 3/(8L)`` (Theorems 4.4, 4.5). This is the SAGA step for the components ``alpha_i f_i``:
a sampled block jumps by ``eta (n/s)(alpha_i/n) grad f_i``, so steps much larger than ``s/L`` make
partial participation unstable (observed on synthetic-ridge: ``eta = 0.93 ~ 0.8 s/L`` oscillates,
``eta <= 0.4`` converges), while ``3/(8L)`` is safe but slow. With full participation ``F`` is
``(L/n)``-smooth and this is projected gradient descent: any ``eta < 2n/L`` converges
(``eta = n/L`` is a good choice). The default ``eta = 1`` suits full participation on
synthetic-ridge (``L ~ 12``, ``n = 30``); set it from ``L`` otherwise. Initialization: every client
starts from the common model ``params`` (feasible for every ``t``), and the table is filled with
every client's gradient there (the paper's setup step).

Persistent per-client state: ``params [n, ...]``, ``grad_table [n, ...]``; plus ``D [n, n]`` and
the last projection's edge multipliers ``[n, n]``.

Round metrics: ``train_loss`` (alpha-weighted mean of the participants' losses at their current
models), ``train_loss_max``, ``grad_norm`` (``||nu||``), ``gradient_mapping_sq``
(``||theta^{k+1} - theta^k||^2 / eta^2``, the stationarity measure of Theorem 4.4 with ``nu`` for
``grad F``), ``projection_iterations``, ``projection_residual`` (the method's relative stopping
residual), ``projection_violation`` (violation before restoration), ``projection_converged``,
``restoration_scale`` and ``constraint_violation`` (after the step; 0 up to rounding);
``projection_violation_rel``, the largest relative violation ``d_ij^2 / (t D_ij) - 1`` of the
solver's iterate before restoration (``1 / a^2 - 1`` for the restoration scale ``a``); with the
``"dual"`` method also ``projection_certified_gap``, the certified relative suboptimality of the
returned (feasible) point, ``(f(theta) - g(mu)) / f(theta)`` for the projection objective ``f``
and the dual value ``g`` at the returned multipliers: an upper bound on ``(f - f*) / f``, the
``delta`` of the paper's inexact projection in relative terms (the same number as
``projection_residual`` for this method, under a name that says what it bounds).

Cost at neural-network sizes (``d`` parameters per client, ``d >> n``): the gradient step is
``O(n d)``; the ``"dual"`` projection reads the ``[n, d]`` models a fixed number of times (a
column mean, a streamed QR, one ``[n, n] x [n, d]`` product: ``O(n^2 d)`` once) and iterates
on ``[n, n]`` arrays only (``O(n^3)`` per L-BFGS iteration, independent of ``d``), warm-started
from the previous round's multipliers; ``constraint_violation`` is one more ``O(n^2 d)`` Gram
product. See ``benchmarks/speed_karula.py`` (the round against FedAvg's on a CNN) and
``docs/benchmarks/projection.md`` (the projection at ``d = 1e5, 1e6``).

This file is a little over 600 lines: Algorithm 1, its estimator, the projection glue and the
validation of every argument read as one unit beside the paper.
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, NamedTuple, Optional, Union

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register
from fedjax_dro.common.checks import choice, flag, integer, number
from fedjax_dro.common.model import Model, client_loss_and_grad, num_parameters
from fedjax_dro.core.aggregation import scatter_rows, tree_stack
from fedjax_dro.core.clients import map_clients, resolve_backend, validate_backend
from fedjax_dro.core.costs import Costs, one_gradient_each, parameter_count
from fedjax_dro.core.release import Refused
from fedjax_dro.core.sampling import sample_clients
from fedjax_dro.core.settings import check_data_matches
from fedjax_dro.solvers import pairwise

DISSIMILARITY_CHOICES = ("ot", "ones")
WEIGHTINGS = ("num_examples", "uniform")


class KarulaState(NamedTuple):
  params: Any  # [n, ...] per-client models theta_i
  grad_table: Any  # [n, ...] stored per-block gradients g_i = (alpha_i/n) G_i(phi_i)
  dissimilarity: jnp.ndarray  # [n, n] D (symmetric, >= 0, zero diagonal)
  multipliers: jnp.ndarray  # [n, n] edge multipliers of the last projection (warm start)
  round: jnp.ndarray  # [] int32 rounds done


class GradientEstimate(NamedTuple):
  nu: Any  # [n, ...] unbiased estimate of grad F(theta)
  grad_table: Any  # [n, ...] the table after refreshing the participants' rows
  idx: jnp.ndarray  # [s] participating clients
  losses: jnp.ndarray  # [s] (minibatch) loss f_i(theta_i) of the participants


JOINT_PROJECTION = Refused(
  "its server step projects all the clients' personalized models jointly onto the "
  "pairwise-distance constraints: it reads every client's model, so no clipped, noised sum of "
  "updates can stand in for it"
)

HPARAMS = {
  "eta": HParam(
    1.0,
    "step size of the projected gradient step on F (theory for s < n: 3/(8L), "
    "L = max_i alpha_i L_i; full participation: < 2n/L)",
  ),
  "t": HParam(
    1.0,
    "constraint level: ||theta_i - theta_j||^2 <= t D_ij (0 = one global model)",
    minimum=0.0,
    strict=False,
  ),
}


# ----------------------------------------------------------------------------------------------
# Pure building blocks (public: used by the round, the tests and the benchmarks)
# ----------------------------------------------------------------------------------------------


def loss_weights(num_examples, weighting: str = "num_examples"):
  """``alpha [n]``: ``n N_i / sum_j N_j`` (mean 1) or ones (``weighting="uniform"``)."""
  nex = jnp.asarray(num_examples).astype(jnp.result_type(float))
  if weighting == "uniform":
    return jnp.ones_like(nex)
  return nex.shape[0] * nex / jnp.sum(nex)


def _client_grads(model, params_rows, x, y, nex, keys, batch_size, backend, chunk_size):
  fn = lambda p, xi, yi, ni, k: client_loss_and_grad(model, p, xi, yi, ni, k, batch_size)
  return map_clients(fn, params_rows, x, y, nex, keys, backend=backend, chunk_size=chunk_size)


def _scale_rows(tree, scale):
  return jax.tree.map(
    lambda a: a * scale.reshape((-1,) + (1,) * (a.ndim - 1)).astype(a.dtype), tree
  )


def full_gradient_table(
  model: Model,
  params,
  data,
  key,
  *,
  batch_size: Optional[int] = None,
  weighting: str = "num_examples",
  backend: str = "vmap",
  chunk_size: Optional[int] = None,
):
  """``([n, ...] per-block gradients (alpha_i/n) G_i(theta_i), [n] losses)`` for every client.

  With ``batch_size=None`` this is exactly ``grad F(theta)`` for stacked ``params [n, ...]``.
  """
  n = data.num_clients
  alpha = loss_weights(data.num_examples, weighting)
  losses, grads = _client_grads(
    model,
    params,
    data.x,
    data.y,
    data.num_examples,
    jax.random.split(key, n),
    batch_size,
    backend,
    chunk_size,
  )
  return _scale_rows(grads, alpha / n), losses


def saga_estimate(stored, fresh_rows, idx, num_clients: int):
  """``(nu, new_table)`` from the stored table ``[n, ...]`` and the fresh rows ``[s, ...]``.

  ``nu_i = g_i + (n/s) 1[i in S] (g_i^fresh - g_i)``; ``idx`` must hold distinct indices (uniform
  sampling without replacement), for which ``E[nu] = E[g^fresh]`` (see the module docstring).
  """
  s = idx.shape[0]
  scale = num_clients / s
  nu = jax.tree.map(lambda g, f: g.at[idx].add(scale * (f - g[idx])), stored, fresh_rows)
  return nu, scatter_rows(stored, idx, fresh_rows)


def estimate_gradient(
  model: Model,
  params,
  grad_table,
  data,
  key,
  *,
  clients_per_round: int,
  batch_size: Optional[int] = None,
  weighting: str = "num_examples",
  backend: str = "vmap",
  chunk_size: Optional[int] = None,
) -> GradientEstimate:
  """Steps 1-3 of a Karula round: sample ``s`` clients, refresh their gradients, form ``nu``.

  ``params`` and ``grad_table`` are ``[n, ...]``; the result's ``nu`` is unbiased for
  ``grad F(params)`` (see the module docstring).
  """
  n, s = data.num_clients, clients_per_round
  sample_key, grad_key = jax.random.split(key)
  idx = sample_clients(sample_key, n, s)
  alpha = loss_weights(data.num_examples, weighting)
  rows = jax.tree.map(lambda a: a[idx], params)
  clients = data.take_clients(idx)
  losses, grads = _client_grads(
    model,
    rows,
    clients.x,
    clients.y,
    clients.num_examples,
    jax.random.split(grad_key, s),
    batch_size,
    backend,
    chunk_size,
  )
  fresh = _scale_rows(grads, alpha[idx] / n)
  nu, table = saga_estimate(grad_table, fresh, idx, n)
  return GradientEstimate(nu, table, idx, losses)


def flatten_clients(params):
  """``[n, p]``: every client's pytree raveled into one row."""
  return jax.vmap(lambda p: jax.flatten_util.ravel_pytree(p)[0])(params)


def constraint_violation(params, t, dissimilarity):
  """``max_ij (||theta_i - theta_j||^2 - t D_ij)_+`` (0 when feasible) of ``[n, ...]`` models."""
  d2 = pairwise.pairwise_sq_distances(flatten_clients(params))
  return jnp.maximum(jnp.max(d2 - t * dissimilarity), 0.0)


def smoothness_constant(
  model: Model,
  params,
  data,
  *,
  stacked: bool = False,
  weighting: str = "num_examples",
  iterations: int = 100,
  key=None,
) -> float:
  """``L = max_i alpha_i L_i``: the smoothness constant of the weighted losses ``alpha_i f_i``
  (the paper's Assumption 4.1), at the point ``params``.

  Power iteration with Hessian-vector products of ``n F = sum_i alpha_i f_i(theta_i)`` (full
  batch; block diagonal over clients, so its top eigenvalue is the largest block's). Exact for
  quadratic losses (ridge) up to the power-iteration tolerance (from below). ``params`` is one
  model (used for every client) or, with ``stacked=True``, ``[n, ...]`` per-client models. Theory
  step (``s < n``): ``3 / (8 L)``; ``F`` itself is ``L / n``-smooth.
  """
  n = data.num_clients
  theta = params if stacked else tree_stack(params, n)
  key = jax.random.PRNGKey(0) if key is None else key
  grad_f = lambda p: full_gradient_table(model, p, data, key, weighting=weighting)[0]
  hvp = lambda v: jax.jvp(grad_f, (theta,), (v,))[1]
  flat0, unravel = jax.flatten_util.ravel_pytree(theta)
  v = jax.random.normal(key, flat0.shape, flat0.dtype)
  v = v / jnp.linalg.norm(v)

  @jax.jit
  def run(v):
    def body(_, carry):
      v, _ = carry
      hv = jax.flatten_util.ravel_pytree(hvp(unravel(v)))[0]
      lam = jnp.vdot(v, hv)
      return hv / jnp.maximum(jnp.linalg.norm(hv), 1e-300), lam

    return jax.lax.fori_loop(0, iterations, body, (v, jnp.zeros((), flat0.dtype)))[1]

  return float(run(v)) * n


# ----------------------------------------------------------------------------------------------
# Validation helpers
# ----------------------------------------------------------------------------------------------


def _check_dissimilarity(dissimilarity, num_clients: Optional[int] = None):
  """Returns "ot" / "ones" or the validated matrix (raises naming ``dissimilarity``)."""
  if isinstance(dissimilarity, str):
    if dissimilarity not in DISSIMILARITY_CHOICES:
      raise ValueError(
        f"dissimilarity must be one of {DISSIMILARITY_CHOICES} or a [n, n] matrix, "
        f"got {dissimilarity!r}"
      )
    return dissimilarity
  from fedjax_dro.ot.dissimilarity import validate_dissimilarity

  try:
    arr = np.asarray(dissimilarity)
  except Exception as e:  # pragma: no cover - defensive
    raise TypeError(
      f"dissimilarity must be 'ot', 'ones' or a [n, n] matrix, got {type(dissimilarity).__name__}"
    ) from e
  if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
    raise TypeError(
      f"dissimilarity must be 'ot', 'ones' or a numeric [n, n] matrix, got "
      f"{type(dissimilarity).__name__} with dtype {arr.dtype}"
    )
  if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
    raise ValueError(
      f"dissimilarity must be a square [n_clients, n_clients] matrix, got shape {arr.shape}"
    )
  if num_clients is None:
    # The factory: everything but the diagonal now; the shape against the data's n first, then
    # the diagonal, in init (so a matrix of the wrong size is reported as that).
    off = np.array(arr, dtype=np.float64)
    np.fill_diagonal(off, 0.0)
    validate_dissimilarity(off, arr.shape[0], name="dissimilarity")
    return arr
  if arr.shape != (num_clients, num_clients):
    raise ValueError(
      f"dissimilarity is {arr.shape} but the data has {num_clients} clients: expected a "
      f"[{num_clients}, {num_clients}] matrix"
    )
  return validate_dissimilarity(arr, num_clients, name="dissimilarity")


def _check_participation(clients_per_round, num_clients: Optional[int] = None) -> Optional[int]:
  if clients_per_round is None:
    if num_clients is not None and num_clients < 2:
      raise ValueError(f"karula needs at least 2 clients, got data with {num_clients}")
    return num_clients
  if not isinstance(clients_per_round, (int, np.integer)) or isinstance(clients_per_round, bool):
    raise TypeError(
      f"clients_per_round must be an int in [2, n] or None (all clients), got {clients_per_round!r}"
    )
  upper = "n" if num_clients is None else f"n={num_clients}"
  if clients_per_round < 2 or (num_clients is not None and clients_per_round > num_clients):
    raise ValueError(
      f"clients_per_round must be in [2, {upper}] (Karula samples at least two "
      f"clients per round; n means full participation), got {clients_per_round}"
    )
  return int(clients_per_round)


def _check_options(fn, options, name):
  options = dict(options or {})
  if not isinstance(options, dict):
    raise TypeError(f"{name} must be a dict of keyword arguments, got {type(options).__name__}")
  accepted = inspect.signature(fn).parameters
  if not any(p.kind == p.VAR_KEYWORD for p in accepted.values()):
    unknown = sorted(set(options) - set(accepted))
    if unknown:
      raise ValueError(f"{name} has unknown key(s) {unknown} for {fn.__module__}.{fn.__name__}")
  return options


# ----------------------------------------------------------------------------------------------
# The algorithm
# ----------------------------------------------------------------------------------------------


@register(
  "karula",
  "Karula (Erickson & Johansson): personalized models under pairwise "
  "dissimilarity constraints ||theta_i - theta_j||^2 <= t D_ij, SAGA + inexact projection",
  family="personalized",
)
def karula(
  model: Model,
  *,
  dissimilarity: Union[str, Any] = "ot",
  clients_per_round: Optional[int] = None,
  batch_size: Optional[int] = None,
  projection: str = "dual",
  projection_tol: Optional[float] = None,
  projection_max_iterations: Optional[int] = None,
  warm_start: bool = True,
  projection_options: Optional[Dict] = None,
  weighting: str = "num_examples",
  ot_options: Optional[Dict] = None,
  backend: str = "auto",
  chunk_size: Optional[int] = None,
) -> Algorithm:
  """Karula, Algorithm 1 (see the module docstring for the exact estimator and scalings).

  Cost: each of the ``s`` sampled clients evaluates and uploads one gradient (``P`` floats) a
  round; the setup fills the table with every client's gradient (``n`` of them).

  Hyper-parameters (a dict argument of ``round``; vmappable): ``eta`` (step size), ``t``
  (constraint level, ``>= 0``). Under ``vmap`` (``sweep``, cross-validation over ``t``) the
  projection's ``lax.while_loop`` becomes one batched loop that runs until the *slowest* row has
  converged (the finished rows are frozen, not re-solved), so a sweep round costs about the
  slowest single run's projection; large and small ``t`` differ most (``t = 0`` and very large
  ``t`` are solved in a few steps).

  Args:
    model: the client model (:class:`~fedjax_dro.common.model.Model`).
    dissimilarity: ``"ot"`` (default: :func:`fedjax_dro.ot.dissimilarity_matrix` of the training
      data, computed once at ``init``, outside jit, with ``ot_options``), ``"ones"``
      (``D_ij = 1`` for ``i != j``) or a precomputed ``[n, n]`` matrix (symmetric, nonnegative,
      zero diagonal).
    clients_per_round: ``s`` in ``[2, n]``; None = all clients (deterministic full gradient).
    batch_size: minibatch size of the client gradient oracle; None = full batch.
    projection: ``"dual"``, ``"admm"`` or ``"dykstra"`` (see :mod:`fedjax_dro.solvers.pairwise`).
    projection_tol: stopping tolerance of the projection solver, the method's relative
      residual (for ``"dual"`` the certified relative duality gap of the returned, always
      feasible, point); ``None`` (default): ``max(1e-8, 100 eps)`` of the parameters' dtype
      (``1e-8`` in float64, ``1.2e-5`` in float32, where 1e-8 is out of reach and every
      projection would run to the iteration cap).
    projection_max_iterations: iteration cap of the projection solver; ``None`` (default): the
      method's default.
    warm_start: start the ``"dual"`` projection from the previous round's edge multipliers
      (kept in the state; they converge with the iterates, so late projections take few steps).
    projection_options: extra keyword arguments of ``project_pairwise``.
    weighting: ``"num_examples"`` (``alpha_i = n N_i / sum N``) or ``"uniform"`` (``alpha_i = 1``).
    ot_options: keyword arguments of :func:`fedjax_dro.ot.dissimilarity_matrix`.
    backend: execution of the participants' gradient evaluations, ``"auto"`` (default),
      ``"vmap"``, ``"map"`` or ``"chunked"``.
    chunk_size: clients per chunk of ``"chunked"``; ``None`` (default): planned from memory.
  """
  if not isinstance(model, Model):
    raise TypeError(f"model must be a fedjax_dro Model, got {type(model).__name__}")
  dissimilarity = _check_dissimilarity(dissimilarity)
  _check_participation(clients_per_round)
  batch_size = integer(batch_size, "batch_size", optional=True, none="full batch")
  choice(projection, "projection", pairwise.METHODS)
  projection_tol = number(
    projection_tol, "projection_tol", minimum=0.0, strict=True, optional=True, none="dtype default"
  )
  max_iterations = integer(
    projection_max_iterations,
    "projection_max_iterations",
    optional=True,
    none="the method's default",
  )
  use_warm_start = flag(warm_start, "warm_start") and projection == "dual"
  choice(weighting, "weighting", WEIGHTINGS)
  validate_backend(backend, chunk_size)
  if isinstance(dissimilarity, str) and dissimilarity == "ot":
    from fedjax_dro.ot import dissimilarities

    ot_options = _check_options(dissimilarities, ot_options, "ot_options")
  elif ot_options:
    raise ValueError(
      f"ot_options is only used with dissimilarity='ot', got dissimilarity="
      f"{dissimilarity if isinstance(dissimilarity, str) else 'a matrix'}"
    )
  projection_options = _check_options(
    pairwise.project_pairwise, projection_options, "projection_options"
  )
  reserved = sorted(
    {"method", "tol", "max_iterations", "initial_multipliers"} & set(projection_options)
  )
  if reserved:
    raise ValueError(
      f"projection_options must not set {reserved}: use the factory arguments "
      f"projection, projection_tol, projection_max_iterations, warm_start"
    )

  def project(z, r, multipliers):
    tol = projection_tol
    if tol is None:
      tol = max(1e-8, 100 * float(jnp.finfo(jax.tree.leaves(z)[0].dtype).eps))
    return pairwise.project_pairwise(
      z,
      r,
      method=projection,
      tol=tol,
      max_iterations=max_iterations,
      initial_multipliers=multipliers if use_warm_start else None,
      **projection_options,
    )

  def resolved_backend(params):
    return resolve_backend(backend, num_parameters(params))

  ot_cache = []  # one entry: (x, y, mask, D) -- repeated inits on the same data reuse the OT

  def ot_dissimilarity(data, n):
    if ot_cache and all(a is b for a, b in zip(ot_cache[0][:3], (data.x, data.y, data.mask))):
      return ot_cache[0][3]
    from fedjax_dro.ot import dissimilarity_matrix

    D = _check_dissimilarity(dissimilarity_matrix(data.x, data.y, data.mask, **ot_options), n)
    ot_cache[:] = [(data.x, data.y, data.mask, D)]
    return D

  def init(params, data, key):
    n = data.num_clients
    _check_participation(clients_per_round, n)
    dtype = jax.tree.leaves(params)[0].dtype if jax.tree.leaves(params) else jnp.result_type(float)
    if isinstance(dissimilarity, str) and dissimilarity == "ones":
      D = 1.0 - jnp.eye(n)
    elif isinstance(dissimilarity, str):  # "ot": computed once, from the concrete training data
      if any(isinstance(a, jax.core.Tracer) for a in (data.x, data.y, data.mask)):
        raise ValueError(
          "karula(dissimilarity='ot') computes D from the training data at init, "
          "which needs concrete data: call alg.init outside jit, or pass the "
          "precomputed matrix (fedjax_dro.ot.dissimilarity_matrix) as dissimilarity"
        )
      D = ot_dissimilarity(data, n)
    else:
      D = jnp.asarray(_check_dissimilarity(dissimilarity, n))
    theta = jax.tree.map(lambda a: jnp.array(jnp.broadcast_to(a, (n,) + jnp.shape(a))), params)
    table, _ = jax.jit(
      lambda th, dt, k: full_gradient_table(
        model,
        th,
        dt,
        k,
        batch_size=batch_size,
        weighting=weighting,
        backend=resolved_backend(params),
        chunk_size=chunk_size,
      )
    )(theta, data, key)
    # a fresh buffer: the simulator donates the state, which must not own the factory's matrix
    D = jnp.array(np.asarray(D), dtype=dtype, copy=True)
    return KarulaState(theta, table, D, jnp.zeros((n, n), dtype), jnp.zeros((), jnp.int32))

  def round_fn(state, data, key, hparams):
    n = state.dissimilarity.shape[0]
    check_data_matches(data, n)
    s = n if clients_per_round is None else clients_per_round
    reference = jax.tree.map(lambda a: a[0], state.params)
    est = estimate_gradient(
      model,
      state.params,
      state.grad_table,
      data,
      key,
      clients_per_round=s,
      batch_size=batch_size,
      weighting=weighting,
      backend=resolved_backend(reference),
      chunk_size=chunk_size,
    )
    eta, t = hparams["eta"], hparams["t"]
    z = jax.tree.map(lambda p, g: p - eta * g, state.params, est.nu)
    proj = project(z, t * state.dissimilarity, state.multipliers)
    theta = proj.theta
    alpha = loss_weights(data.num_examples, weighting)[est.idx]
    moved = sum(
      jnp.sum((a - b) ** 2) for a, b in zip(jax.tree.leaves(theta), jax.tree.leaves(state.params))
    )
    metrics = {
      "train_loss": jnp.sum(alpha * est.losses) / jnp.sum(alpha),
      "train_loss_max": jnp.max(est.losses),
      "grad_norm": jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(est.nu))),
      # ||G_eta||^2 estimate of Theorem 4.4: ||theta^{k+1} - theta^k||^2 / eta^2
      "gradient_mapping_sq": moved / eta**2,
      "projection_iterations": jnp.asarray(proj.iterations, jnp.int32),
      # the method's own relative stopping residual (dual: certified relative duality gap)
      "projection_residual": jnp.asarray(proj.dual_residual),
      # max violation of the solver's iterate before the feasibility restoration
      "projection_violation": jnp.asarray(proj.primal_residual),
      "projection_converged": jnp.asarray(proj.converged).astype(jnp.int32),
      "restoration_scale": jnp.asarray(proj.restoration_scale),
      "projection_violation_rel": jnp.maximum(1.0 / proj.restoration_scale**2 - 1.0, 0.0),
      "constraint_violation": constraint_violation(theta, t, state.dissimilarity),
    }
    if projection == "dual":
      metrics["projection_certified_gap"] = jnp.asarray(proj.dual_residual)
    multipliers = proj.multipliers.astype(state.multipliers.dtype)
    return (
      KarulaState(theta, est.grad_table, state.dissimilarity, multipliers, state.round + 1),
      metrics,
    )

  config = {
    "dissimilarity": dissimilarity if isinstance(dissimilarity, str) else "precomputed",
    "ot_options": dict(ot_options or {})
    if isinstance(dissimilarity, str) and dissimilarity == "ot"
    else None,
    "clients_per_round": clients_per_round,
    "batch_size": batch_size,
    "projection": projection,
    "projection_tol": projection_tol,
    "projection_max_iterations": max_iterations,
    "warm_start": use_warm_start,
    "weighting": weighting,
    "backend": backend,
    "chunk_size": chunk_size,
  }

  def cost(data):
    n, p = data.num_clients, parameter_count(model)
    s = n if clients_per_round is None else min(clients_per_round, n)
    return Costs(one_gradient_each(s, p), setup=one_gradient_each(n, p))

  return build_algorithm(
    "karula",
    model,
    None,
    init,
    round_fn,
    HPARAMS,
    client_models=lambda s: s.params,
    personalized=True,
    cost=cost,
    releases=JOINT_PROJECTION,
    **config,
  )
