"""Client dissimilarities ``D_ij`` from LOT embeddings (Karula, Sec. 3.2): the norms of
``Phi_i - Phi_j`` and the high-level :func:`dissimilarities` / :func:`dissimilarity_matrix`.

The embeddings, their conventions and defaults are documented in
:mod:`fedjax_dro.ot.embeddings`.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any, Dict, Literal, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.ot.embeddings import (
  DEFAULT_EPSILON,
  DEFAULT_MAX_ITERATIONS,
  DEFAULT_NUM_REFERENCE,
  DEFAULT_THRESHOLD,
  NORMS,
  ON_NONCONVERGENCE,
  REFERENCE_METHODS,
  SOLVERS,
  ConvergenceReport,
  DissimilarityOutput,
  SinkhornConvergenceError,
  SinkhornConvergenceWarning,
  as_float_array,
  check_choice,
  check_positive,
  check_reference,
  check_solver_args,
  client_point_clouds,
  default_float_dtype,
  ot_embeddings,
  reference_set,
)

# --------------------------------------------------------------------------------------------
# Distances between embeddings.
# --------------------------------------------------------------------------------------------


def _distance_fn(norm: str, n0: int):
  if norm == "l1":
    return lambda d: jnp.sum(jnp.abs(d))
  if norm == "w2":
    return lambda d: jnp.sqrt(jnp.sum(d * d))
  inv = 1.0 / math.sqrt(n0)
  return lambda d: inv * jnp.sum(jnp.sqrt(jnp.sum(d * d, axis=-1)))


@functools.partial(jax.jit, static_argnames=("norm",))
def _pairwise(emb, norm: str):
  dist = _distance_fn(norm, emb.shape[1])

  def row(phi_i):
    return jax.vmap(lambda phi_j: dist(phi_i - phi_j))(emb)

  # lax.map over rows keeps memory at O(n N0 p); |a - b| and (a - b)^2 are exactly symmetric.
  d = jax.lax.map(row, emb)
  return d * (1.0 - jnp.eye(emb.shape[0], dtype=d.dtype))


def pairwise_embedding_distances(embeddings, norm: Literal["w1", "l1", "w2"] = "w1") -> jax.Array:
  """``D_ij = ||Phi_i - Phi_j||`` for embeddings ``[n, N0, p]`` (see module doc for ``norm``).

  * ``"w1"`` (default): ``(1/sqrt(N0)) sum_k ||Phi_ik - Phi_jk||_2`` (= mean over reference
    points of ``||T_ik - T_jk||``; W1-like, upper bound on W1 for exact maps).
  * ``"l1"``: ``sum_{k,l} |Phi_ikl - Phi_jkl|`` (the paper's literal choice).
  * ``"w2"``: ``||Phi_i - Phi_j||_F`` (W2-like, classical LOT).

  The result is exactly symmetric with an exactly zero diagonal.
  """
  check_choice(norm, "norm", NORMS)
  emb = as_float_array(embeddings, "embeddings")
  if emb.ndim != 3 or min(emb.shape) < 1:
    raise ValueError(f"`embeddings` must have shape [n_clients, N0, p], got {emb.shape}.")
  if not np.all(np.isfinite(emb)):
    raise ValueError("`embeddings` contains NaN or infinite values.")
  return _pairwise(jnp.asarray(emb, dtype=default_float_dtype()), norm=norm)


# --------------------------------------------------------------------------------------------
# Presets.
# --------------------------------------------------------------------------------------------

#: ``preset`` name -> the values it sets (explicit keyword arguments override them).
PRESET_OPTIONS: Dict[str, Dict[str, Any]] = {
  # Karula paper, Sec. 3.2: d_X = Euclidean distance on (features, response), exact OT, the raw
  # (unstandardized) data, entrywise l1 norm of the embedding difference.  The default.
  "paper": {
    "include_response": True,
    "standardize": False,
    "norm": "l1",
    "cost": "euclidean",
    "solver": "exact",
  },
  # The default before the paper settings were (see the module doc of fedjax_dro.ot.embeddings):
  # pooled standardization, squared Euclidean cost, entropic OT (Sinkhorn), the W1-like norm.
  "entropic": {
    "include_response": True,
    "standardize": True,
    "norm": "w1",
    "cost": "sqeuclidean",
    "solver": "sinkhorn",
  },
}

#: Values of the preset-controlled arguments when neither a preset nor the argument is given:
#: the paper's (chosen by measured group separation, see the module doc of
#: :mod:`fedjax_dro.ot.embeddings`).
DEFAULT_OPTIONS: Dict[str, Any] = dict(PRESET_OPTIONS["paper"])

PRESETS: Tuple[str, ...] = tuple(PRESET_OPTIONS)


def resolve_options(preset: Optional[str] = None, **given) -> Dict[str, Any]:
  """The preset-controlled options: defaults, then ``preset``'s values, then ``given`` ones.

  ``given`` maps option names to the caller's values, ``None`` meaning "not given".  Raises
  ``TypeError`` / ``ValueError`` naming ``preset`` for an unknown preset.
  """
  options = dict(DEFAULT_OPTIONS)
  if preset is not None:
    if not isinstance(preset, str):
      raise TypeError(f"`preset` must be None or one of {list(PRESETS)}, got {preset!r}.")
    if preset not in PRESET_OPTIONS:
      raise ValueError(f"Unknown `preset`={preset!r}; expected None or one of {list(PRESETS)}.")
    options.update(PRESET_OPTIONS[preset])
  unknown = sorted(set(given) - set(DEFAULT_OPTIONS))
  if unknown:  # pragma: no cover - internal misuse
    raise TypeError(f"not preset-controlled options: {unknown}")
  options.update({k: v for k, v in given.items() if v is not None})
  return options


# --------------------------------------------------------------------------------------------
# High-level API.
# --------------------------------------------------------------------------------------------


def _handle_nonconvergence(report: ConvergenceReport, on_nonconvergence: str) -> None:
  conv = np.asarray(report.converged)
  if conv.all():
    return
  bad = np.flatnonzero(~conv)
  errs = np.asarray(report.errors)[bad]
  iters = np.asarray(report.n_iters)[bad]
  shown = ", ".join(
    f"{int(c)} (error {float(e):.3g} after {int(k)} iterations)"
    for c, e, k in zip(bad[:10], errs[:10], iters[:10])
  )
  more = f" and {bad.size - 10} more" if bad.size > 10 else ""
  msg = (
    f"Sinkhorn did not converge for {bad.size} of {conv.size} clients: {shown}{more} "
    f"(threshold {report.threshold:g}, absolute epsilon {float(report.epsilon):.3g}). "
    "Increase `epsilon` (regularization), `max_iterations`, or `threshold`; check the data "
    "scale (standardize=True)."
  )
  if on_nonconvergence == "raise":
    raise SinkhornConvergenceError(msg)
  warnings.warn(msg, SinkhornConvergenceWarning, stacklevel=3)


def dissimilarities(
  x,
  y,
  mask,
  *,
  key=None,
  reference=None,
  num_reference: int = DEFAULT_NUM_REFERENCE,
  reference_method: Literal["gaussian", "pooled"] = "gaussian",
  include_response: Optional[bool] = None,
  standardize: Optional[bool] = None,
  norm: Optional[Literal["w1", "l1", "w2"]] = None,
  epsilon: float = DEFAULT_EPSILON,
  relative_epsilon: bool = True,
  threshold: float = DEFAULT_THRESHOLD,
  max_iterations: int = DEFAULT_MAX_ITERATIONS,
  inner_iterations: int = 10,
  cost: Optional[Literal["sqeuclidean", "euclidean"]] = None,
  chunk_size: Optional[int] = None,
  on_nonconvergence: Literal["raise", "warn"] = "raise",
  solver: Optional[Literal["sinkhorn", "exact"]] = None,
  preset: Optional[str] = None,
) -> DissimilarityOutput:
  """Karula's OT-embedding dissimilarities with all intermediate results.

  Pipeline: :func:`client_point_clouds` -> :func:`reference_set` (unless ``reference`` is
  given) -> :func:`ot_embeddings` -> convergence check -> :func:`pairwise_embedding_distances`.

  Args:
    x: padded client features ``[n, m, ...]`` (see :func:`client_point_clouds`).
    y: padded client responses ``[n, m]``; may be ``None`` when ``include_response=False``.
    mask: ``[n, m]`` bool, the real (not padding) rows.
    key: ``jax.random`` key for the reference set; ``None`` means ``jax.random.key(0)``
      (deterministic).  Unused when ``reference`` is given.
    reference: optional ``[N0, p]`` user reference set, in the point-cloud space (after the
      response concatenation and standardization chosen here).
    num_reference: size of the reference set; see :func:`reference_set`.
    reference_method: how the reference set is drawn; see :func:`reference_set`.
    include_response: append the response to the features (see :func:`client_point_clouds`);
      ``None`` (default): the preset's value, else ``True``.
    standardize: standardize the point clouds (see :func:`client_point_clouds`); ``None``
      (default): the preset's value, else ``False``.
    norm: ``"l1"`` (default; paper's literal), ``"w1"`` or ``"w2"``; see module doc.
    epsilon: entropic regularization of Sinkhorn (see :func:`ot_embeddings`).
    relative_epsilon: ``epsilon`` as a fraction of the mean ground cost (default ``True``).
    threshold: Sinkhorn stopping tolerance on the l1 marginal error.
    max_iterations: maximum Sinkhorn iterations per client.
    inner_iterations: Sinkhorn iterations between two error evaluations (default 10).
    cost: ``"euclidean"`` or ``"sqeuclidean"`` ground cost; ``None`` (default): the preset's,
      else ``"euclidean"``.
    chunk_size: clients solved at once by Sinkhorn; ``None`` (default): all (vmap).
    solver: ``"exact"`` or ``"sinkhorn"``; ``None`` (default): the preset's, else ``"exact"``.
      ``epsilon`` ... ``inner_iterations`` and ``chunk_size`` only matter with ``"sinkhorn"``.
    on_nonconvergence: ``"raise"`` (default) raises :class:`SinkhornConvergenceError`,
      ``"warn"`` warns with :class:`SinkhornConvergenceWarning`; both name the clients.
    preset: ``None`` (default) or a name in :data:`PRESETS`, setting ``include_response``,
      ``standardize``, ``norm``, ``cost`` and ``solver`` (:data:`PRESET_OPTIONS`).
      ``"paper"``: the Karula paper's own choices -- Euclidean ``d_X`` on (features,
      response), unstandardized, exact OT (``solver="exact"``), entrywise ``"l1"`` norm.  Those
      five arguments default to ``None``, meaning "the preset's value, else the default"; any
      of them given explicitly overrides the preset.  The defaults *are* the ``"paper"`` values
      (chosen by measured group separation, see :mod:`fedjax_dro.ot.embeddings`);
      ``"entropic"`` gives the previous defaults (standardized, ``"sqeuclidean"``,
      ``"sinkhorn"``, ``"w1"``).

  Returns:
    :class:`DissimilarityOutput`.
  """
  opts = resolve_options(
    preset,
    include_response=include_response,
    standardize=standardize,
    norm=norm,
    cost=cost,
    solver=solver,
  )
  include_response, standardize = opts["include_response"], opts["standardize"]
  norm, cost, solver = opts["norm"], opts["cost"], opts["solver"]
  for name in ("include_response", "standardize"):
    if not isinstance(opts[name], (bool, np.bool_)):
      raise TypeError(f"`{name}` must be a bool, got {opts[name]!r}.")
  check_choice(norm, "norm", NORMS)
  check_choice(on_nonconvergence, "on_nonconvergence", ON_NONCONVERGENCE)
  check_choice(reference_method, "reference_method", REFERENCE_METHODS)
  check_choice(solver, "solver", SOLVERS)
  check_solver_args(  # fail fast, before any computation
    epsilon, relative_epsilon, threshold, max_iterations, inner_iterations, cost, chunk_size
  )
  if reference is None:
    check_positive(num_reference, "num_reference", integer=True)
  points, msk = client_point_clouds(
    x, y, mask, include_response=include_response, standardize=standardize
  )
  if reference is None:
    if key is None:
      key = jax.random.key(0)
    reference = reference_set(key, points, msk, num_reference, method=reference_method)
  else:
    reference = jnp.asarray(check_reference(reference, points.shape[-1]), points.dtype)
  emb, report = ot_embeddings(
    points,
    msk,
    reference,
    epsilon=epsilon,
    relative_epsilon=relative_epsilon,
    threshold=threshold,
    max_iterations=max_iterations,
    inner_iterations=inner_iterations,
    cost=cost,
    chunk_size=chunk_size,
    solver=solver,
  )
  _handle_nonconvergence(report, on_nonconvergence)
  finite = np.asarray(jnp.all(jnp.isfinite(emb), axis=(1, 2)))
  safe_emb = jnp.where(jnp.asarray(finite)[:, None, None], emb, 0.0)  # only reached with "warn"
  matrix = _pairwise(safe_emb, norm=norm)
  if not finite.all():
    matrix = jnp.where(jnp.asarray(finite)[:, None] & jnp.asarray(finite)[None, :], matrix, jnp.nan)
  return DissimilarityOutput(
    matrix=matrix,
    embeddings=emb,
    reference=jnp.asarray(reference),
    converged=report.converged,
    errors=report.errors,
    report=report,
  )


def dissimilarity_matrix(
  x,
  y,
  mask,
  *,
  key=None,
  reference=None,
  num_reference: int = DEFAULT_NUM_REFERENCE,
  norm: Optional[Literal["w1", "l1", "w2"]] = None,
  epsilon: float = DEFAULT_EPSILON,
  preset: Optional[str] = None,
  **kwargs,
) -> jax.Array:
  """``D [n_clients, n_clients]``: symmetric, zero diagonal, nonnegative dissimilarities.

  Thin wrapper around :func:`dissimilarities` (same keyword arguments, e.g.
  ``include_response``, ``standardize``, ``threshold``, ``max_iterations``, ``cost``,
  ``reference_method``, ``chunk_size``, ``solver``, ``on_nonconvergence="raise"|"warn"``,
  ``preset``) returning only the matrix.  The defaults are the paper's (``preset="paper"``):
  exact OT with the Euclidean cost on the raw (features, response) points and the entrywise
  ``"l1"`` norm of the embedding difference (its scale grows like ``sqrt(N0)``; ``norm="w1"``
  does not); see module doc.
  """
  return dissimilarities(
    x,
    y,
    mask,
    key=key,
    reference=reference,
    num_reference=num_reference,
    norm=norm,
    epsilon=epsilon,
    preset=preset,
    **kwargs,
  ).matrix


def validate_dissimilarity(
  D,
  n_clients: int,
  *,
  name: str = "D",
  atol: float = 1e-8,
  rtol: float = 1e-6,
) -> jax.Array:
  """Validates a precomputed dissimilarity matrix and returns it cleaned.

  Checks: numeric, shape ``[n_clients, n_clients]``, finite, nonnegative (``>= -atol``),
  symmetric (``|D - D^T| <= atol + rtol * max|D|``), zero diagonal (``|D_ii| <= atol``).
  Raises ``TypeError`` / ``ValueError`` naming ``name``.  Returns ``(D + D^T) / 2`` with the
  diagonal set to 0 and tiny negatives clipped to 0, in the default float dtype.
  """
  n_clients = check_positive(n_clients, "n_clients", integer=True)
  arr = as_float_array(D, name)
  if arr.dtype == np.bool_:
    raise TypeError(f"`{name}` must be a real-valued matrix, got dtype bool.")
  arr = arr.astype(np.float64)
  if arr.shape != (n_clients, n_clients):
    raise ValueError(
      f"`{name}` must be a square matrix of shape [n_clients, n_clients] = "
      f"{(n_clients, n_clients)}, got shape {arr.shape}."
    )
  if not np.all(np.isfinite(arr)):
    raise ValueError(f"`{name}` contains NaN or infinite values.")
  if arr.min() < -atol:
    i, j = np.unravel_index(np.argmin(arr), arr.shape)
    raise ValueError(f"`{name}` must be nonnegative; {name}[{i}, {j}] = {arr[i, j]:g}.")
  asym = np.abs(arr - arr.T)
  tol = atol + rtol * float(np.abs(arr).max())
  if asym.max() > tol:
    i, j = np.unravel_index(np.argmax(asym), arr.shape)
    raise ValueError(
      f"`{name}` must be symmetric; {name}[{i}, {j}] = {arr[i, j]:g} but "
      f"{name}[{j}, {i}] = {arr[j, i]:g}."
    )
  diag = np.abs(np.diag(arr))
  if diag.max() > atol:
    i = int(np.argmax(diag))
    raise ValueError(f"`{name}` must have a zero diagonal; {name}[{i}, {i}] = {arr[i, i]:g}.")
  cleaned = np.clip(0.5 * (arr + arr.T), 0.0, None)
  np.fill_diagonal(cleaned, 0.0)
  return jnp.asarray(cleaned, dtype=default_float_dtype())
