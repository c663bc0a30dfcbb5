"""Comparisons judged on held-out domains: selection and report on other clients than training's.

WILDS' protocol (Koh et al., "WILDS: A Benchmark of in-the-Wild Distribution Shifts", ICML 2021)
trains on some domains and selects and reports on others: Camelyon17's hospital 1 validates and
hospital 2 tests a model trained on hospitals 0, 3 and 4; iWildCam's and PovertyMap's
out-of-distribution splits hold other camera traps and other countries. With
``Protocol(selection="domains")`` an experiment's ``data(seed)`` returns a
:class:`~fedjax_dro.data.FederatedDataset` whose ``train`` is the training federation and whose
``validation`` and ``test`` are splits of *other* clients (prepared splits streamed by
:func:`~fedjax_dro.data.load_prepared`, or device-resident data). Each configuration is trained on
the training federation and its global model is scored on the validation split by the
dataset's own metric (:func:`fedjax_dro.core.split_eval.evaluate_split`: ``accuracy``,
``macro_f1``, ``worst_group_accuracy``, ``worst_group_pearson_r``, ``worst_log_perplexity``, ...,
named by ``Metric(name, stat="split")``); the chosen configuration's final run is scored the same
way on the test split, with every other metric of the split as extra columns.

A held-out split may also score itself: an object (a pytree of arrays, for the run records'
digest) with a method ``split_metrics(model, params) -> {name: value}`` is evaluated by it, not by
:func:`~fedjax_dro.core.split_eval.evaluate_split` (FGDRO Table 7's balanced held-out set, whose
worst-client accuracy weighs each class by every training client's label mix).
"""

from __future__ import annotations

import hashlib
import itertools
import math
from typing import Any, Dict, List

import jax
import numpy as np

from fedjax_dro.compare.protocol import ExtraMetric, higher_is_better, integral


def _streamed(data):
  """``data`` as a streamed split (device-resident data wrapped by nothing: refused)."""
  if not getattr(data, "streamed", False):
    raise TypeError(
      "selection='domains' evaluates prepared splits: data(seed).validation and .test must be "
      "load_prepared(...) splits or held-out sets with split_metrics(model, params), got "
      f"{type(data).__name__}"
    )
  return data


def split_summary(alg, state, data, *, batch_size: int = 256) -> Dict[str, float]:
  """The dataset metrics of ``state``'s global model on the split ``data`` (every row)."""
  return _global_summary(alg, _global_model(alg, state), data, batch_size)


def _global_model(alg, state):
  if alg.personalized:
    raise ValueError(
      f"{alg.name} is personalized: its per-client models have no model for held-out domains "
      "(selection='domains' compares global models)"
    )
  return alg.client_models(state)


def _global_summary(alg, params, data, batch_size: int = 256) -> Dict[str, float]:
  from fedjax_dro.core.split_eval import evaluate_split

  if callable(getattr(data, "split_metrics", None)):  # a held-out set that scores itself
    return {k: float(v) for k, v in data.split_metrics(alg.model, params).items()}
  out = evaluate_split(alg.model, params, _streamed(data), batch_size=batch_size)
  return {k: float(v) for k, v in out["summary"].items()}


def _kept(trained, key, train_fn):
  """``train_fn()``, or what it returned before for ``key`` in ``trained`` (``None``: no
  keeping); the key holds the algorithm and the training data by identity, kept alive beside."""
  if trained is None:
    return train_fn()
  if key not in trained:
    trained[key] = train_fn()
  return trained[key]


def domain_points(
  alg,
  train,
  validation,
  grid: Dict[str, List[float]],
  *,
  rounds,
  seed,
  metric,
  hparams,
  trained=None,
) -> List[Dict[str, Any]]:
  """Every point of the product ``grid`` (hyper-parameters of ``alg``) trained on ``train`` in one
  vmapped sweep and scored on ``validation`` by ``metric.name``: ``[{"hparams", "score", "se"}]``
  in grid order (a diverged configuration scores NaN). ``trained``: a dict where the sweep is
  kept for comparisons of other metrics on the same algorithm and data (``compare(trained=)``)."""
  from fedjax_dro.engine.sweeps import sweep

  def train_fn():  # each point's global model (None: diverged)
    res = sweep(
      alg, train, rounds=rounds, grid=grid, seeds=[seed], hparams=hparams, eval_every=rounds
    )
    states = [jax.tree.map(lambda a, r=r: a[r], res.final_state) for r in range(len(res.configs))]
    models = [None if d else _global_model(alg, st) for st, d in zip(states, res.diverged)]
    return alg, train, list(zip(res.configs, models))

  key = ("grid", id(alg), id(train), rounds, seed, repr(sorted(grid.items())), repr(hparams))
  out = []
  for config, params in _kept(trained, key, train_fn)[2]:
    score = math.nan
    if params is not None:
      summary = _global_summary(alg, params, validation)
      if metric.name not in summary:
        raise ValueError(
          f"metric {metric.name!r} is not a metric of this split; available: {sorted(summary)}"
        )
      score = summary[metric.name]
    out.append({"hparams": dict(config["hparams"]), "score": float(score), "se": math.nan})
  return out


def domain_evaluate(
  build, strategy, train, splits, subgrid, options, rounds, seed, metric, trained=None
):
  """``select``'s scores of ``subgrid`` under ``selection="domains"``: each combination of the
  factory options, its hyper-parameter grid in one sweep on the training clients, scored on the
  held-out domains (:func:`fedjax_dro.compare.domains.domain_points`)."""
  names = list(subgrid)
  hp = [k for k in names if k not in options]
  points = []
  for combo in itertools.product(*[subgrid[k] for k in options]) or [()]:
    opts = {k: integral(v) for k, v in zip(options, combo)}
    found = domain_points(
      build(**opts),
      train,
      splits[0][1],
      {k: [float(v) for v in subgrid[k]] for k in hp},
      rounds=rounds,
      seed=seed,
      metric=metric,
      hparams=dict(strategy.fixed) or None,
      trained=trained,
    )
    points += [{**p, "hparams": {**opts, **p["hparams"]}} for p in found]
  order = {tuple(p["hparams"][k] for k in names): p for p in points}
  return [
    order[tuple(integral(v) if k in options else float(v) for k, v in zip(names, c))]
    for c in itertools.product(*subgrid.values())
  ]


def domain_final(alg, train, test, rounds, seed, hparams, trained=None) -> Dict[str, float]:
  """The final run: ``alg`` with ``hparams`` trained on ``train`` for ``rounds`` rounds with
  ``seed``, its global model's metrics on the split ``test`` (``trained``: the run kept for, or
  taken from, comparisons of other metrics, as in :func:`domain_points`)."""
  from fedjax_dro.engine.runner import run

  def train_fn():
    hist = run(alg, train, rounds=rounds, seed=seed, hparams=hparams or None, eval_every=rounds)
    return alg, train, _global_model(alg, hist.final_state)

  key = ("final", id(alg), id(train), rounds, seed, repr(sorted((hparams or {}).items())))
  return _global_summary(alg, _kept(trained, key, train_fn)[2], test)


def domain_digest(ds) -> str:
  """SHA-256 over the prepared splits' manifests (their arrays' checksums) of ``ds``."""
  h = hashlib.sha256()
  for part in (ds.train, ds.validation, ds.test):
    store = getattr(part, "store", None)
    if store is None:
      for leaf in jax.tree.leaves(part):
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{a.dtype.str}{a.shape}".encode() + a.tobytes())
      continue
    entry = store.manifest["splits"][store.split]
    h.update(store.split.encode())
    for name in sorted(entry["arrays"]):
      h.update(f"{name}:{entry['arrays'][name]['sha256']}".encode())
  return h.hexdigest()


def _from_split(models, dataset):
  raise ValueError(
    "a split metric is computed by the harness from the held-out split (selection='domains'); "
    "it cannot be computed from the models alone"
  )


def split_metric(name: str):
  """An :class:`~fedjax_dro.compare.ExtraMetric` column of a further metric of the held-out
  test split (``selection="domains"``: e.g. ``pearson_r`` beside ``worst_group_pearson_r``)."""
  return ExtraMetric(name, _from_split, higher_is_better=higher_is_better(name))
