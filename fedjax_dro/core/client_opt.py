"""Local training with an optax optimizer in place of plain SGD (``client_optimizer=``).

Each participant starts the round with a fresh optimizer state, ``opt.init(w)`` at the received
model, and takes its local steps ``w <- w + client_lr * u`` with ``(u, state) = opt.update(g,
state, w)`` on each minibatch gradient ``g`` (after the algorithm's gradient correction, if any).
The state is dropped at the end of the round: in cross-device federated learning a client keeps
nothing between rounds (FedAvg with ``optax.sgd(1.0)`` is plain local SGD; ``optax.sgd(1.0,
momentum=0.9)`` heavy-ball local steps; ``optax.adam(1.0)`` local Adam whose moments restart
every round, unlike :func:`~fedjax_dro.algorithms.local_adam`, whose moments are averaged by the
server and carried over rounds). ``client_lr`` scales the optimizer's update, so it stays a
hyper-parameter a sweep vectorizes over. :func:`~fedjax_dro.core.local.local_sgd` runs the step
over the same minibatches as its SGD step.
"""

from __future__ import annotations

from typing import Callable, Optional

import jax

from fedjax_dro.common.model import Model, client_loss, train_value_and_grad, with_state


def optimizer_step(model: Model, optimizer, lr, grad_transform: Optional[Callable] = None):
  """``step((w, state), bx, by, bmask) -> ((w', state'), loss)``: one local step of
  ``optimizer`` (an optax transformation at rate 1, its update scaled by ``lr``)."""

  def step(carry, bx, by, bmask, rng=None):
    w, state = carry
    if model.train_apply is None:
      loss, g = jax.value_and_grad(lambda p: client_loss(model, p, bx, by, bmask))(w)
      model_state = None
    else:  # training mode: dropout from the step's key, the new model state kept
      loss, g, model_state = train_value_and_grad(model, w, bx, by, bmask, rng)
    if grad_transform is not None:
      g = grad_transform(w, g)
    updates, state = optimizer.update(g, state, w)
    w = jax.tree.map(lambda a, u: (a + lr * u).astype(a.dtype), w, updates)
    return (with_state(model, w, model_state), state), loss

  return step
