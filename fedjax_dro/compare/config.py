"""A comparison as a TOML file: ``fedjax-dro compare CONFIG.toml``.

::

    name = "ridge"                          # file stem of the outputs
    description = "FedAvg against FedSGD at equal uploads"

    [data]
    dataset = "synthetic-ridge"             # a registered dataset (fedjax-dro list)
    options = { num_clients = 30 }          # keyword arguments of its loader (optional)

    [protocol]
    seeds = [0, 1, 2]
    metric = "r2"                           # the reported per-client test metric ...
    stat = "mean"                           # ... and its summary over clients
    selection = "kfold"                     # or "holdout"
    folds = 3
    reference = "FedAvg"
    budget = { kind = "uploads", match = "FedAvg", rounds = 50 }

    [[strategy]]
    label = "FedAvg"
    algorithm = "fedavg"                    # a registered algorithm
    settings = { local_steps = 10, clients_per_round = 10 }
    grid = { client_lr = [0.01, 0.03, 0.1] }
    fixed = { server_lr = 1.0 }

    [[strategy]]
    label = "FedSGD"
    algorithm = "fedsgd"
    settings = { clients_per_round = 10 }
    grid = { lr = [0.1, 0.3, 1.0] }

The model is the dataset's default model. ``[protocol]`` takes the fields of
:class:`~fedjax_dro.compare.Protocol` (``budget`` those of :class:`~fedjax_dro.compare.Budget`);
a strategy takes ``label``, ``algorithm``, ``settings`` (factory settings), ``grid`` (or
``grids``: a list of grids), ``fixed``, ``widen``, ``note`` and ``paper``. An unknown key, a
wrong type or an unknown algorithm, dataset, setting or hyper-parameter is one ``ValueError``
naming the key.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from typing import Any, Dict

from fedjax_dro.compare.protocol import Budget, Experiment, Metric, Protocol, Strategy

TOP_KEYS = ("name", "description", "data", "protocol", "strategy")
DATA_KEYS = ("dataset", "options")
STRATEGY_KEYS = (
  "label",
  "algorithm",
  "settings",
  "grid",
  "grids",
  "fixed",
  "widen",
  "note",
  "paper",
)
PROTOCOL_KEYS = tuple(f.name for f in dataclasses.fields(Protocol)) + ("stat",)
BUDGET_KEYS = tuple(f.name for f in dataclasses.fields(Budget))


def _unknown(where: str, table: Dict[str, Any], allowed) -> None:
  if not isinstance(table, dict):
    raise ValueError(f"{where} must be a table, got {type(table).__name__}")
  bad = sorted(set(table) - set(allowed))
  if bad:
    raise ValueError(f"unknown key {where}.{bad[0]} in the config; {where} takes {list(allowed)}")


def _required(where: str, table, key):
  if key not in table:
    raise ValueError(f"the config needs {where}.{key}")
  return table[key]


def load_config(path: str) -> Dict[str, Any]:
  """The parsed TOML of ``path`` (a ``ValueError`` naming the file and line when it is not TOML)."""
  import tomllib

  path = os.fspath(path)
  if not os.path.isfile(path):
    raise ValueError(f"config {path!r} is not an existing file")
  with open(path, "rb") as f:
    try:
      return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
      raise ValueError(f"config {path!r} is not valid TOML: {e}") from None


def _strategy(k: int, spec: Dict[str, Any]) -> Strategy:
  from fedjax_dro.algorithms import get_algorithm

  where = f"strategy[{k}]"
  _unknown(where, spec, STRATEGY_KEYS)
  label = _required(where, spec, "label")
  name = _required(where, spec, "algorithm")
  if not isinstance(label, str) or not isinstance(name, str):
    raise ValueError(f"{where}.label and {where}.algorithm must be strings")
  try:
    factory = get_algorithm(name).factory
  except ValueError as e:
    raise ValueError(f"{where}.algorithm: {e}") from None
  settings = spec.get("settings", {})
  _unknown(f"{where}.settings", settings, _factory_keywords(factory))
  if "grid" in spec and "grids" in spec:
    raise ValueError(f"{where}: give grid or grids, not both")
  grid = spec.get("grids", spec.get("grid", {}))
  if "grids" in spec and not isinstance(grid, list):
    raise ValueError(f"{where}.grids must be a list of tables")
  fixed = spec.get("fixed", {})
  if not isinstance(fixed, dict):
    raise ValueError(f"{where}.fixed must be a table of hyper-parameters")
  make = functools.partial(_make, factory, dict(settings))
  try:
    probe = _make_probe(factory, settings)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{where}.settings: {e}") from None
  options = set(_factory_keywords(factory)) - set(settings)
  for g in grid if isinstance(grid, list) else [grid]:
    if not isinstance(g, dict):
      raise ValueError(f"{where}.grid must be a table name -> list of values")
    for key in g:
      if key not in probe and key not in options:
        raise ValueError(
          f"unknown key {where}.grid.{key}: {name} has hyper-parameters {sorted(probe)} and "
          f"factory options {sorted(options)}"
        )
  for key in fixed:
    if key not in probe:
      raise ValueError(
        f"unknown key {where}.fixed.{key}: {name} has hyper-parameters {sorted(probe)}"
      )
  try:
    return Strategy(
      label,
      make,
      grid=grid,
      fixed=dict(fixed),
      widen=spec.get("widen"),
      note=spec.get("note", ""),
      paper=bool(spec.get("paper", True)),
    )
  except (TypeError, ValueError) as e:
    raise ValueError(f"{where}: {e}") from None


def _factory_keywords(factory):
  params = inspect.signature(factory).parameters
  return [k for k, p in params.items() if p.kind == p.KEYWORD_ONLY]


def _make(factory, settings, model, **options):
  return factory(model, **settings, **options)


def _make_probe(factory, settings):
  """The hyper-parameter names of ``factory`` with ``settings`` (built on a one-weight model)."""
  from fedjax_dro import models

  return factory(models.linear_regression(1), **settings).hparams


def experiment_from_config(config: Dict[str, Any]) -> Experiment:
  """The :class:`~fedjax_dro.compare.Experiment` a parsed config describes (see the module
  docstring).

  Args:
    config: the parsed TOML (:func:`load_config`).
  """
  from fedjax_dro.data import get_dataset

  _unknown("config", config, TOP_KEYS)
  name = _required("config", config, "name")
  data = _required("config", config, "data")
  _unknown("data", data, DATA_KEYS)
  try:
    entry = get_dataset(_required("data", data, "dataset"))
  except ValueError as e:
    raise ValueError(f"data.dataset: {e}") from None
  options = data.get("options", {})
  if not isinstance(options, dict):
    raise ValueError("data.options must be a table of loader arguments")
  accepted = inspect.signature(entry.load).parameters
  if not any(p.kind == p.VAR_KEYWORD for p in accepted.values()):
    bad = sorted(set(options) - set(accepted) - {"seed"})
    if bad:
      raise ValueError(
        f"unknown key data.options.{bad[0]}; the loader takes {sorted(set(accepted) - {'seed'})}"
      )
  protocol = dict(config.get("protocol", {}))
  _unknown("protocol", protocol, PROTOCOL_KEYS)
  budget = protocol.pop("budget", {"kind": "rounds", "rounds": 100})
  _unknown("protocol.budget", budget, BUDGET_KEYS)
  metric = Metric(protocol.pop("metric", "loss"), protocol.pop("stat", "weighted_mean"))
  if "seeds" in protocol and isinstance(protocol["seeds"], list):
    protocol["seeds"] = tuple(protocol["seeds"])
  try:
    protocol = Protocol(metric=metric, budget=Budget(**budget), **protocol)
  except (TypeError, ValueError) as e:
    raise ValueError(f"protocol: {e}") from None
  specs = _required("config", config, "strategy")
  if not isinstance(specs, list) or not specs:
    raise ValueError("the config needs at least one [[strategy]] table")
  strategies = [_strategy(k, s) for k, s in enumerate(specs)]
  load = functools.partial(_load, entry.load, dict(options))
  return Experiment(
    name=name,
    data=load,
    model=entry.default_model,
    strategies=strategies,
    protocol=protocol,
    description=config.get("description", ""),
  )


def _load(load, options, seed):
  return load(seed, **options)
