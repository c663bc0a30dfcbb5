"""Validated shape-determining settings shared by the FedAvg family of algorithms."""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax.numpy as jnp

from fedjax_dro.core.clients import resolve_backend, validate_backend
from fedjax_dro.core.sampling import validate_clients_per_round
from fedjax_dro.models.base import num_parameters


class CommonSettings(NamedTuple):
  """Validated shape-determining settings shared by the FedAvg family."""

  clients_per_round: Optional[int]
  local_steps: int
  batch_size: Optional[int]
  backend: str
  chunk_size: Optional[int]
  weighting: str


def common_settings(
  *,
  clients_per_round=None,
  local_steps=1,
  batch_size=None,
  backend="auto",
  chunk_size=None,
  weighting="num_examples",
) -> CommonSettings:
  if clients_per_round is not None and (
    not isinstance(clients_per_round, int) or clients_per_round < 1
  ):
    raise ValueError(
      f"clients_per_round must be a positive integer or None (all), got {clients_per_round!r}"
    )
  if not isinstance(local_steps, int) or isinstance(local_steps, bool) or local_steps < 1:
    raise ValueError(f"local_steps must be a positive integer, got {local_steps!r}")
  if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
    raise ValueError(
      f"batch_size must be a positive integer or None (full batch), got {batch_size!r}"
    )
  validate_backend(backend, chunk_size)
  if weighting not in ("num_examples", "uniform"):
    raise ValueError(f"weighting must be 'num_examples' or 'uniform', got {weighting!r}")
  return CommonSettings(clients_per_round, local_steps, batch_size, backend, chunk_size, weighting)


def participants(settings: CommonSettings, num_clients: int) -> int:
  """The static number of clients per round (validated against the federation size)."""
  return validate_clients_per_round(settings.clients_per_round, num_clients)


def backend_for(settings: CommonSettings, params) -> str:
  return resolve_backend(settings.backend, num_parameters(params))


def aggregation_weights(settings: CommonSettings, num_examples):
  nex = num_examples.astype(jnp.result_type(float))
  return nex if settings.weighting == "num_examples" else jnp.ones_like(nex)
