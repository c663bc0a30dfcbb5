"""What an algorithm spends: uploads, client gradient evaluations and sequential local steps.

Every algorithm states its cost as a function of its settings and the data
(``Algorithm.cost(data) -> Costs``; :func:`fedjax_dro.algorithms.algorithm_cost`), so that a
comparison can give strategies equal budgets (:mod:`fedjax_dro.compare`) and report what each one
spent. The counts are per round in expectation over the client sampling (``s`` of ``n`` clients
uniformly without replacement: client ``i`` participates with probability ``s / n``), plus a
one-time setup (Karula's gradient table, SCAFF-PD's first gradients, ...).

* ``uploading_clients``: client-to-server messages (clients that send something to the server).
* ``upload_floats``: numbers sent from clients to the server (a model or gradient of ``P``
  parameters is ``P`` floats; a loss value is one float; a cluster identity one number).
* ``gradient_evaluations``: client (minibatch or full-batch) gradient evaluations, one per client
  and local step (a step that takes two gradients, like Ditto's, counts two).
* ``sequential_steps``: the local gradient steps on a round's critical path (the longest chain of
  steps one client takes in a round; clients run in parallel).

Downloads (server to client) are not counted: every strategy broadcasts at least one model per
participant and round, and the papers compare uploads. Neither are the training metrics a round
reports (its participants' losses) nor losses evaluated without a gradient (IFCA's cluster choice,
q-FFL's ``F_k``): only what the algorithm itself sends and differentiates.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import numpy as np


class RoundCost(NamedTuple):
  """Counts of one round (expected over client sampling) or of a whole run; floats."""

  uploading_clients: float = 0.0
  upload_floats: float = 0.0
  gradient_evaluations: float = 0.0
  sequential_steps: float = 0.0

  def __add__(self, other: "RoundCost") -> "RoundCost":  # type: ignore[override]
    return RoundCost(*(float(a) + float(b) for a, b in zip(self, other)))

  def scaled(self, factor: float) -> "RoundCost":
    """Every count times ``factor`` (``rounds`` rounds of a per-round cost)."""
    return RoundCost(*(float(a) * float(factor) for a in self))

  def as_dict(self):
    return {k: float(v) for k, v in self._asdict().items()}


class Costs(NamedTuple):
  """An algorithm's cost on some data: ``round`` per round, ``setup`` once before round 1."""

  round: RoundCost
  setup: RoundCost = RoundCost()

  def spent(self, rounds: int) -> RoundCost:
    """The counts of ``rounds`` rounds, setup included."""
    return self.setup + self.round.scaled(rounds)


COST_FIELDS = RoundCost._fields


def parameter_count(model) -> int:
  """``P``, the number of model parameters, from ``model.init``'s shapes (nothing is computed)."""
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  return int(sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(shapes)))


def participation(settings_clients_per_round: Optional[int], num_clients: int) -> int:
  """``s``: the clients per round (``None``: all ``num_clients``)."""
  s = settings_clients_per_round
  return int(num_clients) if s is None else min(int(s), int(num_clients))


def local_steps_per_client(settings: Any, num_examples) -> np.ndarray:
  """``[n]`` local steps each client takes in one round under ``settings``
  (:class:`~fedjax_dro.core.settings.CommonSettings`): ``local_steps`` for every client, or
  ``local_epochs * ceil(N_i / batch_size)`` (``local_epochs`` full-batch steps with
  ``batch_size=None``; none for a client without rows), as
  :func:`fedjax_dro.core.schedule.local_schedule` runs them."""
  nex = np.asarray(num_examples, np.int64)
  if settings.local_epochs is None:
    return np.full(nex.shape, int(settings.local_steps), np.int64)
  e = int(settings.local_epochs)
  if settings.batch_size is None:
    return np.where(nex > 0, e, 0).astype(np.int64)
  return e * (-(-nex // int(settings.batch_size)))


def local_training_cost(
  settings: Any,
  data,
  num_params: int,
  *,
  grads_per_step: int = 1,
  upload_floats_per_client: Optional[float] = None,
  extra_sequential: float = 0.0,
) -> RoundCost:
  """The per-round cost of the FedAvg family: ``s`` sampled clients run their local steps
  (:func:`local_steps_per_client`, ``grads_per_step`` gradients each) and each uploads
  ``upload_floats_per_client`` floats (default: one model, ``num_params``).

  Expected over the sampling: ``s / n`` times the sum over clients of their steps; the critical
  path is the largest number of steps of any client (plus ``extra_sequential``).
  """
  n = int(data.num_clients)
  s = participation(settings.clients_per_round, n)
  steps = local_steps_per_client(settings, data.num_examples)
  per_client = num_params if upload_floats_per_client is None else upload_floats_per_client
  return RoundCost(
    uploading_clients=float(s),
    upload_floats=float(s) * float(per_client),
    # s * sum / n: exact whenever the expectation is a whole number
    gradient_evaluations=float(s) * float(steps.sum()) * grads_per_step / n,
    sequential_steps=float(steps.max(initial=0)) + float(extra_sequential),
  )


def local_training_costs(model, settings: Any, *, models: int = 1, scalars: int = 0) -> Callable:
  """The ``cost`` (``data -> Costs``, no setup) of a FedAvg-family algorithm: each participant
  runs its local steps (:func:`local_training_cost`) and uploads ``models`` model-sized vectors
  of ``P = parameter_count(model)`` floats (a model or its delta, a control variate, a moment)
  and ``scalars`` numbers (a loss, a threshold, a cluster identity). With nothing to upload
  (``models = scalars = 0``) no client sends a message."""

  def cost(data) -> Costs:
    floats = models * parameter_count(model) + scalars
    per_round = local_training_cost(settings, data, floats)
    return Costs(per_round if floats else per_round._replace(uploading_clients=0.0))

  return cost


def one_gradient_each(clients: float, floats_per_client: float) -> RoundCost:
  """``clients`` clients each evaluate one gradient (one step on the critical path) and upload
  ``floats_per_client`` floats: Karula's sampled gradients and its table, SCAFF-PD's ``c_i``."""
  clients = float(clients)
  return RoundCost(clients, clients * float(floats_per_client), clients, 1.0 if clients else 0.0)
