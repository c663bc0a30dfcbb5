"""Validated shape-determining settings shared by the algorithms, and the start of their state.

The settings shared by the local-training algorithms are declared once (:data:`DECLARED`: name,
default, docstring paragraph, value type and choices) and validated by :func:`common_settings` into
:class:`CommonSettings`; a factory receives them through
:func:`fedjax_dro.algorithms.base.with_settings`, which also adds the declared keyword parameters
to its signature and their paragraphs to its docstring. :func:`state_init` and
:func:`round_zero` build the ``init`` of a state that needs no randomness.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import jax.numpy as jnp
import numpy as np

from fedjax_dro.common.checks import choice, integer
from fedjax_dro.common.model import num_parameters
from fedjax_dro.core.clients import BACKENDS, resolve_backend, validate_backend
from fedjax_dro.core.sampling import validate_clients_per_round


class CommonSettings(NamedTuple):
  """Validated shape-determining settings shared by the FedAvg family.

  A client's local work per round is either ``local_steps`` minibatches drawn with replacement
  or ``local_epochs`` passes without replacement over its own rows (exactly one is set, the other
  is None; see :func:`fedjax_dro.core.schedule.local_schedule`).
  """

  clients_per_round: Optional[int]
  local_steps: Optional[int]
  batch_size: Optional[int]
  backend: str
  chunk_size: Optional[int]
  weighting: str
  local_epochs: Optional[int] = None
  model_state: str = "average"


MAX_COUNT = 2**31 - 1  # counts become int32 shapes and indices on the device
WEIGHTINGS = ("num_examples", "uniform")
MODEL_STATES = ("average", "local", "frozen")


def common_settings(
  *,
  clients_per_round=None,
  local_steps=None,
  batch_size=None,
  backend="auto",
  chunk_size=None,
  weighting="num_examples",
  local_epochs=None,
  model_state="average",
) -> CommonSettings:
  """Validates the settings; ``local_steps`` and ``local_epochs`` are exclusive (neither given:
  one local step)."""
  clients_per_round = integer(
    clients_per_round, "clients_per_round", maximum=MAX_COUNT, optional=True, none="all clients"
  )
  if local_steps is not None and local_epochs is not None:
    raise ValueError(
      "give exactly one of local_steps (minibatches with replacement) and local_epochs (passes "
      f"over each client's data), got local_steps={local_steps!r} and "
      f"local_epochs={local_epochs!r}"
    )
  local_epochs = integer(
    local_epochs, "local_epochs", maximum=MAX_COUNT, optional=True, none="local_steps"
  )
  if local_epochs is None:
    local_steps = 1 if local_steps is None else local_steps
    local_steps = integer(local_steps, "local_steps", maximum=MAX_COUNT)
  batch_size = integer(
    batch_size, "batch_size", maximum=MAX_COUNT, optional=True, none="full batch"
  )
  chunk_size = integer(
    chunk_size, "chunk_size", maximum=MAX_COUNT, optional=True, none="planned from memory"
  )
  validate_backend(backend, chunk_size)
  choice(weighting, "weighting", WEIGHTINGS)
  choice(model_state, "model_state", MODEL_STATES)
  return CommonSettings(
    clients_per_round,
    local_steps,
    batch_size,
    backend,
    chunk_size,
    weighting,
    local_epochs,
    model_state,
  )


class Declared(NamedTuple):
  """One shared setting: its default, its docstring paragraph (``{default}`` is replaced by the
  default a factory declares), the type of its value when given (a count is an ``int``) and the
  values it may take (None: any that :func:`common_settings` accepts). The command line's flag
  of each setting is generated from its declaration (:mod:`fedjax_dro.cli`)."""

  default: Any
  doc: str
  type: type = int
  choices: Optional[Tuple[str, ...]] = None


DECLARED: Dict[str, Declared] = {
  "clients_per_round": Declared(
    None,
    "clients drawn uniformly without replacement each round, or ``None``: every client (default "
    "``{default}``).",
  ),
  "local_steps": Declared(
    10, "local steps each participant takes per round (default ``{default}``)."
  ),
  "local_epochs": Declared(
    None,
    "instead of ``local_steps``, passes over each participant's own rows per round, without "
    "replacement, in consecutive batches of ``batch_size`` of a fresh random order each pass (a "
    "client with more rows takes more steps; see :func:`fedjax_dro.core.schedule.local_schedule`); "
    "``None`` (default): ``local_steps``. Given with ``local_steps`` left at its default, "
    "``local_epochs`` wins; with any other ``local_steps`` it is refused.",
  ),
  "batch_size": Declared(
    None,
    "examples in each local minibatch, or ``None``: the client's full data (default "
    "``{default}``).",
  ),
  "backend": Declared(
    "auto",
    'per-client execution: ``"auto"`` (chosen from the model size), ``"vmap"``, ``"map"`` or '
    '``"chunked"`` (default ``{default}``).',
    str,
    BACKENDS,
  ),
  "chunk_size": Declared(
    None,
    'clients per chunk of the ``"chunked"`` backend, or ``None``: planned from memory (default '
    "``{default}``).",
  ),
  "weighting": Declared(
    "num_examples",
    '``"num_examples"`` (weights proportional to sample counts) or ``"uniform"``: the weights of '
    "the participants' contributions to the server's average (default ``{default}``).",
    str,
    WEIGHTINGS,
  ),
  "model_state": Declared(
    "average",
    "what the federation does with a model's state (batch statistics; ignored for a model "
    'without): ``"average"`` (aggregated like the parameters: at the server, the participants\' '
    'statistics averaged with the parameters\' weights), ``"local"`` (each client keeps its '
    'own, FedBN-style, and is evaluated with it) or ``"frozen"`` (the statistics the run starts '
    "from, pretrained or initial, never updated: training steps normalize with the minibatch's "
    "statistics and discard them); an algorithm that cannot honour a choice refuses it by name "
    "(default ``{default}``).",
    str,
    MODEL_STATES,
  ),
}
"""The shared settings a factory can expose, in the order its signature lists them. Every
factory exposes ``model_state`` (:func:`fedjax_dro.algorithms.base.with_settings` adds it)."""

LOCAL_TRAINING = (
  "clients_per_round",
  "local_steps",
  "local_epochs",
  "batch_size",
  "backend",
  "chunk_size",
)
"""The settings every local-training factory exposes unless its paper fixes one."""


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


def check_data_matches(data, num_clients: int, name: str = "data") -> None:
  """Static (trace-time) check that ``data`` has the federation size the state was built for."""
  if data.num_clients != num_clients:
    raise ValueError(
      f"{name} has {data.num_clients} clients but the algorithm state was "
      f"initialised for {num_clients}"
    )
