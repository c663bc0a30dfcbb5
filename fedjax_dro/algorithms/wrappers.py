"""Metric wrappers: an algorithm whose round also reports measurements of its models.

Each wrapper returns the algorithm with its ``round`` replaced by one that runs the original
round, then computes further metrics from ``alg.client_models(state)`` inside the same jitted
round (no stored trajectory, nothing on the host): the distance to known optima
(:func:`with_distances`), per-class accuracy on held-out sets (:func:`with_per_class_accuracy`)
and the worst class / worst client accuracies of a label-skewed federation
(:func:`with_class_weighted_accuracy`). They are small combinators over
:func:`with_round_metrics`; the reproductions apply them to the algorithms they compare.
:func:`with_tied_hparams` instead ties hyper-parameters to others (``tau = J * client_lr``), so
that a grid searches the free ones only, and :func:`with_fixed_domain_weights` stops an FGDRO
algorithm's weight estimators after a first phase (the Pile protocol of FGDRO's Table 2).

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


def with_fixed_domain_weights(alg, weight_rounds: int, estimators: Sequence[str]):
  """``alg`` whose domain weights are learned for ``weight_rounds`` rounds, then kept fixed.

  FGDRO's Pile protocol (Guo and Yang, arXiv:2410.06369, Sec. 7: "our FGDRO algorithms for Pile
  initially train for 20K iterations to obtain domain weights, which are then fixed during
  subsequent training phases", following DoReMi, Xie et al. 2023). The FGDRO algorithms weight
  client ``i``'s gradient by estimators they carry in their state: FGDRO-KL and FGDRO-KL-Adam by
  ``exp(u_i / lambda) / v_bar`` (``u_i`` the client's moving-average loss, ``v_bar`` the
  estimate of ``mean_j exp(u_j / lambda)``), FGDRO-CVaR by ``1[u_i > s]`` (``s`` the averaged
  threshold). From round ``weight_rounds`` on (the state's ``round`` counter, so a resumed run
  switches at the same round) the moving-average weights that advance those estimators,
  ``estimators``, are set to 0: ``u``, ``v_bar`` and ``s`` keep their values at the end of the
  first phase exactly (``(1 - 0) u + 0 l = u``; ``log v`` through ``logaddexp(log v, -inf)``), and
  every later round is the same algorithm, from the same model and moments, on the fixed weights.

  Readings (stated with the Pile table): the weights are the algorithm's own at the end of the
  first phase, not renormalised and not averaged over that phase (DoReMi averages its proxy
  model's weights over its steps; FGDRO's ``u`` and ``v`` are already moving averages); training
  continues from the first phase's model (the paper's "subsequent training phases"), within the
  same budget of rounds as every other row. The round metric ``weights_fixed`` is 1 in the
  rounds with fixed weights.

  Args:
    alg: an :class:`~fedjax_dro.algorithms.Algorithm` whose state has a ``round`` counter.
    weight_rounds: rounds of the first phase (>= 0; 0: fixed from the start, at their initial
      values).
    estimators: hyper-parameters of ``alg`` set to 0 after the first phase: ``("beta1",
      "beta2")`` for FGDRO-KL and FGDRO-KL-Adam, ``("beta1", "threshold_lr")`` for FGDRO-CVaR.
  """
  from fedjax_dro.algorithms.base import Algorithm
  from fedjax_dro.common.checks import is_int

  if not isinstance(alg, Algorithm):
    raise TypeError(f"alg must be an Algorithm, got {type(alg).__name__}")
  if not is_int(weight_rounds) or weight_rounds < 0:
    raise ValueError(f"weight_rounds must be an integer >= 0, got {weight_rounds!r}")
  if isinstance(estimators, str) or not estimators:
    raise TypeError(f"estimators must be a non-empty sequence of names, got {estimators!r}")
  unknown = [k for k in estimators if k not in alg.hparams]
  if unknown:
    raise ValueError(
      f"estimators {unknown} are not hyper-parameters of {alg.name!r} ({sorted(alg.hparams)})"
    )
  estimators = tuple(estimators)
  weight_rounds = int(weight_rounds)

  def round_fn(state, data, key, hparams, **release):  # the release passed on (fd.private)
    if not hasattr(state, "round"):
      raise TypeError(f"with_fixed_domain_weights: {alg.name}'s state has no round counter")
    fixed = state.round >= weight_rounds
    full = dict(hparams)
    for k in estimators:
      full[k] = jnp.where(fixed, jnp.zeros_like(hparams[k]), hparams[k])
    state, metrics = alg.round(state, data, key, full, **release)
    return state, {**metrics, "weights_fixed": fixed.astype(jnp.int32)}

  config = {
    **alg.config,
    "fixed_domain_weights": {"weight_rounds": weight_rounds, "estimators": list(estimators)},
  }
  return alg._replace(round=round_fn, config=config)


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
