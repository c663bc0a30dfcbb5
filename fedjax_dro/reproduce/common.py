"""Helpers shared by the reproductions (``fedjax-dro reproduce NAME``)."""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp


def with_distances(alg, x_stars: Sequence[Any], prefix: str = "dist_to_opt"):
  """``alg`` whose round metrics also hold ``{prefix}_{k} = ||x^{r+1} - x_stars[k]||^2``.

  The distance is computed from ``alg.client_models(state)`` after the round, inside the jitted
  round (no stored trajectory).
  """
  from fedjax_dro.solvers.saddle import distance_to_optimum

  if alg.personalized:
    raise ValueError(f"with_distances needs a global-model algorithm, {alg.name} is personalized")
  x_stars = [jax.tree.map(jnp.asarray, x) for x in x_stars]

  def round_fn(state, data, key, hparams):
    state, metrics = alg.round(state, data, key, hparams)
    params = alg.client_models(state)
    metrics = dict(metrics)
    for k, x in enumerate(x_stars):
      metrics[f"{prefix}_{k}"] = distance_to_optimum(params, x)
    return state, metrics

  return alg._replace(round=round_fn)
