"""The algorithm interface, hyper-parameter specs and the registry.

An algorithm is a NamedTuple of pure functions built by a factory that closes over everything
shape-determining (model, local steps, batch size, clients per round, backend)::

    alg = fedavg(model, local_steps=10, batch_size=32, clients_per_round=20)
    state = alg.init(params, data, key)
    state, metrics = alg.round(state, data, key, hparams)   # jit-able, one communication round
    models = alg.client_models(state)                       # global params, or [n, ...] stacked

``hparams`` is a dict of scalars (an argument, not a closure) so a sweep can ``vmap`` over it.

A factory ``factory(model, settings, *, own...)`` declares the shared settings it exposes with
:func:`with_settings` (which adds them to its signature and docstring and hands it validated
:class:`~fedjax_dro.core.settings.CommonSettings`) and returns :func:`build_algorithm`'s
:class:`Algorithm`; :func:`register` files it under its name, takes its one-line description from
the docstring and adds the ``precision=`` setting.
"""

from __future__ import annotations

import functools
import inspect
import re
import textwrap
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.common.model import Model
from fedjax_dro.core.hparams import HParam
from fedjax_dro.core.model_state import check_model_state, policy_model
from fedjax_dro.core.precision import model_precision, validate_precision, with_precision
from fedjax_dro.core.settings import (
  DECLARED,
  LOCAL_TRAINING,
  CommonSettings,
  common_settings,
  same_count,
)
from fedjax_dro.data.federated import FederatedData


class Algorithm(NamedTuple):
  """An algorithm as pure functions (see the module docstring).

  Attributes:
    name: the registered name (or the user's).
    model: the :class:`~fedjax_dro.common.model.Model` trained.
    init: ``init(params, data, key) -> state``.
    round: ``round(state, data, key, hparams, release=PLAIN) -> (state, metrics)``: one
      communication round; ``release`` is the release mechanism
      (:mod:`fedjax_dro.core.release`), an algorithm that declares ``releases`` takes it.
    client_models: ``client_models(state)``: the global model, or ``[n, ...]`` stacked.
    hparams: the hyper-parameter specs (the round's ``hparams`` argument).
    personalized: whether ``client_models`` is per client.
    config: a JSON-able record of the settings (written with the results; nothing reads it
      to decide what a run does).
    cost: ``cost(data) -> Costs``: per-round and setup uploads, client gradient evaluations and
      sequential local steps (see :func:`algorithm_cost`).
    settings: the validated shared settings (:class:`~fedjax_dro.core.settings.CommonSettings`),
      or None for an algorithm without them.
    releases: what the participants release (:class:`~fedjax_dro.core.release.Releases`), why
      it cannot be private (:class:`~fedjax_dro.core.release.Refused`), or None (undeclared:
      :func:`fedjax_dro.privacy.private` refuses it).
    privacy: the privacy of an algorithm made private (set by :func:`fedjax_dro.privacy.private`;
      the accountant reads it), else None.
  """

  name: str
  model: Model
  init: Callable
  round: Callable
  client_models: Callable
  hparams: Dict[str, HParam]
  personalized: bool = False
  config: Dict[str, Any] = {}
  cost: Optional[Callable] = None
  settings: Optional[CommonSettings] = None
  releases: Any = None
  privacy: Any = None


def default_hparams(alg: Algorithm) -> Dict[str, float]:
  return {k: v.default for k, v in alg.hparams.items()}


def make_hparams(
  alg: Algorithm, overrides: Optional[Dict[str, Any]] = None, dtype=None
) -> Dict[str, jnp.ndarray]:
  """Defaults merged with ``overrides``, validated, as a dict of arrays.

  Values may be arrays with a leading axis (a sweep); every entry is checked.
  """
  if not isinstance(alg, Algorithm):
    raise TypeError(f"alg must be an Algorithm, got {type(alg).__name__}")
  if overrides is not None and not isinstance(overrides, dict):
    raise TypeError(
      f"hparams must be a dict of hyper-parameter values like {{'client_lr': 0.1}}, got "
      f"{type(overrides).__name__}"
    )
  overrides = dict(overrides or {})
  unknown = sorted(set(overrides) - set(alg.hparams))
  if unknown:
    raise ValueError(
      f"unknown hyper-parameter(s) {unknown} for algorithm {alg.name!r}; "
      f"expected a subset of {sorted(alg.hparams)}"
    )
  dtype = dtype or (jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
  out = {}
  for name, spec in alg.hparams.items():
    value = overrides.get(name, spec.default)
    # bools, strings ("0.1"), complex numbers and None are refused, not converted
    if value is None or isinstance(value, (bool, np.bool_, str, bytes, dict)):
      raise TypeError(f"hyper-parameter {name!r} must be a real number, got {value!r}")
    try:
      raw = np.asarray(value)
    except Exception as e:
      raise TypeError(f"hyper-parameter {name!r} must be a number, got {value!r}") from e
    if raw.dtype.kind not in "iuf":
      raise TypeError(
        f"hyper-parameter {name!r} must be a real number, got {value!r} (dtype {raw.dtype})"
      )
    arr = raw.astype(np.float64)
    if not np.all(np.isfinite(arr)):
      raise ValueError(f"hyper-parameter {name!r} must be finite, got {value!r}")
    limit = float(jnp.finfo(dtype).max)
    if np.any(np.abs(arr) > limit):
      raise ValueError(
        f"hyper-parameter {name!r} = {value!r} overflows {jnp.dtype(dtype).name} (largest "
        f"{limit:.3g}); the simulator computes in {jnp.dtype(dtype).name}"
      )
    # below the smallest normal number XLA flushes to 0 (numpy's subnormals are not kept)
    smallest = float(jnp.finfo(dtype).tiny)
    if np.any((arr != 0) & (np.abs(arr) < smallest)):
      raise ValueError(
        f"hyper-parameter {name!r} = {value!r} underflows to 0 in {jnp.dtype(dtype).name} "
        f"(smallest normal {smallest:.3g}); the simulator computes in {jnp.dtype(dtype).name}"
      )
    if spec.minimum is not None:
      bad = arr <= spec.minimum if spec.strict else arr < spec.minimum
      if np.any(bad):
        rel = ">" if spec.strict else ">="
        raise ValueError(
          f"hyper-parameter {name!r} of {alg.name} must be {rel} {spec.minimum} "
          f"({spec.doc}), got {value!r}"
        )
    if spec.maximum is not None and np.any(arr > spec.maximum):
      raise ValueError(
        f"hyper-parameter {name!r} of {alg.name} must be <= {spec.maximum} "
        f"({spec.doc}), got {value!r}"
      )
    out[name] = jnp.asarray(arr, dtype)
  return out


def global_params(state):
  """``client_models`` of an algorithm that evaluates one global model: ``state.params``."""
  return state.params


def build_algorithm(
  name: str,
  model: Model,
  settings: Optional[CommonSettings],
  init: Callable,
  round_fn: Callable,
  hparams: Dict[str, HParam],
  client_models: Callable = global_params,
  personalized: bool = False,
  cost: Optional[Callable] = None,
  releases=None,
  model_states: Sequence[str] = ("frozen",),
  **config,
) -> Algorithm:
  """The :class:`Algorithm` a factory returns, its ``config`` the round ``settings`` (if any)
  followed by the factory's own options ``config``.

  ``releases`` declares what the participants release each round
  (:class:`~fedjax_dro.core.release.Releases`; the round function then takes ``release``), or
  why the algorithm cannot be private (:class:`~fedjax_dro.core.release.Refused`).

  By default the algorithm evaluates one global model (``client_models`` is
  :func:`global_params`); a personalized one passes its ``client_models`` and
  ``personalized=True``. ``cost(data) -> Costs`` states what a round spends
  (:mod:`fedjax_dro.core.costs`).

  ``model_states``: the ``model_state`` choices the algorithm honours for a model with state
  (:mod:`fedjax_dro.core.model_state`); the others are refused by name. ``"frozen"`` (the
  default) asks nothing of the algorithm; ``model_state`` is recorded in ``config`` only for a
  model with state.
  """
  check_model_state(name, model, settings, model_states)
  recorded = {} if settings is None else settings._asdict()
  if not model.state_keys:
    recorded.pop("model_state", None)
  return Algorithm(
    name=name,
    model=model,
    init=init,
    round=round_fn,
    client_models=client_models,
    hparams=hparams,
    personalized=personalized,
    config={**recorded, **config},
    cost=cost,
    settings=settings,
    releases=releases,
  )


def personal_models(state):
  """``client_models`` of a personalized algorithm that keeps each client's model in the
  ``[n, ...]`` rows of ``state.personal`` (Ditto's ``v_i``, pFedMe's ``theta_i``)."""
  return state.personal


def build_personalized(*args, client_models: Callable = personal_models, **options) -> Algorithm:
  """:func:`build_algorithm` (``args``: its ``name, model, settings, init, round_fn, hparams``)
  of a personalized algorithm: one model per client, ``client_models(state)`` (default
  :func:`personal_models`)."""
  return build_algorithm(*args, client_models=client_models, personalized=True, **options)


def build_partitioned(
  name: str, model: Model, settings, mask_of: Callable, model_states, **config
) -> Algorithm:
  """The personalized :class:`Algorithm` of FedAvg over the parameter partition ``mask_of(params)
  -> per-leaf bools`` (True: the leaf stays on the clients; :mod:`fedjax_dro.core.partitioned`):
  FedBN, FedPer and FedAvg with ``model_state="local"``."""
  from fedjax_dro.core.costs import local_training_costs
  from fedjax_dro.core.partitioned import HPARAMS, RELEASES, partitioned_fedavg

  fns = partitioned_fedavg(model, settings, mask_of)
  return build_personalized(
    name,
    model,
    settings,
    fns.init,
    fns.round,
    HPARAMS,
    client_models=fns.client_models,
    cost=local_training_costs(model, settings),
    releases=RELEASES,
    model_states=model_states,
    **config,
  )


def algorithm_cost(alg: Algorithm, data: FederatedData):
  """``alg``'s :class:`~fedjax_dro.core.costs.Costs` on ``data``: per round (expected over the
  client sampling) and once at setup, in uploads (clients and floats), client gradient
  evaluations and sequential local steps (:mod:`fedjax_dro.core.costs`).

  Args:
    alg: an :class:`Algorithm`.
    data: the training :class:`~fedjax_dro.data.FederatedData` (or a dataset: its ``train``).
  """
  if not isinstance(alg, Algorithm):
    raise TypeError(f"alg must be an Algorithm, got {type(alg).__name__}")
  data = getattr(data, "train", data)
  if not (isinstance(data, FederatedData) or getattr(data, "host_resident", False)):
    raise TypeError(f"data must be a FederatedData or FederatedDataset, got {type(data).__name__}")
  if alg.cost is None:
    raise ValueError(
      f"algorithm {alg.name!r} does not state its cost (build_algorithm(..., cost=...))"
    )
  return alg.cost(data)


# ----------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------


class RegistryEntry(NamedTuple):
  factory: Callable
  description: str
  family: str


_REGISTRY: Dict[str, RegistryEntry] = {}


def with_precision_setting(factory: Callable) -> Callable:
  """``factory`` with one more keyword setting, ``precision=None | "float32" | "tf32" | "bf16"``.

  The returned factory validates ``precision``, wraps the model in the policy
  (:func:`fedjax_dro.core.precision.with_precision`: compute dtype of the forward and backward
  passes; parameters, aggregation and optimizer state keep their dtype), calls ``factory`` with the
  wrapped model and records the resolved policy in ``Algorithm.config["precision"]``.
  ``precision=None`` is the platform's default (float32 on CPU, tf32 on GPU/TPU).
  """
  if "precision" in inspect.signature(factory).parameters:
    return factory  # the factory handles precision itself

  @functools.wraps(factory)
  def wrapped(model, *args, precision=None, **kwargs):
    validate_precision(precision)
    if not isinstance(model, Model):
      raise TypeError(
        f"model must be a fedjax_dro.models.Model (e.g. fedjax_dro.models.mlp(...)), got "
        f"{type(model).__name__}"
      )
    alg = factory(with_precision(model, precision), *args, **kwargs)
    config = dict(alg.config or {})
    config["precision"] = model_precision(alg.model)
    return alg._replace(config=config)

  sig = inspect.signature(factory)
  extra = inspect.Parameter("precision", inspect.Parameter.KEYWORD_ONLY, default=None)
  params = list(sig.parameters.values())
  tail = [p for p in params if p.kind == inspect.Parameter.VAR_KEYWORD]
  params = [p for p in params if p.kind != inspect.Parameter.VAR_KEYWORD] + [extra] + tail
  wrapped.__signature__ = sig.replace(parameters=params)
  wrapped.__doc__ = with_precision_doc(factory.__doc__)
  return wrapped


def with_precision_doc(doc: Optional[str]) -> str:
  """``doc`` with the ``precision`` entry (:data:`PRECISION_DOC`) at the end of its ``Args:``."""
  return with_args_entries(doc, {"precision": PRECISION_DOC})


PRECISION_DOC = (
  '``None`` (per platform: ``"float32"`` on CPU, ``"tf32"`` on GPU/TPU), ``"float32"``, '
  '``"tf32"`` or ``"bf16"``: the compute dtype of the forward and backward passes (parameters, '
  "aggregation and optimizer state keep their dtype; see :mod:`fedjax_dro.core.precision`)."
)

_ENTRY = re.compile(r"(\*{0,2}\w+)\s*(\([^)]*\))?:")


def with_args_entries(
  doc: Optional[str], entries: Dict[str, str], order: Optional[Sequence[str]] = None
) -> str:
  """``doc`` with an ``Args:`` entry ``name: text`` for each of ``entries`` it does not document
  (the text wrapped at 100 columns and indented like the other entries; an ``Args:`` section is
  appended when there is none), its entries sorted by their place in ``order`` when given (names
  not in it follow, in their order)."""
  lines = (doc or "").rstrip().split("\n")
  start = next((i for i, line in enumerate(lines) if line.strip() == "Args:"), None)
  if start is None:
    base = next((ln[: len(ln) - len(ln.lstrip())] for ln in lines[1:] if ln.strip()), "")
    lines += ["", base + "Args:"] if lines != [""] else [base + "Args:"]
    start = len(lines) - 1
  indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())] + "  "
  end = start + 1
  while end < len(lines) and (not lines[end].strip() or lines[end].startswith(indent)):
    end += 1
  while end > start + 1 and not lines[end - 1].strip():
    end -= 1
  found: List[List] = []  # [name, lines]
  for line in lines[start + 1 : end]:
    match = _ENTRY.match(line[len(indent) :]) if line.startswith(indent) else None
    if match and not line[len(indent)].isspace():
      found.append([match.group(1), [line]])
    elif found:
      found[-1][1].append(line)
  have = {name for name, _ in found}
  for name, text in entries.items():
    if name not in have:
      wrapped = textwrap.fill(
        f"{name}: {text}", 100, initial_indent=indent, subsequent_indent=indent + "  "
      )
      found.append([name, wrapped.split("\n")])
  if order is not None:
    rank = {name: i for i, name in enumerate(order)}
    found.sort(key=lambda entry: rank.get(entry[0], len(rank)))
  body = [line for _, entry in found for line in entry]
  return "\n".join(lines[: start + 1] + body + lines[end:])


def with_settings(
  names: Sequence[str] = LOCAL_TRAINING,
  *,
  defaults: Optional[Dict[str, Any]] = None,
  fixed: Optional[Dict[str, Any]] = None,
) -> Callable:
  """Decorator declaring the shared settings an algorithm factory exposes.

  The decorated ``factory(model, settings, *, own...)`` receives validated
  :class:`~fedjax_dro.core.settings.CommonSettings`; the returned factory is called
  ``factory(model, *, own..., <names>...)``: its signature lists the factory's own keyword
  parameters, then ``names`` (settings of :data:`~fedjax_dro.core.settings.DECLARED`) with their
  declared defaults, overridden by ``defaults`` (a paper's own, e.g. ``local_steps=32``); its
  docstring's ``Args:`` gains the declared paragraph of every name it does not document itself,
  and lists its entries in the signature's order. ``fixed`` sets the settings the factory does not
  expose (e.g. ``weighting="uniform"`` where the paper averages without weights).

  ``local_epochs`` given with ``local_steps`` left at its default makes ``local_steps`` None (the
  epochs win); any other ``local_steps`` beside ``local_epochs`` is refused by
  :func:`~fedjax_dro.core.settings.common_settings`.
  """
  names = tuple(names)
  defaults, fixed = dict(defaults or {}), dict(fixed or {})
  if "model_state" not in names and "model_state" not in fixed:
    names = names + ("model_state",)  # every factory says what it does with model state
  unknown = [n for n in (*names, *defaults, *fixed) if n not in DECLARED]
  if unknown or set(defaults) - set(names) or set(fixed) & set(names):
    raise ValueError(
      f"with_settings: names {names}, defaults {sorted(defaults)} and fixed {sorted(fixed)} must "
      f"be settings of DECLARED ({sorted(DECLARED)}), defaults among names, fixed outside them"
    )
  declared = {n: defaults.get(n, DECLARED[n].default) for n in names}

  def deco(factory: Callable) -> Callable:
    params = list(inspect.signature(factory).parameters.values())
    own = params[2:]
    if [p.name for p in params[:2]] != ["model", "settings"] or any(
      p.kind != inspect.Parameter.KEYWORD_ONLY or p.name in declared for p in own
    ):
      raise TypeError(
        f"{factory.__name__}: a factory under with_settings is declared "
        "(model, settings, *, own keyword parameters not among the shared settings)"
      )

    own_names = {p.name for p in own}

    @functools.wraps(factory)
    def wrapped(model, **kwargs):
      if "server_optimizer" in kwargs and "server_optimizer" not in own_names:
        raise TypeError(
          f"{factory.__name__} takes no server_optimizer: its server step is not a plain step on "
          f"the averaged model difference (the algorithms that take one: fedavg, fedprox, scaffold, "
          f"agnostic_fedavg)"
        )
      if "client_optimizer" in kwargs and "client_optimizer" not in own_names:
        raise TypeError(
          f"{factory.__name__} takes no client_optimizer: its local steps are its paper's own "
          f"(the algorithms that take one: fedavg, fedprox)"
        )
      chosen = {n: kwargs.pop(n) for n in declared if n in kwargs}
      if chosen.get("local_epochs") is not None and same_count(
        chosen.get("local_steps", declared.get("local_steps")), declared.get("local_steps")
      ):
        chosen["local_steps"] = None
      settings = common_settings(**{**declared, **chosen, **fixed})
      return factory(policy_model(model, settings), settings, **kwargs)

    shared = [
      inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d) for n, d in declared.items()
    ]
    wrapped.__signature__ = inspect.Signature([params[0], *own, *shared])
    entries = {
      n: DECLARED[n].doc.format(default=f'"{d}"' if isinstance(d, str) else d)
      for n, d in declared.items()
    }
    wrapped.__doc__ = with_args_entries(
      factory.__doc__, entries, list(wrapped.__signature__.parameters)
    )
    return wrapped

  return deco


def register(name: str, description: Optional[str] = None, family: str = "baseline"):
  """Decorator registering an algorithm factory ``factory(model, **settings) -> Algorithm``.

  ``description`` (the one-line summary ``fedjax-dro list`` prints) defaults to the first line of
  the factory's docstring, without its final period. The registered (and returned) factory also takes ``precision=`` (see
  :func:`with_precision_setting`), so every algorithm has the precision policy without handling
  it itself.
  """

  def deco(factory):
    summary = description or (factory.__doc__ or "").strip().split("\n")[0].rstrip(".")
    factory = with_precision_setting(factory)
    _REGISTRY[name] = RegistryEntry(factory, summary, family)
    return factory

  return deco


def get_algorithm(name: str) -> RegistryEntry:
  if name not in _REGISTRY:
    raise ValueError(f"unknown algorithm {name!r}; available: {sorted(_REGISTRY)}")
  return _REGISTRY[name]


def list_algorithms() -> Dict[str, RegistryEntry]:
  return dict(sorted(_REGISTRY.items()))


def _range(spec: HParam) -> str:
  low = "" if spec.minimum is None else f"{'>' if spec.strict else '>='} {spec.minimum:g}"
  high = "" if spec.maximum is None else f"<= {spec.maximum:g}"
  return ", ".join(part for part in (low, high) if part) or "any real"


def describe(name: str, **options) -> str:
  """The settings and hyper-parameters of the registered algorithm ``name``, as text.

  Settings are the factory's keyword arguments (shape-determining, fixed for a run), each with
  its default; hyper-parameters are the round arguments (``fd.run(hparams=...)``, sweep grids,
  ``fedjax-dro run --hparams`` / ``sweep --grid``), each with its default, valid range and
  meaning. ``options`` are factory settings that change the hyper-parameters (``psi="cvar"``
  gives SCAFF-PD, DRFA and AFL an ``alpha`` instead of ``rho``). ``fedjax-dro list NAME`` prints
  it.
  """
  from fedjax_dro.models import linear_regression

  entry = get_algorithm(name)
  alg = entry.factory(linear_regression(1), **options)
  lines = [f"{name}: {entry.description} ({entry.family})", "", "settings (keyword, default):"]
  for p in inspect.signature(entry.factory).parameters.values():
    if p.name != "model":
      lines.append(f"  {p.name} = {options.get(p.name, p.default)!r}")
  lines += ["", "hyper-parameters (round arguments: default, valid range, meaning):"]
  width = max([len(k) for k in alg.hparams] + [1])
  for key, spec in alg.hparams.items():
    lines.append(f"  {key:<{width}} = {spec.default:<8g} {_range(spec):<14} {spec.doc}")
  return "\n".join(lines) + "\n"
