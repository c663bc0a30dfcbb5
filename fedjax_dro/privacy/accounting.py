"""Epsilon of a private run, from Google's ``dp-accounting`` library (not written here).

One round of a private algorithm (:func:`fedjax_dro.privacy.private`) is one release of the
Gaussian mechanism on the clipped sum of its participants' updates: noise standard deviation
``z C`` against a sensitivity of ``C`` when a client is added or removed. Its participants are

* drawn by **Poisson** sampling with rate ``q``: the round is
  ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` (add-or-remove-one neighbours);
* a **fixed-size** sample of ``s`` of the ``n`` clients without replacement: replacing one
  client moves the clipped sum by up to ``2 C``, so the round is
  ``SampledWithoutReplacementDpEvent(n, s, GaussianDpEvent(z / 2))`` with replace-one
  neighbours (the only relation ``dp-accounting`` accounts this sampling under).

``T`` rounds compose to ``SelfComposedDpEvent(round, T)`` (a round releasing two mechanisms on
independently drawn samples, DRFA's updates and losses, is ``ComposedDpEvent`` of their two
events: :func:`composed_epsilon`); epsilon at ``delta`` comes from the
Renyi accountant (``"rdp"``, default: milliseconds a call) or the privacy-loss-distribution
accountant (``"pld"``: tighter, Poisson sampling only, about half a second a call). With Poisson
sampling in fixed shapes a round trains at most ``capacity`` participants
(:mod:`fedjax_dro.core.privacy`); the guarantee of the truncated mechanism is the accountant's
epsilon at ``delta + T p`` with ``p`` the per-round overflow probability, which
:func:`run_epsilon` reports as ``delta_overflow``.

A round that releases several noised sums on the same participants is still one Gaussian
mechanism of multiplier ``z`` when the vectors each participant contributes to them together stay
within ``C`` and every sum gets noise ``z C``: SCAFFOLD with ``local_epochs`` clips its model and
control-variate deltas together; SCAFF-PD clips its gradient at the global model and its later
direction to ``C / sqrt(2)`` each, and Gaussian mechanisms compose adaptively into one whose
sensitivity is the root of the sum of their squared sensitivities. Its losses are a further
Gaussian on the same participants (:func:`combined_noise`).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Dict, Optional

from fedjax_dro.common.checks import ArgumentError, is_real

ACCOUNTANTS = ("rdp", "pld")


def round_event(
  noise_multiplier: float, *, sampling: str, num_clients: int, rate=None, sample_size=None
):
  """The ``dp-accounting`` event of one round (see the module docstring)."""
  import dp_accounting as dpa

  z = float(noise_multiplier)
  if sampling == "poisson":
    return dpa.PoissonSampledDpEvent(float(rate), dpa.GaussianDpEvent(z))
  if sampling == "fixed":
    return dpa.SampledWithoutReplacementDpEvent(
      int(num_clients), int(sample_size), dpa.GaussianDpEvent(z / 2.0)
    )
  raise ValueError(f"sampling must be 'poisson' or 'fixed', got {sampling!r}")


def _accountant(kind: str, sampling: str):
  import dp_accounting as dpa
  from dp_accounting import pld, rdp

  if kind == "rdp":
    relation = (
      dpa.NeighboringRelation.REPLACE_ONE
      if sampling == "fixed"
      else dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    return rdp.RdpAccountant(neighboring_relation=relation)
  if kind == "pld":
    if sampling == "fixed":
      raise ValueError("accountant='pld' accounts Poisson sampling only; use 'rdp' for 'fixed'")
    return pld.PLDAccountant()
  raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {kind!r}")


def epsilon(
  rounds: int,
  noise_multiplier,
  delta: float,
  *,
  sampling: str,
  num_clients: int,
  rate=None,
  sample_size=None,
  accountant: str = "rdp",
) -> float:
  """Epsilon at ``delta`` after ``rounds`` rounds (``inf`` with no noise, 0 after no round).

  ``noise_multiplier``: one multiplier (the round is its :func:`round_event`), or a list or tuple
  of them, each released on its own independently drawn sample (:func:`composed_epsilon`;
  ``inf`` when any is 0)."""
  if rounds <= 0:
    return 0.0
  kw = dict(sampling=sampling, num_clients=num_clients, rate=rate, sample_size=sample_size)
  if isinstance(noise_multiplier, (list, tuple)):
    import dp_accounting as dpa

    zs = [float(z) for z in noise_multiplier]
    if min(zs) <= 0:
      return math.inf
    event = dpa.ComposedDpEvent([round_event(z, **kw) for z in zs])
    return _composed(
      _accountant(accountant, sampling), dpa.SelfComposedDpEvent(event, int(rounds)), 1, delta
    )
  if noise_multiplier <= 0:
    return math.inf
  event = round_event(noise_multiplier, **kw)
  return _composed(_accountant(accountant, sampling), event, int(rounds), delta)


def _composed(acc, event, count: int, delta: float) -> float:
  """Epsilon at ``delta`` of ``event`` composed ``count`` times, from the accountant ``acc``."""
  quiet = logging.getLogger("absl")  # the Renyi orders the library skips are logged as warnings
  level = quiet.level
  quiet.setLevel(logging.ERROR)
  try:
    acc.compose(event, count)
    return float(acc.get_epsilon(float(delta)))
  finally:
    quiet.setLevel(level)


def combined_noise(noise_multiplier: float, loss_noise_multiplier: Optional[float] = None):
  """The noise multiplier of a round's releases together: ``z`` alone, or with a loss release of
  multiplier ``z_l`` on the same participants ``(z^-2 + z_l^-2)^(-1/2)`` (two Gaussian
  mechanisms of sensitivities ``C`` and ``B`` and noise ``z C`` and ``z_l B`` are one Gaussian
  mechanism on the pair; 0 when either is 0)."""
  z = float(noise_multiplier)
  if loss_noise_multiplier is None:
    return z
  zl = float(loss_noise_multiplier)
  if z <= 0 or zl <= 0:
    return 0.0
  return (z**-2 + zl**-2) ** -0.5


def run_epsilon(privacy, rounds: int, hparams: Dict[str, Any], num_clients: int) -> Dict[str, Any]:
  """The privacy record of a private run after ``rounds`` rounds, from the private algorithm's
  :attr:`~fedjax_dro.algorithms.base.Algorithm.privacy` (a
  :class:`~fedjax_dro.privacy.wrapper.PrivateSettings`) and the run's hyper-parameters
  ``dp_noise`` (and ``dp_loss_noise``, ``dp_count_noise``, ``dp_cluster_noise`` where the run
  releases losses, adapts its clip or releases cluster counts):
  ``{"epsilon", "delta", "delta_overflow", "rounds", "noise_multiplier"}``, the last the
  combined multiplier the accountant used (:func:`combined_noise`).

  Where the declaration's ``separate_loss_sample`` (DRFA: its losses come from a second
  participant sample drawn independently of the first) a round is two sampled Gaussian
  mechanisms, the updates' (``noise_multiplier``) and the losses' (``loss_noise_multiplier``,
  also in the record), composed by :func:`composed_epsilon`; ``delta_overflow`` then counts two
  Poisson draws a round."""
  from fedjax_dro.core.privacy import overflow_probability

  sampling = privacy.sampling
  if sampling == "poisson":
    rate, size = privacy.rate, None
    over = rounds * overflow_probability(num_clients, rate)
  else:
    size = privacy.clients_per_round or num_clients
    rate, over = None, 0.0
  releases = privacy.releases
  loss_noise = hparams.get("dp_loss_noise") if releases.losses is not None else None
  separate = bool(releases.separate_loss_sample)  # the losses' own, independent sample
  together = None if loss_noise is None or separate else float(loss_noise)
  z = combined_noise(float(hparams["dp_noise"]), together)
  if releases.counts:  # IFCA's cluster counts: noise std z_c, sensitivity 1
    z = combined_noise(z, float(hparams["dp_cluster_noise"]))
  if privacy.adaptive_clipping:  # the clip count: noise std r m on a sum of sensitivity 1/2
    m = rate * num_clients if sampling == "poisson" else size
    z = combined_noise(z, 2.0 * float(hparams["dp_count_noise"]) * m)
  kw = dict(
    sampling=sampling,
    num_clients=num_clients,
    rate=rate,
    sample_size=size,
    accountant=privacy.accountant,
  )
  if separate:
    eps = composed_epsilon(rounds, (z, float(loss_noise)), privacy.delta, **kw)
    over *= 2  # two Poisson draws a round, each truncated to the capacity
  else:
    eps = epsilon(rounds, z, privacy.delta, **kw)
  record = {
    "epsilon": eps,
    "delta": privacy.delta,
    "delta_overflow": over,
    "rounds": int(rounds),
    "noise_multiplier": z,
  }
  if separate:
    record["loss_noise_multiplier"] = float(loss_noise)
  return record


def privacy_budget(
  target_epsilon: float,
  noise_multiplier: float,
  *,
  delta: float,
  num_clients: int,
  rate: Optional[float] = None,
  clients_per_round: Optional[int] = None,
  accountant: str = "rdp",
  max_rounds: int = 1_000_000,
) -> int:
  """The most rounds a private run can take with epsilon at most ``target_epsilon`` at ``delta``.

  Give ``rate`` for Poisson participation or ``clients_per_round`` for a fixed-size sample of
  the ``num_clients`` clients (the two accountings of the module docstring). Epsilon grows with
  the rounds, so the answer is found by bisection over ``1 .. max_rounds``; 0 when even one
  round exceeds the target, ``max_rounds`` when that many stay within it.

  Raises:
    ValueError: for a target or noise that is not a positive number, ``delta`` outside (0, 1),
      both or neither of ``rate`` and ``clients_per_round``, or a count out of range.
  """
  from fedjax_dro.common.checks import integer

  for name, v in (("target_epsilon", target_epsilon), ("noise_multiplier", noise_multiplier)):
    if not is_real(v) or not 0 < v < math.inf:
      raise ValueError(f"{name} must be a positive finite number, got {v!r}")
  check_delta(delta)
  num_clients = integer(num_clients, "num_clients")
  max_rounds = integer(max_rounds, "max_rounds")
  if (rate is None) == (clients_per_round is None):
    raise ValueError(
      "give exactly one of rate (Poisson participation) and clients_per_round "
      f"(a fixed-size sample), got rate={rate!r}, clients_per_round="
      f"{clients_per_round!r}"
    )
  if rate is not None:
    from fedjax_dro.core.privacy import check_rate

    kw = dict(sampling="poisson", rate=check_rate(rate))
  else:
    size = integer(clients_per_round, "clients_per_round", maximum=num_clients)
    kw = dict(sampling="fixed", sample_size=size)
  eps = lambda t: epsilon(
    t, noise_multiplier, delta, num_clients=num_clients, accountant=accountant, **kw
  )
  if eps(1) > target_epsilon:
    return 0
  lo, hi = 1, max_rounds
  if eps(hi) <= target_epsilon:
    return hi
  while hi - lo > 1:  # eps(lo) <= target < eps(hi)
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if eps(mid) <= target_epsilon else (lo, mid)
  return lo


def check_delta(delta) -> float:
  """A delta in (0, 1)."""
  if not is_real(delta) or not 0.0 < delta < 1.0:
    raise ArgumentError("delta", f" must be a number in (0, 1), got {delta!r}")
  return float(delta)


def composed_epsilon(rounds: int, noise_multipliers, delta: float, **options) -> float:
  """Epsilon at ``delta`` after ``rounds`` rounds of which each releases one Gaussian mechanism
  per multiplier of ``noise_multipliers``, each on its own independently drawn sample of the
  clients (the same sampling, rate and size; ``options``: those of :func:`epsilon`): the round is
  ``ComposedDpEvent`` of their :func:`round_event`, self-composed ``rounds`` times (``inf`` when
  any multiplier is 0; 0 after no round)."""
  return epsilon(rounds, list(noise_multipliers), delta, **options)
