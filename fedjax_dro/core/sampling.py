"""Fixed-size client sampling (static shapes, so a round compiles once)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sample_clients(
  key, num_clients: int, clients_per_round: int, weights=None, *, replace: bool = False
):
  """Indices ``[clients_per_round]`` of the clients taking part in a round.

  Args:
    key: PRNG key.
    num_clients: n.
    clients_per_round: s (static).
    weights: optional ``[n]`` non-negative sampling weights. ``None`` is uniform sampling without
      replacement. With weights and ``replace=False`` clients are drawn sequentially proportional
      to their weights without replacement (Gumbel top-k); with ``replace=True`` i.i.d. draws.
  """
  if clients_per_round == num_clients and weights is None and not replace:
    return jnp.arange(num_clients)  # full participation: no randomness, fixed order
  if weights is None:
    return jax.random.choice(key, num_clients, (clients_per_round,), replace=replace)
  p = jnp.asarray(weights) / jnp.sum(weights)
  return jax.random.choice(key, num_clients, (clients_per_round,), replace=replace, p=p)


def validate_clients_per_round(
  clients_per_round, num_clients: int, name: str = "clients_per_round"
) -> int:
  if clients_per_round is None:
    return num_clients
  if not isinstance(clients_per_round, int) or isinstance(clients_per_round, bool):
    raise TypeError(f"{name} must be an int, got {type(clients_per_round).__name__}")
  if clients_per_round < 1 or clients_per_round > num_clients:
    raise ValueError(f"{name} must be in [1, num_clients={num_clients}], got {clients_per_round}")
  return clients_per_round
