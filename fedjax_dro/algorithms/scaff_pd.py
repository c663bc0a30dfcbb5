"""SCAFF-PD: accelerated primal-dual federated DRO with bias-corrected local steps.

Yu, Karimireddy, Ma, Jordan, "Scaff-PD: Communication Efficient Fair and Robust Federated
Learning", arXiv:2307.13381 (Algorithms 1 and 2, Conditions 5.1 and 5.2). Problem (eq. (1.1))::

    min_x max_{lambda in Lambda}  sum_i lambda_i f_i(x) - psi(lambda)

with ``f_i`` the client objective of the simulator (``common.model.client_loss``: masked mean loss
plus ``l2/2 ||x||^2``; no sample-count weighting, so with ``psi="chi2"`` and ``rho -> infinity``
the solution is the *uniform*-weight ERM minimizer ``argmin (1/n) sum_i f_i``).

One round ``r`` (full participation, as in the paper)::

    L_i = f_i(x^r), c_i = g_i(x^r)                         (every client; g_i = minibatch gradient
                                                             with ``batch_size``, exact otherwise)
    s = (1 + theta_r) L^r - theta_r L^{r-1}                 (L^{-1} := L^0)
    lambda^{r+1} = argmin_{lambda in Lambda} psi(lambda) - <s, lambda> + ||lambda - lambda^r||^2/(2 sigma_r)
                                                            (psi.prox, solvers.dro)
    c = sum_i lambda^{r+1}_i c_i
    u_i <- u_i - eta_l (g_i(u_i) - c_i + c)                 (J = local_steps steps from u_i = x^r)
    du_i = (x^r - u_i^J) / (eta_l J)
    x^{r+1} = x^r - tau_r sum_i lambda^{r+1}_i du_i         (eq. (4.2) with D = ||.||^2 / 2)

``psi`` (factory option, a problem of :mod:`fedjax_dro.solvers.dro` or its name): ``"chi2"``
(hparam ``rho``; Lambda = simplex; ``rho = 0`` is AFL), ``"cvar"`` (hparam ``alpha``; capped
simplex), ``"qffl"`` (hparam ``q``; Lambda = R^n, psi = sum |lambda_i|^(1+1/q), see
``solvers.simplex``). The round rebuilds the problem from its hyper-parameter
(``psi.from_hparams(hparams)``), so a sweep vectorizes over it. lambda^0 is uniform.

Parameter rules (factory option ``parameter_rule``):

* ``"user"``: fixed ``tau``, ``sigma``, ``theta`` hyper-parameters.
* ``"condition_5_1"`` (strongly-convex-concave, O(1/R^2)): hparams ``tau`` (= tau_bar = tau_0),
  ``sigma`` (= sigma_0, i.e. gamma_0 = sigma_0 / tau_0) and ``mu`` (mu_x). The paper fixes
  sigma_{-1} = gamma_0 tau_bar, sigma_r = gamma_r tau_r, theta_r = sigma_{r-1}/sigma_r and
  gamma_{r+1} = gamma_r (1 + mu_x tau_r) but leaves tau_r implicit; we take the accelerated
  primal-dual rule of Hamedani & Aybat (2021) / Chambolle & Pock (2011) that keeps tau_r sigma_r
  constant: tau_{r+1} = tau_r sqrt(gamma_r / gamma_{r+1}) = tau_r / sqrt(1 + mu_x tau_r). With
  t_r = tau_r / tau_0 (stored in the state, t_0 = 1): tau_r = tau_0 t_r, sigma_r = sigma_0 / t_r,
  theta_r = t_r / t_{r-1} (theta_0 = 1 since sigma_{-1} = sigma_0). ``mu = 0`` gives constant
  steps and theta = 1 (plain PDHG).
* ``"condition_5_2"`` (strongly-convex-strongly-concave, linear rate; ``psi="chi2"`` with
  ``rho > 0`` only, mu_lambda = rho n is the strong convexity of the chi^2 psi): hparams ``mu``
  (mu_x), ``L`` (L_xx), ``L_lx`` (L_lambda_x) and ``safety`` s. The paper states the rule up to
  constants (eq. (5.3)); we take kappa = L / mu + L_lx / sqrt(mu mu_lambda) and the fixed
  parameters with (1 - theta) / theta = 1 / (s kappa) exactly, i.e.
  theta = s kappa / (1 + s kappa), tau = 1 / (s kappa mu), sigma = 1 / (s kappa mu_lambda), which
  satisfy mu tau = mu_lambda sigma = (1 - theta)/theta and 1/(1 - theta) = 1 + s kappa = O(kappa).

Client-level differential privacy (:func:`fedjax_dro.privacy.private`; what each participant
releases is ``RELEASES["scaff_pd"]`` of :mod:`fedjax_dro.privacy.wrapper`): every participant's
``c_i`` and ``du_i`` are clipped to ``C / sqrt(2)`` each (together within ``C``) and their
lambda-weighted sums noised, its ``L_i`` clipped to ``[0, B]`` and noised. With Poisson
participation (rate ``q``) the round runs on the drawn clients only: the sums are scaled by
``1 / q`` and the dual step reads ``L_i / q`` for a participant and 0 for the others (AFL's
unbiased estimate of the loss vector); under fixed sampling every client takes part, as here.

State: ``params`` (x^r), ``lam`` (lambda^r), ``prev_losses`` (L^{r-1}), the Condition 5.1 step
ratios and ``round``. Metrics: ``train_loss`` (unweighted mean of L^r), ``train_loss_max``,
``weighted_loss`` (<lambda^{r+1}, L^r>), ``lambda_max``, ``lambda_min`` and the ``tau``, ``sigma``,
``theta`` used in the round.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.common.model import client_loss_and_grad
from fedjax_dro.core.aggregation import tree_add
from fedjax_dro.core.clients import map_clients_weighted_sum
from fedjax_dro.core.costs import Costs, local_training_cost, one_gradient_each, parameter_count
from fedjax_dro.core.local import local_sgd, map_client_data
from fedjax_dro.core.precision import params_float_dtype
from fedjax_dro.core.release import PLAIN, Releases, loss_metrics
from fedjax_dro.core.schedule import local_step_counts
from fedjax_dro.core.settings import CommonSettings, backend_for, check_data_matches, round_zero
from fedjax_dro.solvers.dro import Chi2, DROProblem, initial_lambda, resolve

PARAMETER_RULES = ("user", "condition_5_1", "condition_5_2")
SAMPLE_STREAM = 0x5A  # fold_in tag of a private round's Poisson draw (apart from the clients' keys)

RELEASES = Releases(
  "each participant, in two messages a round: first its loss L_i = f_i(x) (clipped to [0, B] and "
  "noised, z_l B; the dual step reads L_i / q for a participant and 0 for the others, AFL's "
  "unbiased estimate) and its gradient c_i = g_i(x) at the global model (clipped to C / sqrt(2); "
  "the server reads the lambda-weighted sum scaled by 1 / q, noised for the largest weight, z C "
  "max(lambda) / q), which give lambda and the correction c (post-processing); then, after its "
  "local steps corrected by its own unclipped c_i and the released c, its direction du_i = (x - "
  "u_i) / (lr J_i) (clipped to C / sqrt(2); its lambda-weighted sum likewise noised, z C "
  "max(lambda) / q), which moves x (post-processing). With sampling='fixed' every client takes "
  "part each round and 1 / q is 1. The two vectors together stay within C (one Gaussian "
  "mechanism of multiplier z, adaptively composed), and with the losses one of multiplier "
  "(z^-2 + z_l^-2)^(-1/2); each client's c_i and local iterates stay on the client",
  losses="loss at the global model",
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""


class ScaffPDState(NamedTuple):
  params: Any  # x^r, the global model
  lam: jnp.ndarray  # [n] dual weights lambda^r
  prev_losses: jnp.ndarray  # [n] loss vector L^{r-1} of the previous round (unused at r = 0)
  step_ratio: jnp.ndarray  # [] t_r = tau_r / tau_0 (Condition 5.1; stays 1 otherwise)
  prev_step_ratio: jnp.ndarray  # [] t_{r-1} (t_{-1} = 1)
  round: jnp.ndarray  # [] int32 rounds done


def _hparams(problem: DROProblem, rule: str) -> dict:
  hp = {"client_lr": HParam(0.05, "local step size eta_l")}
  if rule == "user":
    hp["tau"] = HParam(0.5, "primal step tau")
    hp["sigma"] = HParam(0.5, "dual step sigma")
    hp["theta"] = HParam(
      1.0, "dual extrapolation theta in [0, 1]", minimum=0.0, strict=False, maximum=1.0
    )
  elif rule == "condition_5_1":
    hp["tau"] = HParam(0.5, "initial primal step tau_0 (= tau_bar)")
    hp["sigma"] = HParam(0.5, "initial dual step sigma_0 (= gamma_0 tau_0)")
    hp["mu"] = HParam(
      0.1, "strong convexity mu_x of the client objectives", minimum=0.0, strict=False
    )
  else:
    hp["mu"] = HParam(0.1, "strong convexity mu_x of the client objectives")
    hp["L"] = HParam(1.0, "smoothness L_xx of the client objectives")
    hp["L_lx"] = HParam(
      1.0, "Lipschitz constant L_lambda_x of the loss vector", minimum=0.0, strict=False
    )
    hp["safety"] = HParam(1.0, "safety factor s: (1 - theta)/theta = 1/(s kappa)")
  hp.update(problem.hparams())
  if rule == "condition_5_2":  # mu_lambda = rho n must be > 0
    hp["rho"] = HParam(
      hp["rho"].default,
      "chi^2 penalty strength rho > 0 (strong concavity rho n)",
      minimum=0.0,
      strict=True,
    )
  return hp


def parameter_schedule(rule: str, hparams, step_ratio, prev_step_ratio, num_clients: int):
  """``(tau_r, sigma_r, theta_r)`` of round r for a parameter rule (see the module docstring)."""
  if rule == "user":
    return hparams["tau"], hparams["sigma"], hparams["theta"]
  if rule == "condition_5_1":
    return (
      hparams["tau"] * step_ratio,
      hparams["sigma"] / step_ratio,
      step_ratio / prev_step_ratio,
    )
  if rule == "condition_5_2":
    mu, mu_lam = hparams["mu"], hparams["rho"] * num_clients
    kappa = hparams["L"] / mu + hparams["L_lx"] / jnp.sqrt(mu * mu_lam)
    sk = hparams["safety"] * kappa
    return 1.0 / (sk * mu), 1.0 / (sk * mu_lam), sk / (1.0 + sk)
  raise ValueError(f"parameter_rule must be one of {PARAMETER_RULES}, got {rule!r}")


def next_step_ratio(rule: str, hparams, step_ratio):
  """t_{r+1} = t_r / sqrt(1 + mu tau_0 t_r) for Condition 5.1 (unchanged otherwise)."""
  if rule == "condition_5_1":
    return step_ratio / jnp.sqrt(1.0 + hparams["mu"] * hparams["tau"] * step_ratio)
  return step_ratio


@register("scaff_pd", family="dro")
@with_settings(
  ("local_steps", "local_epochs", "batch_size", "backend", "chunk_size"),
  fixed={"clients_per_round": None, "weighting": "uniform"},
)
def scaff_pd(
  model,
  settings: CommonSettings,
  *,
  psi: str | DROProblem = "chi2",
  parameter_rule: str = "user",
) -> Algorithm:
  """SCAFF-PD (Yu et al.): accelerated primal-dual DRO with SCAFFOLD-corrected local steps.

  SCAFF-PD (full participation, every client every round).

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` of the primal iterate ``x``.
    psi: the dual regulariser: a problem of :mod:`fedjax_dro.solvers.dro` with a prox step,
      ``chi2(rho)``, ``cvar(alpha)`` or ``qffl(q)`` (its parameter is then the default of the
      hyper-parameter ``rho`` / ``alpha`` / ``q``), or its name, ``"chi2"`` (default),
      ``"cvar"`` or ``"qffl"`` (at the default parameter).
    parameter_rule: how the steps are set each round: ``"user"`` (default, constant),
      ``"condition_5_1"`` or ``"condition_5_2"`` (the paper's step-size conditions; see the
      module docstring).
    local_steps: ``J``, the bias-corrected local steps per round (default 10).
    local_epochs: instead of ``local_steps``, passes over each client's own rows per round,
      without replacement, in consecutive batches of ``batch_size`` of a fresh random order each
      pass (see :func:`fedjax_dro.core.schedule.local_schedule`). Client ``i`` then takes ``J_i =
      local_epochs * ceil(N_i / batch_size)`` steps and its direction is ``du_i = (x^r -
      u_i^{J_i}) / (eta_l J_i)``, the step-count normalization SCAFFOLD uses for uneven local
      work, so that ``du_i`` stays an average corrected gradient. ``None`` (default):
      ``local_steps``.
    batch_size: local minibatch size; ``None`` (default): full batches, deterministic gradients.

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. Hyper-parameters (which ones depend on
    ``parameter_rule``): ``client_lr`` (the local step eta_l, default 0.05); ``"user"``: ``tau``,
    ``sigma`` (primal and dual steps, default 0.5 each) and ``theta`` (dual extrapolation in ``[0,
    1]``, default 1.0); ``"condition_5_1"``: ``tau``, ``sigma`` (the initial steps tau_0, sigma_0)
    and ``mu`` (strong convexity mu_x, default 0.1); ``"condition_5_2"``: ``mu``, ``L``
    (smoothness L_xx, default 1.0), ``L_lx`` (Lipschitz constant L_lambda_x, default 1.0) and
    ``safety`` (default 1.0); and the parameter of ``psi`` (``rho``, ``alpha`` or ``q``).
    A round takes two uploads per client: its loss and gradient at ``x^r`` (``P + 1`` floats,
    ``P`` parameters; one gradient, one step on the critical path), then after its ``J`` local
    steps its direction ``du_i`` (``P`` floats).
  """
  problem = resolve(psi)
  if not problem.has_prox:
    raise ValueError(
      f"scaff_pd needs a psi with a dual prox step (chi2, cvar or qffl), got psi={problem.name!r}"
    )
  if parameter_rule not in PARAMETER_RULES:
    raise ValueError(f"parameter_rule must be one of {PARAMETER_RULES}, got {parameter_rule!r}")
  if parameter_rule == "condition_5_2" and not isinstance(problem, Chi2):
    raise ValueError(
      "parameter_rule='condition_5_2' needs a strongly convex psi: use psi='chi2' "
      f"(with rho > 0), got psi={problem.name!r}"
    )
  hparam_specs = _hparams(problem, parameter_rule)

  def init(params, data, key):
    del key
    n = data.num_clients
    dtype = params_float_dtype(params)
    # distinct buffers for every leaf: the simulator donates the state
    return ScaffPDState(
      params,
      initial_lambda(n, dtype),
      jnp.zeros((n,), dtype),
      jnp.ones((), dtype),
      jnp.ones((), dtype),
      round_zero(),
    )

  def round_fn(state, data, key, hparams, release=PLAIN):
    n = data.num_clients
    check_data_matches(data, state.lam.shape[0])
    backend = backend_for(settings, state.params)
    x = state.params
    eval_key, local_key = jax.random.split(key)
    eval_keys, local_keys = jax.random.split(eval_key, n), jax.random.split(local_key, n)
    # every client (a private round: Poisson participants, or every client with fixed sampling)
    draw = release.draw(jax.random.fold_in(key, SAMPLE_STREAM), n, n)
    clients = data
    if draw.present is not None:  # the drawn clients' slots, with their own keys
      clients = data.take_clients(draw.rows)
      eval_keys, local_keys = eval_keys[draw.rows], local_keys[draw.rows]
    s = draw.idx.shape[0]
    agg = release.aggregation(None, draw.present, s, n)
    present = release.present(agg.weights)  # private: the filled slots
    scale = release.inverse_rate(n, s)  # 1 (private, Poisson: 1 / q, unbiased for all clients)

    # (1) each participant reports L_i = f_i(x) and c_i = g_i(x) (private: c_i clipped to
    # C / sqrt(2) for the server, its own c_i kept for its local steps)
    def report(xd, yd, nex, k):
      loss, grad = client_loss_and_grad(model, x, xd, yd, nex, k, settings.batch_size)
      sent, within = release.clip_part(grad, 2)
      return loss, grad, sent, within

    losses, grads, sent, within = map_client_data(
      report, clients, eval_keys, backend=backend, chunk_size=settings.chunk_size
    )
    released = release.losses(losses, key)  # private: clipped to [0, B], noised
    # the loss vector: every client's in order, or (Poisson participants) L_i / q for a
    # participant and 0 for the others
    v = released
    if draw.present is not None:
      v = jnp.zeros((n,), losses.dtype).at[draw.idx].set(scale * released, mode="drop")

    # (2) extrapolated dual prox step
    tau, sigma, theta = parameter_schedule(
      parameter_rule, hparams, state.step_ratio, state.prev_step_ratio, n
    )
    prev = jnp.where(state.round == 0, v, state.prev_losses)
    s_dual = (1.0 + theta) * v - theta * prev
    lam = problem.from_hparams(hparams).prox(state.lam, s_dual, sigma)

    # (3) c = sum_i lam_i c_i (private: noised for the largest weight), corrected local steps
    # with each client's own c_i, and the lambda-weighted primal step
    w = scale * lam[jnp.minimum(draw.idx, n - 1)]
    bound = scale * jnp.max(lam)
    c = release.sum(sent, w, present, bound, key)
    lr = hparams["client_lr"]

    def local_update(xd, yd, nex, k, c_i):
      return release.clip_part(direction(x, xd, yd, nex, k, c_i, c, lr), 2)

    weights = w if draw.present is None else w * agg.weights
    # sum_i lam_i du_i accumulated chunk by chunk: the clients' du are never stacked
    lam_du, within_du = map_clients_weighted_sum(
      local_update,
      weights,
      clients.x,
      clients.y,
      clients.num_examples,
      local_keys,
      grads,
      backend=backend,
      chunk_size=settings.chunk_size,
    )
    lam_du = release.total(lam_du, bound, key)
    _, unclipped = agg.received((None, jnp.logical_and(within, within_du)), agg.weights)
    params = tree_add(x, lam_du, -tau)

    new_state = ScaffPDState(
      params,
      lam,
      v,
      next_step_ratio(parameter_rule, hparams, state.step_ratio),
      state.step_ratio,
      state.round + 1,
    )
    dtype = losses.dtype
    metrics = {  # of the released losses, over the participants
      **loss_metrics(released, present),
      "weighted_loss": jnp.dot(lam, v),
      "lambda_max": jnp.max(lam),
      "lambda_min": jnp.min(lam),
      "tau": jnp.asarray(tau, dtype),
      "sigma": jnp.asarray(sigma, dtype),
      "theta": jnp.asarray(theta, dtype),
      **draw.metrics,
      **unclipped,
    }
    return new_state, metrics

  def direction(x, xd, yd, nex, k, c_i, c, lr):
    """``du_i = (x - u_i^J) / (lr J_i)`` after the client's corrected local steps from ``x``."""
    correct = lambda w, g: jax.tree.map(lambda gi, ci, cc: gi - ci + cc, g, c_i, c)
    u, _ = local_sgd(
      model,
      x,
      xd,
      yd,
      nex,
      k,
      num_steps=settings.local_steps,
      batch_size=settings.batch_size,
      lr=lr,
      grad_transform=correct,
      num_epochs=settings.local_epochs,
    )
    # J, or under local_epochs the client's own J_i (1 for a client without rows: u = x)
    steps = jnp.maximum(local_step_counts(settings, nex), 1)
    return jax.tree.map(lambda a, b: (a - b) / (lr * steps), x, u)

  def cost(data):
    # every client: L_i and c_i = g_i(x^r) (P + 1 floats), then J corrected steps and du_i (P)
    p = parameter_count(model)
    return Costs(
      one_gradient_each(data.num_clients, p + 1) + local_training_cost(settings, data, p)
    )

  return build_algorithm(
    "scaff_pd",
    model,
    settings,
    init,
    round_fn,
    hparam_specs,
    cost=cost,
    releases=RELEASES,
    psi=problem.name,
    **problem.config(),
    parameter_rule=parameter_rule,
  )
