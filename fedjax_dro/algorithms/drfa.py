"""DRFA and DRFA-Prox: Distributionally Robust Federated Averaging.

Deng, Kamani, Mahdavi, "Distributionally Robust Federated Averaging", NeurIPS 2020,
arXiv:2102.12660 (Algorithm 1, DRFA; Algorithm 2, DRFA-Prox for a regularized dual). One round
``s`` with tau = ``local_steps``, m = ``clients_per_round``::

    D = m clients drawn i.i.d. with probabilities lambda (with replacement)
    t' ~ Uniform{0, ..., tau - 1}                           (the snapshot step)
    each i in D: tau local SGD steps w_i <- w_i - eta g_i(w_i) from w, keeping w_i^{t'}
    w <- (1/m) sum_{i in D} w_i^tau,   w' = (1/m) sum_{i in D} w_i^{t'}
    U = m clients drawn uniformly without replacement; v_i = (n/m) f_i(w'; xi) on U, 0 elsewhere
    DRFA:       lambda <- Proj_Lambda(lambda + gamma tau (v - grad psi(lambda)))
    DRFA-Prox:  lambda <- argmax_{u in Lambda} tau gamma <v, u> - tau gamma psi(u) - ||u - lambda||^2 / 2
                        = psi.prox(lambda, v, sigma = gamma tau)      (solvers.dro)

Readings chosen where the paper leaves room:

* The snapshot ``t'`` counts the local steps done before it (0 = the received model), so that
  ``tau f_i(w^{t'})`` is an unbiased estimate of the sum of the losses at the tau iterates where
  the local gradients are evaluated (what tau steps of centralized gradient ascent would use).
* ``psi`` (factory option): ``"chi2"`` (hparam ``rho``; rho = 0, the default, is the AFL objective
  of the paper's DRFA) or ``"cvar"`` (hparam ``alpha``; Lambda = capped simplex, psi = 0). Plain
  DRFA (``prox=False``) handles a smooth psi through its gradient (chi^2: rho (n lambda - 1));
  ``prox=True`` is DRFA-Prox. ``"qffl"`` is rejected: DRFA samples clients with probabilities
  lambda, so Lambda must be a subset of the simplex.
* ``sampling="full"`` (not in the paper; the deterministic "expected" variant, used to give DRFA
  its best case in benchmarks): every client trains, models are averaged with weights lambda, and
  every client evaluates the snapshot (v = f(w')). Requires full participation.

Private form (:func:`fedjax_dro.privacy.private`, ``loss_bound=B``; ``sampling="lambda"`` only).
A single Poisson rate cannot describe sampling by lambda, so the private round draws its
participants uniformly and weights them by lambda instead (importance weights)::

    P = a uniform sample: Poisson at rate q, or m of n without replacement (q = m / n)
    each i in P: tau local SGD steps from w as above; d_i = w_i^tau - w, e_i = w_i^{t'} - w,
                 (d_i, e_i) clipped together to L2 norm C (one vector: both are released)
    (D, E) = sum_{i in P} (lambda_i / q) (d_i, e_i) + N(0, (z C max(lambda) / q)^2 I)
    w <- w + D,   w' = w + E
    U = a second uniform sample, drawn independently of P (Poisson at q, or m of n)
    v_i = (1 / q) (min(max(f_i(w'; xi), 0), B) + N(0, (z_l B)^2)) on U, 0 elsewhere
    the lambda step as above

``E[D] = sum_i lambda_i d_i``: the expectation of the plain round's ``(1/m) sum_{i in D} d_i``
with D drawn by lambda (and what ``sampling="full"`` computes); likewise for the snapshot. Adding
or removing one client moves ``(D, E)`` by at most ``C max(lambda) / q`` (lambda is public: it is
computed from earlier releases), hence the noise; the pair is clipped jointly since the snapshot
delta is a second model-sized release of the same participants, so one Gaussian mechanism covers
both. The losses are a second sampled Gaussian mechanism, on the independent sample U: the
accountant composes the two each round (:func:`fedjax_dro.privacy.accounting.composed_epsilon`).
The round reports ``dp_participants`` / ``dp_dropped`` of P and ``dp_loss_participants`` /
``dp_loss_dropped`` of U; its loss metrics are the simulator's, over P's filled slots.

lambda^0 is uniform. Metrics: ``train_loss`` (unweighted mean of the trained clients' losses at
the received model), ``train_loss_max``, ``lambda_max``, ``lambda_min``; lambda is ``state.lam``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.common.checks import choice, flag
from fedjax_dro.common.model import client_loss_and_grad
from fedjax_dro.core.costs import Costs, RoundCost, local_training_cost, parameter_count
from fedjax_dro.core.local import map_client_data
from fedjax_dro.core.precision import params_float_dtype
from fedjax_dro.core.release import PLAIN, Draw, Refused, Releases, loss_metrics
from fedjax_dro.core.settings import (
  CommonSettings,
  backend_for,
  check_data_matches,
  participants,
  round_zero,
)
from fedjax_dro.solvers.dro import DROProblem, initial_lambda, resolve

SAMPLING = ("lambda", "full")

RELEASES = Releases(
  "each participant of a uniform sample (Poisson at q, or s of n: q = s / n; not lambda-sampled) "
  "sends its final and snapshot model deltas, clipped together to C (one vector); the server's "
  "lambda_i / q weighted sums are noised for the largest weight (std z C max(lambda) / q); the "
  "clients of a second, independent uniform sample send their losses at the snapshot model "
  "(clipped to [0, B] and noised, std z_l B), which drive the lambda ascent (post-processing)",
  losses="loss at the snapshot model (a second, independent sample's)",
  separate_loss_sample=True,
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`), with ``sampling="lambda"``."""

FULL_SAMPLING = Refused(
  "with sampling='full' it averages every client with weights lambda each round; its private "
  "form draws a uniform sample (Poisson or fixed) and weights it by lambda / q: build drfa with "
  "sampling='lambda'"
)


class DRFAState(NamedTuple):
  params: Any  # w, the global model
  lam: jnp.ndarray  # [n] mixture weights lambda
  round: jnp.ndarray  # [] int32


def local_sgd_with_snapshot(
  model, params, x, y, num_examples, key, *, num_steps, batch_size, lr, snapshot_step
):
  """``num_steps`` local SGD steps; also returns the iterate after ``snapshot_step`` steps.

  Returns ``(final_params, snapshot_params, loss_at_params)``. ``snapshot_step`` may be traced.
  """

  def step(carry, inp):
    w, snap = carry
    j, step_key = inp
    snap = jax.tree.map(lambda a, b: jnp.where(j == snapshot_step, a, b), w, snap)
    loss, g = client_loss_and_grad(model, w, x, y, num_examples, step_key, batch_size)
    # keep each leaf's dtype (float32 params with a float64 step size stay float32)
    return (jax.tree.map(lambda a, b: (a - lr * b).astype(a.dtype), w, g), snap), loss

  (w, snap), losses = jax.lax.scan(
    step, (params, params), (jnp.arange(num_steps), jax.random.split(key, num_steps))
  )
  return w, snap, losses[0]


@register("drfa", family="dro")
@with_settings(
  ("clients_per_round", "local_steps", "batch_size", "backend", "chunk_size"),
  fixed={"weighting": "uniform"},
)
def drfa(
  model,
  settings: CommonSettings,
  *,
  psi: str | DROProblem = "chi2",
  prox: bool = False,
  sampling: str = "lambda",
) -> Algorithm:
  """DRFA / DRFA-Prox (Deng 2020): lambda-sampled local SGD, snapshot-based dual ascent.

  ``prox`` chooses DRFA (a projected gradient step on lambda) or DRFA-Prox (a proximal step);
  the server averages without weights.

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` of ``w``.
    psi: the regulariser of lambda: a problem of :mod:`fedjax_dro.solvers.dro` whose Lambda lies
      in the simplex, ``chi2(rho)`` or ``cvar(alpha)`` (its parameter becomes the default of the
      hyper-parameter), or its name, ``"chi2"`` (default, ``rho = 0``) or ``"cvar"`` (capped
      simplex); ``qffl`` is refused (lambda must stay in the simplex to sample with it).
    prox: ``False`` (default): DRFA, a projected gradient step on lambda; ``True``: DRFA-Prox,
      a proximal step.
    sampling: ``"lambda"`` (default): the paper's ``m`` clients drawn i.i.d. with probabilities
      lambda; ``"full"``: every client trains and the models are averaged with weights lambda
      (needs full participation).
    clients_per_round: ``m``, the clients drawn for training (and for the dual estimate) each
      round; ``None`` (default): all ``n``.
    local_steps: ``tau``, local SGD steps per round (default 10). DRFA has no ``local_epochs``
      form: its dual estimate evaluates every sampled client's iterate after the same step
      ``t'`` drawn from ``[tau]`` (Algorithm 1), which needs one step count shared by all.
    batch_size: examples per local SGD step and per snapshot loss; ``None`` (default): full batch.

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. Hyper-parameters: ``client_lr`` (the local
    SGD step eta, default 0.05), ``gamma`` (the dual step; a round moves lambda by ``gamma *
    local_steps``, default 0.01) and the parameter of ``psi``: ``rho`` (chi^2 penalty, default 0:
    the AFL objective) or ``alpha`` (CVaR level). A round takes ``2m`` uploads: the ``m``
    trained clients send ``2P`` floats each (``P`` parameters: final and snapshot models), the
    ``m`` clients of the dual estimate one loss each.
  """
  problem = resolve(psi, rho=0.0)  # a name: the paper's unregularized problem, rho = 0
  if not problem.in_simplex:
    raise ValueError(
      "drfa samples clients with probabilities lambda, so psi must keep lambda in "
      f"the simplex: use psi='chi2' or psi='cvar', got psi={problem.name!r}"
    )
  if not problem.has_prox:
    raise ValueError(
      f"drfa needs a psi with a dual prox step (chi2 or cvar), got psi={problem.name!r}"
    )
  flag(prox, "prox")
  choice(sampling, "sampling", SAMPLING)
  hparam_specs = {
    "client_lr": HParam(0.05, "local SGD step size eta"),
    "gamma": HParam(0.01, "dual step size gamma (the dual step is gamma * tau)"),
    **problem.hparams(),
  }
  tau = settings.local_steps

  def init(params, data, key):
    del key
    n = data.num_clients
    m = participants(settings, n)
    if sampling == "full" and m != n:
      raise ValueError(
        f"sampling='full' needs every client each round: clients_per_round must be "
        f"None or {n}, got {settings.clients_per_round}"
      )
    return DRFAState(params, initial_lambda(n, params_float_dtype(params)), round_zero())

  def snapshot_sgd(params, lr, snapshot_step):
    """``(x, y, num_examples, key) -> (final, snapshot, first loss)``: a participant's ``tau``
    local SGD steps from ``params``, its iterate after ``snapshot_step`` kept."""
    return lambda xd, yd, nex, k: local_sgd_with_snapshot(
      model,
      params,
      xd,
      yd,
      nex,
      k,
      num_steps=tau,
      batch_size=settings.batch_size,
      lr=lr,
      snapshot_step=snapshot_step,
    )

  def round_fn(state, data, key, hparams, release=PLAIN):
    n = data.num_clients
    check_data_matches(data, state.lam.shape[0])
    m = participants(settings, n)
    backend = backend_for(settings, state.params)
    k_sample, k_snap, k_local, k_usample, k_eval = jax.random.split(key, 5)
    dtype = state.lam.dtype
    if sampling == "lambda":
      # m clients drawn with probabilities lambda, each weighted 1 / m (private: a uniform draw
      # weighted lambda / q, which no client's data decides)
      draw, agg = release.importance_draw(k_sample, n, m, state.lam)
      bound = release.inverse_rate(n, m) * jnp.max(state.lam)  # the largest weight of a client
    else:  # "full": every client, weighted lambda (plain only: refused by fd.private)
      every = jnp.arange(n)
      draw, agg, bound = Draw(every, every, None, {}), state.lam, None
    snapshot_step = jax.random.randint(k_snap, (), 0, tau)
    lr = hparams["client_lr"]

    client_update = snapshot_sgd(state.params, lr, snapshot_step)

    local_keys = jax.random.split(k_local, draw.idx.shape[0])
    finals, snaps, losses = map_client_data(
      client_update,
      data.take_clients(draw.rows),
      local_keys,
      backend=backend,
      chunk_size=settings.chunk_size,
    )
    # the weighted averages of the final and snapshot models (private: their changes from w,
    # clipped together, noised)
    (params, snapshot), averaged = release.model_average(
      (finals, snaps), state.params, agg, draw.present, bound, key
    )

    # dual: the losses at the snapshot model of a second, independent uniform sample
    if sampling == "lambda":
      udraw = release.uniform_draw(k_usample, n, m, "dp_loss")
      scale = release.inverse_rate(n, m)
    else:
      udraw, scale = Draw(every, every, None, {}), 1.0
    snap_loss = map_client_data(
      lambda xd, yd, nex, k: client_loss_and_grad(
        model, snapshot, xd, yd, nex, k, settings.batch_size
      )[0],
      data.take_clients(udraw.rows),
      jax.random.split(k_eval, udraw.idx.shape[0]),
      backend=backend,
      chunk_size=settings.chunk_size,
    )
    released = release.losses(snap_loss.astype(dtype), key)
    v = jnp.zeros((n,), dtype).at[udraw.idx].set(scale * released, mode="drop")
    lam = dual_step(state, v, hparams)
    metrics = {
      **loss_metrics(losses, draw.present),
      "lambda_max": jnp.max(lam),
      "lambda_min": jnp.min(lam),
      **draw.metrics,
      **udraw.metrics,
      **averaged,
    }
    return DRFAState(params, lam, state.round + 1), metrics

  def dual_step(state, v, hparams):
    step = hparams["gamma"] * tau
    round_problem = problem.from_hparams(hparams)
    if prox:
      return round_problem.prox(state.lam, v, step)
    # a smooth psi through its gradient (chi^2: rho (n lambda - 1)), then the projection
    return round_problem.projected_ascent(state.lam, v, step)

  def cost(data):
    # m trained clients upload their final and snapshot models; m others one snapshot loss each
    train = local_training_cost(settings, data, 2 * parameter_count(model))
    m = train.uploading_clients
    return Costs(train + RoundCost(uploading_clients=m, upload_floats=m))

  releases = RELEASES if sampling == "lambda" else FULL_SAMPLING
  config = {"psi": problem.name, **problem.config(), "prox": prox, "sampling": sampling}
  return build_algorithm(
    "drfa", model, settings, init, round_fn, hparam_specs, cost=cost, releases=releases, **config
  )
