"""The local rounds and steps shared by the algorithms of the FGDRO paper.

Guo and Yang, "Communication-Efficient Federated Group Distributionally Robust Optimization",
NeurIPS 2024, arXiv:2410.06369:

* :func:`estimator_round`: the local round of FGDRO-CVaR, FGDRO-KL and FGDRO-KL-Adam (Algorithms
  1-3), whose per-client loss estimator ``u`` stays on the client;
* :func:`kl_estimators`, :func:`kl_initial` and :func:`kl_round`: the KL
  estimators ``u``, ``v`` (in the log domain) and ``h`` of FGDRO-KL and FGDRO-KL-Adam
  (Algorithms 2 and 3; the readings are those of :mod:`fedjax_dro.algorithms.fgdro_kl`), with
  :data:`KL_ESTIMATOR_HPARAMS`, their moving-average weights;
* :func:`momentum_step`: the local step of FGDRO-KL along the moving average ``m`` of the
  gradient estimator (Algorithm 2), which FedAvg-M takes on the plain gradient, with
  :data:`MOMENTUM_HPARAMS`;
* :func:`adam_step`: the Adam-type local step of FGDRO-KL-Adam and LocalAdam (Algorithms 3 and 4),
  with :data:`ADAM_HPARAMS`.

The KL regularization ``lambda`` of FGDRO-KL is the parameter of the KL problem of
:mod:`fedjax_dro.solvers.dro` (:func:`~fedjax_dro.solvers.dro.kl`), whose robust objective
``lambda log mean exp(l / lambda)`` is the paper's problem (5).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_dro.core.aggregation import tree_zeros_like
from fedjax_dro.core.hparams import HParam
from fedjax_dro.core.local import stateful_local_round, stateful_round_metrics

KL_ESTIMATOR_HPARAMS = {
  "beta1": HParam(0.1, "moving-average weight of the loss estimator u", maximum=1.0),
  "beta2": HParam(0.1, "moving-average weight of the estimator v of g(w)", maximum=1.0),
}

MOMENTUM_HPARAMS = {
  "beta3": HParam(0.1, "moving-average weight of the gradient estimator m", maximum=1.0),
}

ADAM_HPARAMS = {
  "beta3": HParam(0.1, "first-moment weight of the new gradient (1 - Adam beta1)", maximum=1.0),
  "beta4": HParam(0.001, "second-moment weight of the new gradient (1 - Adam beta2)", maximum=1.0),
  "tau": HParam(1e-8, "adaptivity tau added to sqrt(q)"),
}


def estimator_round(model, settings, state, data, key, release, server, step, **aggregate):
  """The local round of the FGDRO algorithms: ``(update, loss_estimates)``.

  Each participant starts from the server's carries ``server`` (a dict, the model under
  ``"params"``) and its own ``u``, its row of ``state.loss_estimates`` (never communicated);
  ``step`` advances the carry and ``aggregate`` says what the server reads of it (the
  ``averaged``, ``means`` and ``log_means`` carries of
  :func:`~fedjax_dro.core.local.stateful_local_round`); the participants' final ``u``
  (``carry["u"]``) is written back (a private round's empty slots dropped).
  """
  update = stateful_local_round(
    model,
    settings,
    data,
    key,
    start=lambda u: {**server, "u": u},
    step=step,
    client_state=state.loss_estimates,
    release=release,
    **aggregate,
  )
  u = state.loss_estimates.at[update.idx].set(update.carries["u"], mode="drop")
  return update, u


def kl_estimators(carry, loss, grad, hparams):
  """Lines 6-7 of Algorithms 2 and 3: ``(u, log v, h)`` after one local step.

  ``h = exp(u / lambda - log v) grad``: the local term of the gradient (6) of problem (5).
  """
  lam, beta1, beta2 = hparams["lam"], hparams["beta1"], hparams["beta2"]
  u = (1 - beta1) * carry["u"] + beta1 * loss
  log_v = jnp.logaddexp(jnp.log1p(-beta2) + carry["log_v"], jnp.log(beta2) + u / lam)
  weight = jnp.exp(u / lam - log_v)
  h = jax.tree.map(lambda g: weight * g, grad)
  return u, log_v, h


def kl_initial(params, num_clients):
  """``(m_bar, log v_bar, u)`` initial values shared with FGDRO-KL-Adam: zeros."""
  dtype = jnp.result_type(float)
  return tree_zeros_like(params), jnp.zeros((), dtype), jnp.zeros((num_clients,), dtype)


def kl_round(model, settings, state, data, key, hparams, release, *, shared, move):
  """The local round of FGDRO-KL and FGDRO-KL-Adam: ``(final carries, log v_bar, loss
  estimates, metrics)``.

  Each participant starts from the server's ``shared`` carries (the model under ``"params"`` and
  its moments, all averaged), ``log v_bar`` and its own ``u``; each local step updates the
  estimators (:func:`kl_estimators`), then ``move(carry, h)`` returns the ``shared`` carries
  after their step along the weighted gradient ``h``. ``v`` is averaged in the log domain (a
  ``log_means`` carry of :func:`~fedjax_dro.core.local.stateful_local_round`) and reported as
  ``log_v``.

  In a private round (the private form of :mod:`fedjax_dro.algorithms.fgdro_kl`) each participant
  releases ``v_rel - 1``, ``v_rel = v_i / v_bar``, with its other deltas."""

  def step(carry, loss, grad):
    u, log_v, h = kl_estimators(carry, loss, grad, hparams)
    return {**move(carry, h), "log_v": log_v, "u": u}

  server, averaged = {**shared, "log_v": state.log_v}, tuple(shared)
  log_means = (("log_v", "v_rel", state.log_v),)
  update, loss_estimates = estimator_round(
    model, settings, state, data, key, release, server, step, averaged=averaged, log_means=log_means
  )
  log_v = update.carries["log_v"]
  metrics = stateful_round_metrics(update)
  metrics["log_v"] = log_v
  return update.carries, log_v, loss_estimates, metrics


def momentum_step(carry, h, hparams):
  """Lines 8-9 of Algorithm 2: the moving average ``m`` of ``h`` and the model's step along it."""
  lr, beta3 = hparams["client_lr"], hparams["beta3"]
  m = jax.tree.map(lambda a, b: ((1 - beta3) * a + beta3 * b).astype(a.dtype), carry["m"], h)
  w = jax.tree.map(lambda p, d: (p - lr * d).astype(p.dtype), carry["params"], m)
  return w, m


def adam_step(carry, h, hparams):
  """Lines 7-8 of Algorithm 4 (lines 8-9 of Algorithm 3): moments and the adaptive step."""
  lr, beta3, beta4, tau = (hparams[k] for k in ("client_lr", "beta3", "beta4", "tau"))
  m = jax.tree.map(lambda a, b: ((1 - beta3) * a + beta3 * b).astype(a.dtype), carry["m"], h)
  q = jax.tree.map(lambda a, b: ((1 - beta4) * a + beta4 * b * b).astype(a.dtype), carry["q"], h)
  w = jax.tree.map(
    lambda p, a, b: (p - lr * a / (jnp.sqrt(b) + tau)).astype(p.dtype), carry["params"], m, q
  )
  return w, m, q
