"""Validated shape-determining settings shared by the algorithms, and the start of their state.

:func:`settings_from` builds an algorithm factory's :class:`CommonSettings` from its arguments;
:func:`state_init` and :func:`round_zero` build the ``init`` of a state that needs no randomness.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Mapping, NamedTuple, Optional

import jax.numpy as jnp
import numpy as np

from fedjax_dro.core.clients import resolve_backend, validate_backend
from fedjax_dro.core.sampling import validate_clients_per_round
from fedjax_dro.models.base import num_parameters


class CommonSettings(NamedTuple):
  """Validated shape-determining settings shared by the FedAvg family.

  A client's local work per round is either ``local_steps`` minibatches drawn with replacement
  or ``local_epochs`` passes without replacement over its own rows (exactly one is set, the other
  is None; see :func:`fedjax_dro.core.local.local_schedule`).
  """

  clients_per_round: Optional[int]
  local_steps: Optional[int]
  batch_size: Optional[int]
  backend: str
  chunk_size: Optional[int]
  weighting: str
  local_epochs: Optional[int] = None


MAX_COUNT = 2**31 - 1  # counts become int32 shapes and indices on the device


def _count(name: str, value, expected: str, optional: bool = True) -> Optional[int]:
  """``value`` as a Python int in ``[1, MAX_COUNT]`` (any integer type: ``int``, ``np.int64``...;
  never a bool), or None when ``optional``."""
  if value is None and optional:
    return None
  if (
    not isinstance(value, numbers.Integral)
    or isinstance(value, (bool, np.bool_))
    or not 1 <= value <= MAX_COUNT
  ):
    raise ValueError(f"{name} must be {expected} in [1, 2**31 - 1], got {value!r}")
  return int(value)


def common_settings(
  *,
  clients_per_round=None,
  local_steps=None,
  batch_size=None,
  backend="auto",
  chunk_size=None,
  weighting="num_examples",
  local_epochs=None,
) -> CommonSettings:
  """Validates the settings; ``local_steps`` and ``local_epochs`` are exclusive (neither given:
  one local step)."""
  clients_per_round = _count(
    "clients_per_round", clients_per_round, "a positive integer or None (all)"
  )
  if local_steps is not None and local_epochs is not None:
    raise ValueError(
      "give exactly one of local_steps (minibatches with replacement) and local_epochs (passes "
      f"over each client's data), got local_steps={local_steps!r} and "
      f"local_epochs={local_epochs!r}"
    )
  local_epochs = _count("local_epochs", local_epochs, "a positive integer or None")
  if local_epochs is None:
    local_steps = 1 if local_steps is None else local_steps
    local_steps = _count("local_steps", local_steps, "a positive integer", optional=False)
  batch_size = _count("batch_size", batch_size, "a positive integer or None (full batch)")
  chunk_size = _count("chunk_size", chunk_size, "a positive integer or None")
  validate_backend(backend, chunk_size)
  if weighting not in ("num_examples", "uniform"):
    raise ValueError(f"weighting must be 'num_examples' or 'uniform', got {weighting!r}")
  return CommonSettings(
    clients_per_round, local_steps, batch_size, backend, chunk_size, weighting, local_epochs
  )


def settings_from(arguments: Mapping[str, Any], **fixed) -> CommonSettings:
  """The validated settings of an algorithm factory's call.

  ``arguments`` holds the factory's parameters by name (a factory passes ``locals()`` before it
  binds any other name); the :class:`CommonSettings` fields among them are taken, ``fixed``
  supplies those the factory does not expose (e.g. ``weighting="uniform"`` for an algorithm whose
  paper averages uniformly) and :func:`common_settings`'s defaults the rest. (A registered
  factory's ``local_steps`` left at its declared default beside ``local_epochs`` arrives here as
  None: :func:`fedjax_dro.algorithms.base.with_epochs_over_default_steps`.)
  """
  chosen = {name: arguments[name] for name in CommonSettings._fields if name in arguments}
  return common_settings(**{**chosen, **fixed})


def same_count(value, default) -> bool:
  """``value`` is the declared ``default`` (the same integer, not a bool)."""
  return (
    value is default
    or isinstance(value, numbers.Integral)
    and not isinstance(value, (bool, np.bool_))
    and isinstance(default, int)
    and int(value) == default
  )


def participants(settings: CommonSettings, num_clients: int) -> int:
  """The static number of clients per round (validated against the federation size)."""
  return validate_clients_per_round(settings.clients_per_round, num_clients)


def backend_for(settings: CommonSettings, params) -> str:
  return resolve_backend(settings.backend, num_parameters(params))


def aggregation_weights(settings: CommonSettings, num_examples):
  nex = num_examples.astype(jnp.result_type(float))
  return nex if settings.weighting == "num_examples" else jnp.ones_like(nex)


def round_zero() -> jnp.ndarray:
  """The ``[]`` int32 round counter of a fresh algorithm state."""
  return jnp.zeros((), jnp.int32)


def state_init(settings: CommonSettings, build: Callable) -> Callable:
  """``init(params, data, key)`` of an algorithm whose initial state needs no randomness.

  Validates ``settings.clients_per_round`` against the federation's size, then returns
  ``build(params, num_clients)``.
  """

  def init(params, data, key):
    del key
    participants(settings, data.num_clients)
    return build(params, data.num_clients)

  return init
