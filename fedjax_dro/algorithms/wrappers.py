"""Metric wrappers: an algorithm whose round also reports measurements of its models.

Each wrapper returns the algorithm with its ``round`` replaced by one that runs the original
round, then computes further metrics from ``alg.client_models(state)`` inside the same jitted
round (no stored trajectory, nothing on the host): the distance to known optima
(:func:`with_distances`), per-class accuracy on held-out sets (:func:`with_per_class_accuracy`)
and the worst class / worst client accuracies of a label-skewed federation
(:func:`with_class_weighted_accuracy`). They are small combinators over
:func:`with_round_metrics`; the reproductions apply them to the algorithms they compare.
:func:`with_tied_hparams` instead ties hyper-parameters to others (``tau = J * client_lr``), so
that a grid searches the free ones only.

The held-out arrays are closed over by the round, so they are constants of its compiled program:
fine for the held-out sets of a paper's table (thousands of rows), not for large ones.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Sequence

import jax
import jax.numpy as jnp

from fedjax_dro.common.checks import is_real


def with_round_metrics(alg, metrics_fn: Callable[[Any], Dict[str, Any]]):
  """``alg`` whose round metrics also hold ``metrics_fn(params)``, ``params`` the models after
  the round (``alg.client_models(state)``: the global model, or the stacked client models of a
  personalized algorithm); a name already in the round's metrics is replaced."""

  def round_fn(state, data, key, hparams, **release):  # the release passed on (fd.private)
    state, metrics = alg.round(state, data, key, hparams, **release)
    return state, {**metrics, **metrics_fn(alg.client_models(state))}

  return alg._replace(round=round_fn)


def with_tied_hparams(alg, **ties):
  """``alg`` with some hyper-parameters set from others: ``name=(source, factor, power)`` sets
  ``name = factor * hparams[source] ** power`` in every round (``tau=("client_lr", 10.0, 1)``:
  ``tau = 10 client_lr``; ``L=("client_lr", 1.0, -1)``: ``L = 1 / client_lr``). The tied names
  leave ``alg.hparams`` (a grid or ``hparams=`` naming them is refused as for any unknown name);
  ``alg.config["tied_hparams"]`` records the ties.

  Args:
    alg: the :class:`~fedjax_dro.algorithms.Algorithm`.
    ties: ``name=(source, factor, power)``, ``source`` a hyper-parameter of ``alg`` that is
      not itself tied, ``factor`` a positive number, ``power`` a non-zero number.
  """
  from fedjax_dro.algorithms.base import Algorithm

  if not isinstance(alg, Algorithm):
    raise TypeError(f"alg must be an Algorithm, got {type(alg).__name__}")
  if not ties:
    raise ValueError("with_tied_hparams needs at least one tie name=(source, factor, power)")
  spec = {}
  for name, tie in ties.items():
    if name not in alg.hparams:
      raise ValueError(
        f"tied hyper-parameter {name!r} is not one of {alg.name!r}'s {sorted(alg.hparams)}"
      )
    if not (isinstance(tie, tuple) and len(tie) == 3):
      raise TypeError(f"tie {name!r} must be a tuple (source, factor, power), got {tie!r}")
    source, factor, power = tie
    if source not in alg.hparams or source in ties:
      raise ValueError(
        f"tie {name!r}: source {source!r} must be an untied hyper-parameter of {alg.name!r} "
        f"({sorted(set(alg.hparams) - set(ties))})"
      )
    for what, value in (("factor", factor), ("power", power)):
      if not is_real(value) or value == 0:
        raise ValueError(f"tie {name!r}: {what} must be a non-zero number, got {value!r}")
    if factor < 0:
      raise ValueError(f"tie {name!r}: factor must be > 0, got {factor!r}")
    spec[name] = (source, float(factor), float(power))

  def round_fn(state, data, key, hparams, **release):  # the release passed on (fd.private)
    full = dict(hparams)
    for name, (source, factor, power) in spec.items():
      full[name] = factor * hparams[source] ** power
    return alg.round(state, data, key, full, **release)

  free = {k: v for k, v in alg.hparams.items() if k not in spec}
  config = {**alg.config, "tied_hparams": {k: list(v) for k, v in spec.items()}}
  return alg._replace(round=round_fn, hparams=free, config=config)


def with_distances(alg, x_stars: Sequence[Any], prefix: str = "dist_to_opt"):
  """``alg`` whose round metrics also hold ``{prefix}_{k} = ||x^{r+1} - x_stars[k]||^2``, the
  squared distance of the global model after the round to each given optimum."""
  from fedjax_dro.solvers.saddle import distance_to_optimum

  if alg.personalized:
    raise ValueError(f"with_distances needs a global-model algorithm, {alg.name} is personalized")
  x_stars = [jax.tree.map(jnp.asarray, x) for x in x_stars]
  return with_round_metrics(
    alg,
    lambda params: {f"{prefix}_{k}": distance_to_optimum(params, x) for k, x in enumerate(x_stars)},
  )


def per_class_accuracy(model, params, x, y, num_classes: int, dtype=jnp.float32):
  """``(acc [num_classes], present [num_classes])``: the accuracy of ``model`` at ``params`` on
  the rows of each class of ``y`` (0 for a class without rows) and which classes have rows."""
  correct = (jnp.argmax(model.apply(params, x), -1) == y).astype(dtype)
  onehot = jax.nn.one_hot(y, num_classes, dtype=dtype)
  counts = onehot.sum(0)
  return (onehot.T @ correct) / jnp.maximum(counts, 1.0), counts > 0


def _holdout_sets(holdouts: Dict[str, Any]):
  return {k: (jnp.asarray(x), jnp.asarray(y)) for k, (x, y) in holdouts.items()}


def with_per_class_accuracy(alg, holdouts: Dict[str, Any], num_classes: int):
  """``alg`` whose round metrics also hold ``{name}_class_acc`` (``[num_classes]``) for each
  held-out set ``holdouts[name] = (x, y)``: the global model's accuracy on each class after the
  round (client accuracies are formed from it on the host)."""
  sets = _holdout_sets(holdouts)
  return with_round_metrics(
    alg,
    lambda params: {
      f"{name}_class_acc": per_class_accuracy(alg.model, params, x, y, num_classes)[0]
      for name, (x, y) in sets.items()
    },
  )


def with_class_weighted_accuracy(alg, holdouts: Dict[str, Any], proportions, num_classes: int):
  """``alg`` whose round metrics also hold, for each held-out set ``holdouts[name] = (x, y)``,
  the accuracies of the global model after the round:

  * ``{name}_worst_class_acc``: ``min_c acc_c`` over the classes present in ``y``;
  * ``{name}_worst_acc``: the worst client, ``min_i sum_c p_ic acc_c`` (client ``i``'s expected
    accuracy under its own label mix ``p_i = proportions[i]``);
  * ``{name}_avg_acc``: the clients' average, ``mean_i sum_c p_ic acc_c``;
  * ``{name}_class_avg_acc``: ``mean_c acc_c`` (the accuracy on a balanced test set).
  """
  proportions = jnp.asarray(proportions)
  sets = _holdout_sets(holdouts)

  def metrics(params):
    out = {}
    for name, (x, y) in sets.items():
      acc, present = per_class_accuracy(alg.model, params, x, y, num_classes, proportions.dtype)
      client_acc = proportions @ acc
      out[f"{name}_worst_class_acc"] = jnp.min(jnp.where(present, acc, jnp.inf))
      out[f"{name}_worst_acc"] = jnp.min(client_acc)
      out[f"{name}_avg_acc"] = jnp.mean(client_acc)
      out[f"{name}_class_avg_acc"] = jnp.sum(jnp.where(present, acc, 0.0)) / jnp.sum(present)
    return out

  return with_round_metrics(alg, metrics)
