""":func:`private`: an algorithm made client-level differentially private (DP-FedAvg).

McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language Models",
ICLR 2018, arXiv:1710.06963: every participant's update is clipped to L2 norm ``C``, the clipped
updates are summed, Gaussian noise of standard deviation ``z C`` is added to the sum once on the
server, and the sum is divided by the expected number of participants. The mechanics live in
:mod:`fedjax_dro.core.privacy`; the accounting in :mod:`fedjax_dro.privacy.accounting`.

What an algorithm releases every round, and how it is privatized, is declared on the algorithm
(:attr:`~fedjax_dro.algorithms.base.Algorithm.releases`, a
:class:`~fedjax_dro.core.release.Releases`); :func:`private` reads the declaration and passes the
round a :class:`~fedjax_dro.core.privacy.GaussianRelease`, the way an optax wrapper composes. An
algorithm that declares why it cannot be private (:class:`~fedjax_dro.core.release.Refused`), or
declares nothing (an algorithm a user wrote without a declaration), is refused with the reason;
:func:`releases_table` lists every registered algorithm's declaration.
"""

from __future__ import annotations

import math
from typing import Any, Dict, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp

from fedjax_dro.algorithms.base import Algorithm, HParam, list_algorithms
from fedjax_dro.common.checks import ArgumentError, is_real
from fedjax_dro.core.privacy import (
  SAMPLING,
  GaussianRelease,
  Privacy,
  check_rate,
  count_key,
  expected_participants,
)
from fedjax_dro.core.release import Refused, Releases
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


class PrivateSettings(NamedTuple):
  """The privacy of an algorithm made private (:attr:`Algorithm.privacy`): what the accountant
  reads.

  Attributes:
    sampling: ``"poisson"`` or ``"fixed"``.
    rate: the Poisson rate ``q`` (None with fixed sampling).
    delta: the delta at which epsilon is reported.
    accountant: ``"rdp"`` or ``"pld"``.
    releases: the algorithm's declaration (:class:`~fedjax_dro.core.release.Releases`).
    adaptive_clipping: whether the clip adapts (a second release: the clip count).
    clients_per_round: the fixed sample's size (None: every client).
  """

  sampling: str
  rate: Optional[float]
  delta: float
  accountant: str
  releases: Releases
  adaptive_clipping: bool
  clients_per_round: Optional[int]

  def record(self) -> Dict[str, Any]:
    """The JSON-able record written with the results (``Algorithm.config["privacy"]``)."""
    record = {
      "mechanism": self.releases.mechanism,
      "sampling": self.sampling,
      "rate": self.rate,
      "delta": self.delta,
      "accountant": self.accountant,
      "releases_losses": self.releases.losses is not None,
      "releases_counts": self.releases.counts,
      "adaptive_clipping": self.adaptive_clipping,
    }
    if self.releases.separate_loss_sample:  # two sampled mechanisms a round
      record["separate_loss_sample"] = True
    return record


def releases_table() -> Dict[str, Union[Releases, Refused, None]]:
  """Every registered algorithm's declaration (built with its default settings): what its
  participants release (:class:`~fedjax_dro.core.release.Releases`) or why it cannot be private
  (:class:`~fedjax_dro.core.release.Refused`)."""
  from fedjax_dro.models import linear_regression

  model = linear_regression(1)
  return {name: entry.factory(model).releases for name, entry in list_algorithms().items()}


def _positive(value, name, *, zero_ok=False) -> float:
  ok = is_real(value) and math.isfinite(value)
  if not ok or value < 0 or (value == 0 and not zero_ok):
    want = "a non-negative" if zero_ok else "a positive"
    raise ArgumentError(name, f" must be {want} finite number, got {value!r}")
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
    alg: an algorithm that declares its releases (:attr:`Algorithm.releases`; others are
      refused with the reason).
    clip_norm: the L2 bound ``C`` of each participant's update (> 0).
    noise_multiplier: ``z`` (>= 0; 0 adds no noise and reports epsilon = inf).
    sampling: ``"poisson"`` (default: each client takes part with probability ``rate``,
      independently, whatever the algorithm's ``clients_per_round``) or ``"fixed"`` (the
      algorithm's ``clients_per_round``, uniformly without replacement).
    rate: the Poisson rate ``q`` in (0, 1]; required with Poisson sampling, refused otherwise.
    delta: the delta at which epsilon is reported, in (0, 1).
    accountant: ``"rdp"`` (default) or ``"pld"`` (Poisson only;
      :mod:`fedjax_dro.privacy.accounting`).
    loss_bound: for the algorithms that also release a scalar report of each participant (those
      whose declaration names one: afl, agnostic_fedavg, scaff_pd, drfa: its loss; qffl: its
      ``h_k``): each report is clipped to ``[0, loss_bound]`` (required there, refused elsewhere). Hyper-parameter
      ``dp_loss_bound``.
    loss_noise_multiplier: ``z_l``: each reported loss (qffl: the sum of the ``h_k``) gets noise
      of standard deviation ``z_l * loss_bound`` (default: ``noise_multiplier``).
      Hyper-parameter ``dp_loss_noise``. A round then releases two Gaussian mechanisms on the
      same participants, which compose exactly into one of noise multiplier
      ``(z^-2 + z_l^-2)^(-1/2)``: the accountant's. drfa's losses come from a second sample,
      drawn independently of the first (``Releases.separate_loss_sample``): the accountant composes
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
    cluster_count_noise: for the algorithms that release per-group participant counts (whose
      declaration says so: ifca): ``z_c``, the standard deviation of the noise on each cluster's
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
  if alg.privacy is not None:
    raise ValueError(f"{alg.name!r} is already private")
  declared = alg.releases
  if isinstance(declared, Refused):
    raise ValueError(
      f"private: {alg.name!r} cannot be made client-level private: {declared.reason}"
    )
  if not isinstance(declared, Releases):
    raise ValueError(
      f"private: {alg.name!r} declares no releases: build it with build_algorithm(..., "
      "releases=Releases(...)) saying what its participants release each round, and give its "
      "round function a release argument through which everything leaving the clients goes "
      "(fedjax_dro.core.release)"
    )
  weighting = None if alg.settings is None else alg.settings.weighting
  if weighting not in (None, "uniform"):
    raise ValueError(
      f"private: build {alg.name!r} with weighting='uniform': every participant counts once, so "
      f"that the clip bounds each client's share of the sum (got weighting={weighting!r})"
    )
  clip_norm = _positive(clip_norm, "clip_norm")
  noise_multiplier = _positive(noise_multiplier, "noise_multiplier", zero_ok=True)
  delta = check_delta(delta)
  if sampling not in SAMPLING:
    raise ArgumentError("sampling", f" must be one of {SAMPLING}, got {sampling!r}")
  if accountant not in ACCOUNTANTS:
    raise ArgumentError("accountant", f" must be one of {ACCOUNTANTS}, got {accountant!r}")
  if sampling == "poisson":
    if rate is None:
      raise ArgumentError("rate", ": Poisson sampling needs the participation rate q in (0, 1]")
    rate = check_rate(rate)
  elif rate is not None:
    raise ArgumentError("rate", f" is Poisson sampling's; got rate={rate!r} with sampling='fixed'")
  elif accountant == "pld":
    raise ArgumentError(
      "accountant", "='pld' accounts Poisson sampling only; use 'rdp' with 'fixed'"
    )
  losses = declared.losses is not None
  if losses:
    if loss_bound is None:
      raise ArgumentError(
        "loss_bound",
        f": {alg.name!r} releases each participant's {declared.losses}, which is clipped to "
        "[0, loss_bound]; give the bound",
      )
    loss_bound = _positive(loss_bound, "loss_bound")
    loss_noise = noise_multiplier if loss_noise_multiplier is None else loss_noise_multiplier
    loss_noise = _positive(loss_noise, "loss_noise_multiplier", zero_ok=True)
  elif loss_bound is not None or loss_noise_multiplier is not None:
    raise ArgumentError(
      ("loss_bound", "loss_noise_multiplier"),
      f": {alg.name!r} releases no losses (the algorithms that do: {_declaring('losses')})",
    )
  counts = declared.counts
  if counts:
    cluster = noise_multiplier if cluster_count_noise is None else cluster_count_noise
    cluster_count_noise = _positive(cluster, "cluster_count_noise", zero_ok=True)
  elif cluster_count_noise is not None:
    raise ArgumentError(
      "cluster_count_noise",
      f": {alg.name!r} releases no participant counts (the algorithms that do: "
      f"{_declaring('counts')})",
    )
  adaptive = adaptive_quantile is not None
  if adaptive:
    q_ok = is_real(adaptive_quantile)
    if not q_ok or not 0.0 < adaptive_quantile < 1.0:
      raise ArgumentError(
        "adaptive_quantile", f" must be a number in (0, 1), got {adaptive_quantile!r}"
      )
    adaptive_lr = _positive(adaptive_lr, "adaptive_lr")
    count_noise = _positive(count_noise, "count_noise", zero_ok=True)
  settings = Privacy(sampling, rate, delta)

  fixed_count = None if alg.settings is None else alg.settings.clients_per_round

  def with_release(state, data, key, hparams, clip):
    inner = {k: v for k, v in hparams.items() if k not in DP_HPARAMS}
    release = GaussianRelease(
      settings,
      clip,
      hparams["dp_noise"],
      loss_bound=hparams["dp_loss_bound"] if losses else None,
      loss_noise=hparams["dp_loss_noise"] if losses else None,
      count_noise=hparams["dp_cluster_noise"] if counts else None,
    )
    return alg.round(state, data, key, inner, release=release)

  def round_fn(state, data, key, hparams):
    if not adaptive:
      return with_release(state, data, key, hparams, hparams["dp_clip"])
    clip = hparams["dp_clip"] * state.clip_scale
    inner, metrics = with_release(state.inner, data, key, hparams, clip)
    n = data.num_clients
    m = expected_participants(settings, n, fixed_count or n)
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
  spec = PrivateSettings(sampling, rate, delta, accountant, declared, adaptive, fixed_count)
  config = {**alg.config, "privacy": spec.record()}
  if not adaptive:
    return alg._replace(round=round_fn, hparams=hparams, config=config, privacy=spec)
  real = jnp.result_type(float)
  return alg._replace(
    init=lambda params, data, key: AdaptiveClipState(
      alg.init(params, data, key), jnp.ones((), real)
    ),
    round=round_fn,
    client_models=lambda state: alg.client_models(state.inner),
    hparams=hparams,
    config=config,
    privacy=spec,
  )


def _declaring(what: str) -> list:
  """The registered algorithms whose declaration releases ``what`` (``losses`` or ``counts``)."""
  return sorted(
    name
    for name, d in releases_table().items()
    if isinstance(d, Releases) and getattr(d, what) not in (None, False)
  )
