"""Smoothness of a linear model's objective, the unit of its step sizes.

For a linear model on features ``x`` (with a constant column appended when it fits an intercept)
the Hessian of the mean loss over a set of rows is bounded by ``c * M``, ``M = mean x x^T`` the
rows' second moment: ``c = 1`` for the squared loss ``0.5 (w.x + b - y)^2`` and ``c = 1/2`` for
the softmax cross-entropy (the softmax Jacobian ``diag(p) - p p^T`` has no eigenvalue above
``1/2``). So ``L = c * lambda_max(M)`` is the smoothness of the full-batch objective, and a
step of ``1 / L`` is the classical safe gradient step.

A minibatch objective of ``B`` rows is smoother or rougher than that, depending on its rows:
:func:`smoothness` also reports the mean over random batches of ``c * lambda_max(M_B)`` (``M_B``
the batch's second moment), the scale that governs local SGD with that batch size. ``c * mean
||x||^2`` (the trace) bounds both from above; it is the ``B = 1`` value.

``lambda_max`` is found by power iteration on ``v -> X^T (X v) / m`` (``M`` never formed), in
float64 NumPy; tested against :func:`numpy.linalg.eigvalsh`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from fedjax_dro.common.checks import choice, flag, integer, number

LOSS_CURVATURE = {"squared": 1.0, "softmax": 0.5}


class Smoothness(NamedTuple):
  """Smoothness constants of a linear model's objective (see the module docstring)."""

  full_batch: float  # c * lambda_max(mean x x^T) over all rows
  minibatch: Optional[float]  # mean over batches of c * lambda_max(batch second moment)
  batch_size: Optional[int]
  trace_bound: float  # c * mean ||x||^2, the B = 1 value, an upper bound of both


def top_eigenvalue(x, *, iterations: int = 1000, tol: float = 1e-12, seed: int = 0) -> float:
  """``lambda_max(X^T X / m)`` of the rows ``x`` ``[m, d]`` by power iteration (float64), stopped
  when the Rayleigh quotient changes by less than ``tol`` relatively or after ``iterations``."""
  x = np.asarray(x, np.float64)
  if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
    raise ValueError(f"x must be a non-empty [rows, features] array, got shape {x.shape}")
  if not np.all(np.isfinite(x)):
    raise ValueError("x must be finite")
  integer(iterations, "iterations")
  number(tol, "tol", minimum=0.0)
  m = x.shape[0]
  v = np.random.default_rng(seed).normal(size=x.shape[1])
  v /= np.linalg.norm(v)
  value = 0.0
  for _ in range(iterations):
    w = x.T @ (x @ v) / m
    new = float(v @ w)
    norm = np.linalg.norm(w)
    if norm == 0.0:
      return 0.0
    v = w / norm
    if abs(new - value) <= tol * abs(new):
      return new
    value = new
  return value


def smoothness(
  x,
  *,
  loss: str = "softmax",
  fit_intercept: bool = True,
  batch_size: Optional[int] = None,
  num_batches: int = 32,
  seed: int = 0,
) -> Smoothness:
  """The smoothness of a linear model's mean loss over the rows ``x`` ``[m, d]``: full batch, and
  (when ``batch_size`` is given) the mean over ``num_batches`` batches of ``batch_size`` rows
  drawn without replacement (seeded by ``seed``).

  Args:
    x: the training rows' features, ``[m, d]`` (all clients' rows together).
    loss: ``"softmax"`` (cross-entropy, curvature factor 1/2) or ``"squared"`` (factor 1).
    fit_intercept: append a constant feature (the model's bias).
    batch_size: rows of a local minibatch; ``None``: only the full-batch value.
    num_batches: batches averaged for the minibatch value.
    seed: seed of the power iterations' starts and of the batches.
  """
  choice(loss, "loss", tuple(LOSS_CURVATURE))
  flag(fit_intercept, "fit_intercept")
  x = np.asarray(x, np.float64)
  if x.ndim != 2 or x.shape[0] < 1:
    raise ValueError(f"x must be a non-empty [rows, features] array, got shape {x.shape}")
  if fit_intercept:
    x = np.hstack([x, np.ones((x.shape[0], 1))])
  c = LOSS_CURVATURE[loss]
  full = c * top_eigenvalue(x, seed=seed)
  trace = c * float(np.mean(np.sum(x * x, axis=1)))
  minibatch = None
  if batch_size is not None:
    batch_size = integer(batch_size, "batch_size", maximum=x.shape[0])
    num_batches = integer(num_batches, "num_batches")
    rng = np.random.default_rng(seed)
    values = [
      top_eigenvalue(x[rng.choice(x.shape[0], batch_size, replace=False)], seed=seed + 1 + k)
      for k in range(num_batches)
    ]
    minibatch = c * float(np.mean(values))
  return Smoothness(full, minibatch, batch_size, trace)
