""":func:`private`: an algorithm made client-level differentially private (DP-FedAvg).

McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language Models",
ICLR 2018, arXiv:1710.06963: every participant's update is clipped to L2 norm ``C``, the clipped
updates are summed, Gaussian noise of standard deviation ``z C`` is added to the sum once on the
server, and the sum is divided by the expected number of participants. The mechanics live in
:mod:`fedjax_dro.core.privacy`; the accounting in :mod:`fedjax_dro.privacy.accounting`.

What each algorithm releases every round and how it is privatized is :data:`RELEASES` (every
registered algorithm with a server); an algorithm not in it is refused with the reason: it cannot
be private (:data:`REFUSED`), or it is not declared (an algorithm a user registered;
:data:`NOT_YET`, empty for the registered ones).
"""

from __future__ import annotations

import math
from typing import Any, Dict, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dro.algorithms.base import Algorithm, HParam
from fedjax_dro.core.privacy import (
  SAMPLING,
  Privacy,
  check_rate,
  count_key,
  expected_participants,
  privatizing,
)
from fedjax_dro.privacy.accounting import ACCOUNTANTS, check_delta

DP_HPARAMS = (
  "dp_clip",
  "dp_noise",
  "dp_loss_bound",
  "dp_loss_noise",
  "dp_quantile",
  "dp_clip_lr",
  "dp_count_noise",
  "dp_cluster_noise",
)


class AdaptiveClipState(NamedTuple):
  """The state of an algorithm made private with adaptive clipping."""

  inner: Any  # the algorithm's own state
  clip_scale: Any  # [] float: this round's clip norm over the initial one (dp_clip)


_SUM = "the noised sum of the clipped updates over the expected participants"
RELEASES: Dict[str, str] = {
  "fedavg": f"each participant's model delta; the server reads {_SUM}",
  "fedprox": f"each participant's model delta (proximal local steps); the server reads {_SUM}",
  "fedadam": f"each participant's model delta; Adam's moments are computed on the server from "
  f"{_SUM} (post-processing)",
  "fedyogi": "as fedadam (Yogi's moments, on the server)",
  "fedadagrad": "as fedadam (Adagrad's accumulator, on the server)",
  "scaffold": "each participant's model delta; with local_steps (J steps each) the server control "
  "variate moves by q (-c - mean delta / (J lr)) from the same private mean (post-processing); "
  "with local_epochs (K_i steps for client i) each participant releases its model delta delta_i "
  "and its control-variate delta less the public c, c_i+ - c_i + c = -delta_i / (K_i lr), clipped "
  "together to C (one vector); the server reads their noised sums over the expected participants "
  "(noise z C on each) and c moves by q (-c + the mean of the second); each client's own control "
  "variate c_i+ (from its unclipped delta) stays on the client",
  "ditto": "each participant's global-model delta; the personal models never leave the clients",
  "afl": "each participant's gradient (clipped; the server's lambda-weighted sum, scaled by 1 / q, "
  "noised for the largest weight any client has) and its minibatch loss (clipped to [0, B] and "
  "noised), which drives the lambda ascent (post-processing)",
  "agnostic_fedavg": "each participant's model delta (clipped; the lambda-weighted sum over the "
  "expected weight q of the participants, noised for the largest lambda) and its full-data loss "
  "(clipped to [0, B] and noised), which drives lambda's exponentiated step (post-processing)",
}
RELEASES["dr_dsgd"] = (
  "each participant's model delta (its local steps weight each gradient by exp(loss / lambda) on "
  f"the client); the server reads {_SUM}"
)
RELEASES["fedavg_momentum"] = (
  "each participant's model and momentum deltas, clipped together to C (one vector); the server "
  "reads their noised sums over the expected participants"
)
RELEASES["fedsgd"] = (
  "each participant's minibatch gradient at the global model (clipped on its own: the private "
  f"round takes the per-client path, not FedSGD's folded backward pass); the server reads {_SUM}"
)
RELEASES["fgdro_cvar"] = (
  "each participant's model delta and threshold delta s_i - s_bar, clipped together to C; the "
  "server adds their noised sums over the expected participants to w_bar and s_bar; the loss "
  "estimator u stays on the client"
)
RELEASES["fgdro_kl"] = (
  "each participant's model and m deltas and the relative change v_i / v_bar - 1 of its v, "
  "clipped together to C; the server adds the noised sums over the expected participants to "
  "w_bar and m_bar and scales v_bar by one plus the third (at least 1e-6); u stays on the client"
)
RELEASES["fgdro_kl_adam"] = (
  "as fgdro_kl, with the second moment's delta q_i - q_bar clipped together with the others"
)
RELEASES["pfedme"] = (
  "each drawn participant's global-model delta w_{i,R} - w^t; the server reads "
  f"{_SUM} and takes its beta step from it; the personalized models theta_i never leave the "
  "clients (under personal_updates='all' every client still updates its own every round)"
)
RELEASES["ifca"] = (
  "each participant's model delta (clipped to C) into the sum of the cluster it chose on the "
  "client, and a 1 into that cluster's count: k sums noised with std z C each, k counts with "
  "std z_c each; cluster j moves by its noised sum over max(noised count, 1) where the count "
  "is at least 1/2"
)
RELEASES["scaff_pd"] = (
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
  "(z^-2 + z_l^-2)^(-1/2); each client's c_i and local iterates stay on the client"
)
RELEASES["qffl"] = (
  "each participant's F_k^q Delta_k (clipped to C; the server's sum noised with std z C) and its "
  "h_k = q F_k^(q-1) ||Delta_k||^2 + L F_k^q (clipped to [0, B]; the sum noised with std z_l B); "
  "the server steps by the first sum over the second floored at z_l B (post-processing)"
)
RELEASES["drfa"] = (
  "each participant of a uniform sample (Poisson at q, or s of n: q = s / n; not lambda-sampled) "
  "sends its final and snapshot model deltas, clipped together to C (one vector); the server's "
  "lambda_i / q weighted sums are noised for the largest weight (std z C max(lambda) / q); the "
  "clients of a second, independent uniform sample send their losses at the snapshot model "
  "(clipped to [0, B] and noised, std z_l B), which drive the lambda ascent (post-processing)"
)
# the algorithms that release a scalar report of each participant besides its update, clipped to
# [0, loss_bound] and noised with dp_loss_noise: what the report is
LOSS_REPORTS: Dict[str, str] = {
  "afl": "loss",
  "agnostic_fedavg": "loss",
  "scaff_pd": "loss at the global model",
  "qffl": "h_k = q F_k^(q-1) ||Delta_k||^2 + L F_k^q",
  "drfa": "loss at the snapshot model (a second, independent sample's)",
}
LOSS_RELEASES = tuple(LOSS_REPORTS)  # the algorithms that release their losses (or h_k) too
# those whose scalar reports come from a second participant sample drawn independently of the
# first: the accountant composes two sampled Gaussian mechanisms a round
SEPARATE_LOSS_SAMPLE = ("drfa",)
COUNT_RELEASES = ("ifca",)  # the algorithms that release per-group participant counts
# the registered algorithms whose releases are not privatized yet, with the reason (none today;
# an algorithm registered by a user is refused until it has a RELEASES entry)
NOT_YET: Dict[str, str] = {}
REFUSED: Dict[str, str] = {
  "local": "it has no server: nothing leaves a client, so there is nothing to privatize",
  "local_adam": "it has no server: nothing leaves a client, so there is nothing to privatize",
  "karula": "its server step projects all the clients' personalized models jointly onto the "
  "pairwise-distance constraints: it reads every client's model, so no clipped, noised sum of "
  "updates can stand in for it",
}


def _positive(value, name, *, zero_ok=False) -> float:
  ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
  if not ok or value < 0 or (value == 0 and not zero_ok):
    want = "a non-negative" if zero_ok else "a positive"
    raise ValueError(f"{name} must be {want} finite number, got {value!r}")
  return float(value)


def private(
  alg: Algorithm,
  clip_norm: float,
  noise_multiplier: float,
  *,
  sampling: str = "poisson",
  rate=None,
  delta: float = 1e-5,
  accountant: str = "rdp",
  loss_bound=None,
  loss_noise_multiplier=None,
  adaptive_quantile=None,
  adaptive_lr: float = 0.2,
  count_noise: float = 0.05,
  cluster_count_noise=None,
) -> Algorithm:
  """``alg`` made client-level differentially private (DP-FedAvg; module docstring).

  Each round every participant's update is clipped to L2 norm ``clip_norm``; the server adds
  Gaussian noise of standard deviation ``noise_multiplier * clip_norm`` to their sum and divides
  by the expected number of participants. Every participant counts once (the algorithm must be
  built with ``weighting="uniform"``: sample-count weights would let a large client outweigh the
  clip). Epsilon at ``delta`` is reported with every evaluation (``History.evaluations[i]
  ["privacy"]``, ``metrics.jsonl``, the summary, the CLI, the trackers), from ``dp-accounting``.

  The clip norm and the noise multiplier become the hyper-parameters ``dp_clip`` and
  ``dp_noise`` (defaults: the values given), so :func:`fedjax_dro.sweep` runs a grid over them
  as one program. The round also reports ``dp_participants`` (the slots filled) and
  ``dp_dropped`` (Poisson draws beyond the round's capacity; see
  :mod:`fedjax_dro.core.privacy`).

  Args:
    alg: an algorithm of :data:`RELEASES` (others are refused with the reason).
    clip_norm: the L2 bound ``C`` of each participant's update (> 0).
    noise_multiplier: ``z`` (>= 0; 0 adds no noise and reports epsilon = inf).
    sampling: ``"poisson"`` (default: each client takes part with probability ``rate``,
      independently, whatever the algorithm's ``clients_per_round``) or ``"fixed"`` (the
      algorithm's ``clients_per_round``, uniformly without replacement).
    rate: the Poisson rate ``q`` in (0, 1]; required with Poisson sampling, refused otherwise.
    delta: the delta at which epsilon is reported, in (0, 1).
    accountant: ``"rdp"`` (default) or ``"pld"`` (Poisson only;
      :mod:`fedjax_dro.privacy.accounting`).
    loss_bound: for the algorithms that also release a scalar report of each participant (afl,
      agnostic_fedavg, scaff_pd, drfa: its loss; qffl: its ``h_k``; :data:`LOSS_RELEASES`): each report is
      clipped to ``[0, loss_bound]`` (required there, refused elsewhere). Hyper-parameter
      ``dp_loss_bound``.
    loss_noise_multiplier: ``z_l``: each reported loss (qffl: the sum of the ``h_k``) gets noise
      of standard deviation ``z_l * loss_bound`` (default: ``noise_multiplier``).
      Hyper-parameter ``dp_loss_noise``. A round then releases two Gaussian mechanisms on the
      same participants, which compose exactly into one of noise multiplier
      ``(z^-2 + z_l^-2)^(-1/2)``: the accountant's. drfa's losses come from a second sample,
      drawn independently of the first (:data:`SEPARATE_LOSS_SAMPLE`): the accountant composes
      the two sampled mechanisms (:func:`fedjax_dro.privacy.accounting.run_epsilon`).
    adaptive_quantile: ``gamma`` in (0, 1) for adaptive clipping (Andrew, Thakkar, McMahan,
      Ramaswamy, "Differentially Private Learning with Adaptive Clipping", NeurIPS 2021,
      arXiv:1905.03871): each participant also reports whether its update was within the clip
      (``b_i`` in {0, 1}); the server adds Gaussian noise of standard deviation ``sigma_b`` to
      ``sum_i (b_i - 1/2)`` (sensitivity 1/2), forms ``b~ = released / m + 1/2`` with ``m`` the
      expected participants, and moves the clip geometrically,
      ``C <- C exp(-adaptive_lr (b~ - gamma))``, so that it tracks the ``gamma`` quantile of the
      update norms (``clip_norm`` is its start). The state becomes
      :class:`AdaptiveClipState`; the round reports the clip it used (``dp_clip``). None
      (default): a fixed clip. Hyper-parameter ``dp_quantile``.
    adaptive_lr: ``eta_C`` (> 0), hyper-parameter ``dp_clip_lr``.
    count_noise: ``sigma_b / m`` (>= 0; default 0.05, the paper's ``sigma_b = m / 20``),
      hyper-parameter ``dp_count_noise``. The centred count is a second Gaussian release: the
      accountant composes ``z`` with ``2 sigma_b`` (0: the count is released exactly and
      epsilon is infinite).
    cluster_count_noise: for the algorithms that release per-group participant counts (ifca;
      :data:`COUNT_RELEASES`): ``z_c``, the standard deviation of the noise on each cluster's
      count (sensitivity 1; default: ``noise_multiplier``; refused elsewhere). The accountant
      composes it with the update's release into one Gaussian of multiplier
      ``(z^-2 + z_c^-2)^(-1/2)``. Hyper-parameter ``dp_cluster_noise``.

  Raises:
    TypeError: if ``alg`` is not an Algorithm.
    ValueError: for an algorithm that cannot or does not yet have a private form, sample-count
      weighting, a non-positive clip, a negative noise multiplier, ``delta`` outside (0, 1), a
      missing or out-of-range ``rate``, or an unknown ``sampling`` / ``accountant``.
  """
  if not isinstance(alg, Algorithm):
    raise TypeError(f"alg must be an Algorithm, got {type(alg).__name__}")
  if "privacy" in alg.config:
    raise ValueError(f"{alg.name!r} is already private")
  if alg.name in REFUSED:
    raise ValueError(
      f"private: {alg.name!r} cannot be made client-level private: {REFUSED[alg.name]}"
    )
  if alg.name not in RELEASES:
    why = NOT_YET.get(alg.name, "its releases are not declared in RELEASES")
    raise ValueError(
      f"private: {alg.name!r} has no private form yet: {why}; supported: {sorted(RELEASES)}"
    )
  if alg.config.get("weighting", "uniform") != "uniform":
    raise ValueError(
      f"private: build {alg.name!r} with weighting='uniform': every participant counts once, so "
      f"that the clip bounds each client's share of the sum (got weighting="
      f"{alg.config['weighting']!r})"
    )
  if alg.name == "drfa" and alg.config.get("sampling", "lambda") != "lambda":
    raise ValueError(
      "private: drfa with sampling='full' averages every client with weights lambda each round; "
      "its private form draws a uniform sample (Poisson or fixed) and weights it by lambda / q: "
      "build drfa with sampling='lambda'"
    )
  clip_norm = _positive(clip_norm, "clip_norm")
  noise_multiplier = _positive(noise_multiplier, "noise_multiplier", zero_ok=True)
  delta = check_delta(delta)
  if sampling not in SAMPLING:
    raise ValueError(f"sampling must be one of {SAMPLING}, got {sampling!r}")
  if accountant not in ACCOUNTANTS:
    raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
  if sampling == "poisson":
    if rate is None:
      raise ValueError("rate: Poisson sampling needs the participation rate q in (0, 1]")
    rate = check_rate(rate)
  elif rate is not None:
    raise ValueError(f"rate is Poisson sampling's; got rate={rate!r} with sampling='fixed'")
  elif accountant == "pld":
    raise ValueError("accountant='pld' accounts Poisson sampling only; use 'rdp' with 'fixed'")
  losses = alg.name in LOSS_RELEASES
  if losses:
    if loss_bound is None:
      raise ValueError(
        f"loss_bound: {alg.name!r} releases each participant's {LOSS_REPORTS[alg.name]}, which "
        "is clipped to [0, loss_bound]; give the bound"
      )
    loss_bound = _positive(loss_bound, "loss_bound")
    loss_noise = noise_multiplier if loss_noise_multiplier is None else loss_noise_multiplier
    loss_noise = _positive(loss_noise, "loss_noise_multiplier", zero_ok=True)
  elif loss_bound is not None or loss_noise_multiplier is not None:
    raise ValueError(
      f"loss_bound / loss_noise_multiplier: {alg.name!r} releases no losses (the algorithms "
      f"that do: {list(LOSS_RELEASES)})"
    )
  counts = alg.name in COUNT_RELEASES
  if counts:
    cluster = noise_multiplier if cluster_count_noise is None else cluster_count_noise
    cluster_count_noise = _positive(cluster, "cluster_count_noise", zero_ok=True)
  elif cluster_count_noise is not None:
    raise ValueError(
      f"cluster_count_noise: {alg.name!r} releases no participant counts (the algorithms that "
      f"do: {list(COUNT_RELEASES)})"
    )
  adaptive = adaptive_quantile is not None
  if adaptive:
    q_ok = isinstance(adaptive_quantile, (int, float)) and not isinstance(adaptive_quantile, bool)
    if not q_ok or not 0.0 < adaptive_quantile < 1.0:
      raise ValueError(f"adaptive_quantile must be a number in (0, 1), got {adaptive_quantile!r}")
    adaptive_lr = _positive(adaptive_lr, "adaptive_lr")
    count_noise = _positive(count_noise, "count_noise", zero_ok=True)
  settings = Privacy(sampling, rate, delta)

  def private_round(state, data, key, hparams, clip):
    inner = {k: v for k, v in hparams.items() if k not in DP_HPARAMS}
    loss_args = (hparams["dp_loss_bound"], hparams["dp_loss_noise"]) if losses else (None, None)
    count_args = (hparams["dp_cluster_noise"],) if counts else ()
    with privatizing(settings, clip, hparams["dp_noise"], *loss_args, *count_args) as recorded:
      state, metrics = alg.round(state, data, key, inner)
    return state, {**metrics, **recorded}

  def round_fn(state, data, key, hparams):
    if not adaptive:
      return private_round(state, data, key, hparams, hparams["dp_clip"])
    clip = hparams["dp_clip"] * state.clip_scale
    inner, metrics = private_round(state.inner, data, key, hparams, clip)
    n = data.num_clients
    m = expected_participants(settings, n, alg.config.get("clients_per_round") or n)
    sigma = hparams["dp_count_noise"] * m
    # released: sum_i (b_i - 1/2) + N(0, sigma^2), sensitivity 1/2; b~ = released / m + 1/2
    centred = metrics["dp_unclipped"] - metrics["dp_participants"] / 2
    released = centred + sigma * jax.random.normal(count_key(key), ())
    step = hparams["dp_clip_lr"] * (released / m + 0.5 - hparams["dp_quantile"])
    scale = state.clip_scale * jnp.exp(-step).astype(state.clip_scale.dtype)
    return AdaptiveClipState(inner, scale), {**metrics, "dp_clip": clip}

  hparams = {
    **alg.hparams,
    "dp_clip": HParam(clip_norm, "L2 clip norm C of each participant's update"),
    "dp_noise": HParam(
      noise_multiplier, "noise multiplier z: noise std z C on the clipped sum", strict=False
    ),
  }
  if adaptive:
    hparams["dp_quantile"] = HParam(adaptive_quantile, "adaptive clipping's target quantile")
    hparams["dp_clip_lr"] = HParam(adaptive_lr, "adaptive clipping's geometric step")
    hparams["dp_count_noise"] = HParam(
      count_noise, "noise std on the clip count over the expected participants", strict=False
    )
  if losses:
    hparams["dp_loss_bound"] = HParam(loss_bound, "reported losses (q-FFL: h_k) clipped to [0, B]")
    hparams["dp_loss_noise"] = HParam(
      loss_noise,
      "loss noise multiplier z_l: noise std z_l B on each loss (q-FFL: on the sum of h_k)",
      strict=False,
    )
  if counts:
    hparams["dp_cluster_noise"] = HParam(
      cluster_count_noise, "noise std z_c on each cluster's participant count", strict=False
    )
  config = {
    **alg.config,
    "privacy": {
      "mechanism": "DP-FedAvg (clipped updates, Gaussian noise on the sum, "
      + ("the step a ratio of two noised sums)" if alg.name == "qffl" else "fixed denominator)"),
      "sampling": sampling,
      "rate": rate,
      "delta": delta,
      "accountant": accountant,
      "releases_losses": losses,
      "releases_counts": counts,
      "adaptive_clipping": adaptive,
    },
  }
  if alg.name in SEPARATE_LOSS_SAMPLE:  # two sampled mechanisms a round (accounting.run_epsilon)
    config["privacy"]["separate_loss_sample"] = True
  if not adaptive:
    return alg._replace(round=round_fn, hparams=hparams, config=config)
  real = jnp.result_type(float)
  return alg._replace(
    init=lambda params, data, key: AdaptiveClipState(
      alg.init(params, data, key), jnp.ones((), real)
    ),
    round=round_fn,
    client_models=lambda state: alg.client_models(state.inner),
    hparams=hparams,
    config=config,
  )
