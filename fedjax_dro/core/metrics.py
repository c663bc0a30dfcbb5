"""Per-client evaluation and the summaries FL fairness papers report.

Each client is evaluated with *its own* model for personalized algorithms and with the global
model otherwise. Summaries (host-side, numpy): mean weighted by examples, unweighted mean over
clients, worst-20% (the average over the 20% of clients with the worst value — lowest accuracy /
R^2, highest loss / MSE; ``ceil(0.2 n)`` clients), best-20%, the worst single client, quantiles.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.core.clients import map_clients
from fedjax_dro.models.base import Model, per_client_eval

HIGHER_IS_BETTER = {
  "accuracy": True,
  "r2": True,
  "loss": False,
  "mse": False,
  "estimation_error": False,
}
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def evaluate_clients(
  model: Model,
  params,
  data,
  personalized: bool,
  *,
  backend: str = "auto",
  chunk_size: Optional[int] = None,
) -> Dict[str, jnp.ndarray]:
  """Per-client metrics ``{name: [n]}`` of ``params`` on ``data`` (jit-able).

  ``params`` is one global model (``personalized=False``) or ``[n, ...]`` stacked per-client models.
  The clients run through :func:`~fedjax_dro.core.clients.map_clients` with ``backend``: the
  default ``"auto"`` evaluates all clients at once when their activations fit in the device's
  memory budget and in chunks of clients otherwise (10,000 CNN clients' activations do not fit
  at once). A global model is shared by the clients of a chunk, so JAX's batching folds the
  client axis into the batch: one matmul (one convolution) over all the chunk's rows, not one
  per client.
  """
  if personalized:
    fn = lambda p, x, y, m: per_client_eval(model, p, x, y, m)  # noqa: E731
    args = (params, data.x, data.y, data.mask)
  else:
    fn = lambda x, y, m: per_client_eval(model, params, x, y, m)  # noqa: E731
    args = (data.x, data.y, data.mask)
  return map_clients(fn, *args, backend=backend, chunk_size=chunk_size)


def estimation_error(params, true_params, personalized: bool) -> Optional[jnp.ndarray]:
  """``[n]`` squared distance ``||theta_i - theta_i^*||^2`` to the true per-client parameters.

  The model's parameters are raveled per client; returns None if the sizes do not match.
  """
  if true_params is None:
    return None
  true_params = jnp.asarray(true_params)
  if personalized:
    flat = jax.vmap(lambda p: jax.flatten_util.ravel_pytree(p)[0])(params)
  else:
    flat = jax.flatten_util.ravel_pytree(params)[0][None, :]
  if flat.shape[-1] != true_params.shape[-1]:
    return None
  return jnp.sum((flat - true_params.astype(flat.dtype)) ** 2, axis=-1)


def summarize(
  values, weights=None, higher_is_better: bool = True, fraction: float = 0.2
) -> Dict[str, float]:
  """Summary statistics of a per-client metric vector."""
  v = np.asarray(values, np.float64)
  if v.ndim != 1 or v.size == 0:
    raise ValueError(f"values must be a non-empty 1-D array, got shape {v.shape}")
  order = np.sort(v) if higher_is_better else np.sort(v)[::-1]  # worst first
  k = max(1, math.ceil(fraction * v.size))
  out = {
    "mean": float(np.mean(v)),
    "worst20": float(np.mean(order[:k])),
    "best20": float(np.mean(order[-k:])),
    "worst": float(order[0]),
  }
  if weights is not None:
    w = np.asarray(weights, np.float64)
    out["weighted_mean"] = float(np.sum(w * v) / np.sum(w))
  for q in QUANTILES:
    out[f"q{int(q * 100):02d}"] = float(np.quantile(v, q))
  return out


def summarize_all(
  per_client: Dict[str, np.ndarray], num_examples=None
) -> Dict[str, Dict[str, float]]:
  return {
    name: summarize(vals, num_examples, HIGHER_IS_BETTER.get(name, True))
    for name, vals in per_client.items()
  }


import jax.flatten_util  # noqa: E402  (registers jax.flatten_util)
