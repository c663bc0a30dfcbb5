"""Per-client evaluation and the summaries FL fairness papers report.

Each client is evaluated with *its own* model for personalized algorithms and with the global
model otherwise. Summaries (host-side, numpy): mean weighted by examples, unweighted mean over
clients, worst-20% (the average over the 20% of clients with the worst value — lowest accuracy /
R^2, highest loss / MSE; ``ceil(0.2 n)`` clients), best-20%, the worst single client, quantiles.

R^2 of a client whose test responses are constant (a single row, or all rows equal) is
*undefined*: its total sum of squares is 0, and ``1 - SSE / SST`` has no meaning (clamping SST
gave values like -2.6e30 that swamped every mean). :func:`evaluate_clients` reports it as NaN,
and :func:`summarize_all` leaves such clients out of every R^2 statistic and records how many
there were as ``"undefined"`` (present only when > 0; result files write the NaN as ``null``).
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.common.model import Model, per_client_eval
from fedjax_dro.core.clients import map_clients

HIGHER_IS_BETTER = {
  "accuracy": True,
  "r2": True,
  "loss": False,
  "mse": False,
  "estimation_error": False,
}
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
# metrics whose per-client NaN means "undefined for this client" (left out of the summaries)
UNDEFINED_AS_NAN = frozenset({"r2"})


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

  For a regression model, ``r2`` is NaN (undefined) for a client whose valid responses are all
  equal (:func:`constant_responses`), whatever the model predicts.
  """
  if personalized:
    fn = lambda p, x, y, m: per_client_eval(model, p, x, y, m)  # noqa: E731
    args = (params, data.x, data.y, data.mask)
  else:
    fn = lambda x, y, m: per_client_eval(model, params, x, y, m)  # noqa: E731
    args = (data.x, data.y, data.mask)
  out = map_clients(fn, *args, backend=backend, chunk_size=chunk_size)
  if "r2" in out and model.task == "regression":
    out["r2"] = jnp.where(constant_responses(data.y, data.mask), jnp.nan, out["r2"])
  return out


def constant_responses(y, mask) -> jnp.ndarray:
  """``[n]`` bool: client ``i``'s valid responses ``y[i, mask[i]]`` are all equal (every output),
  so their total sum of squares is 0 and R^2 is undefined (a single row is constant)."""
  yy = y.reshape(y.shape[0], y.shape[1], -1).astype(jnp.result_type(float))
  valid = mask[:, :, None]
  high = jnp.max(jnp.where(valid, yy, -jnp.inf), axis=1)
  low = jnp.min(jnp.where(valid, yy, jnp.inf), axis=1)
  return jnp.all(high == low, axis=-1)


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
  values, weights=None, higher_is_better: bool = True, fraction: float = 0.2, nan_undefined=False
) -> Dict[str, float]:
  """Summary statistics of a per-client metric vector.

  Args:
    values: ``[n]`` per-client values.
    weights: optional ``[n]`` weights of ``weighted_mean`` (the clients' example counts).
    higher_is_better: whether the worst clients are those with the lowest values.
    fraction: the fraction of clients averaged by ``worst20`` / ``best20`` (``ceil(fraction n)``).
    nan_undefined: NaN values mark clients where the metric is undefined (R^2 of constant
      responses): they are left out of every statistic, and ``"undefined"`` (their count) is added
      when there are any; if no value is defined, every statistic is NaN.
  """
  v = np.asarray(values, np.float64)
  if v.ndim != 1 or v.size == 0:
    raise ValueError(f"values must be a non-empty 1-D array, got shape {v.shape}")
  w = None if weights is None else np.asarray(weights, np.float64)
  undefined = 0
  if nan_undefined:
    defined = ~np.isnan(v)
    undefined = int(v.size - defined.sum())
    if undefined == v.size:
      nan = float("nan")
      out = {"mean": nan, "worst20": nan, "best20": nan, "worst": nan}
      if w is not None:
        out["weighted_mean"] = nan
      out.update({f"q{int(q * 100):02d}": nan for q in QUANTILES})
      out["undefined"] = undefined
      return out
    v = v[defined]
    w = None if w is None else w[defined]
  order = np.sort(v) if higher_is_better else np.sort(v)[::-1]  # worst first
  k = max(1, math.ceil(fraction * v.size))
  out = {
    "mean": float(np.mean(v)),
    "worst20": float(np.mean(order[:k])),
    "best20": float(np.mean(order[-k:])),
    "worst": float(order[0]),
  }
  if w is not None:
    out["weighted_mean"] = float(np.sum(w * v) / np.sum(w))
  for q in QUANTILES:
    out[f"q{int(q * 100):02d}"] = float(np.quantile(v, q))
  if undefined:
    out["undefined"] = undefined
  return out


def summarize_all(
  per_client: Dict[str, np.ndarray], num_examples=None
) -> Dict[str, Dict[str, float]]:
  """:func:`summarize` of every metric (R^2's NaN: undefined clients, left out and counted)."""
  return {
    name: summarize(
      vals,
      num_examples,
      HIGHER_IS_BETTER.get(name, True),
      nan_undefined=name in UNDEFINED_AS_NAN,
    )
    for name, vals in per_client.items()
  }


import jax.flatten_util  # noqa: E402  (registers jax.flatten_util)


def class_weighted_accuracy(per_class_accuracy, proportions) -> np.ndarray:
  """Client ``i``'s expected accuracy under its own label distribution,
  ``sum_c proportions[i, c] * per_class_accuracy[c]`` (float64 ``[n]``).

  Why: with 100 label-skewed clients, a client's own test set has a handful of images (a few per
  class it holds), so its empirical accuracy -- and above all the *worst* client's -- is dominated
  by sampling noise (one image flips it by 10-30 points). Measuring per-class accuracy once on a
  balanced global test set (~54 images per class for the digits) and reweighting it by each
  client's label mix gives the same expectation with far less variance, and is how worst-client
  accuracy is scored for :func:`fedjax_dro.data.digits_dirichlet`.

  Args:
    per_class_accuracy: ``[num_classes]`` accuracies in ``[0, 1]``.
    proportions: ``[n, num_classes]`` non-negative rows summing to 1 (see
      :func:`fedjax_dro.data.label_proportions`).
  """
  acc = np.asarray(per_class_accuracy)
  props = np.asarray(proportions)
  for name, arr in (("per_class_accuracy", acc), ("proportions", props)):
    if arr.dtype.kind not in "biuf":
      raise TypeError(f"{name} must be a real array, got dtype {arr.dtype}")
  acc, props = acc.astype(np.float64), props.astype(np.float64)
  if acc.ndim != 1:
    raise ValueError(f"per_class_accuracy must be 1-D [num_classes], got shape {acc.shape}")
  if props.ndim != 2 or props.shape[1] != acc.shape[0]:
    raise ValueError(
      f"proportions must be [n, num_classes={acc.shape[0]}], got shape {props.shape}"
    )
  if not np.all(np.isfinite(acc)) or np.any((acc < 0) | (acc > 1)):
    raise ValueError(f"per_class_accuracy must be finite and in [0, 1], got {acc.tolist()}")
  if not np.all(np.isfinite(props)) or np.any(props < 0):
    raise ValueError("proportions must be finite and non-negative")
  sums = props.sum(1)
  if not np.allclose(sums, 1.0, atol=1e-6):
    bad = np.flatnonzero(~np.isclose(sums, 1.0, atol=1e-6))
    raise ValueError(
      f"proportions rows must sum to 1: rows {bad[:10].tolist()} sum to {sums[bad[:10]].tolist()}"
    )
  return props @ acc
