"""What a round releases, and how: the release mechanism, an argument of every round function.

A round function is ``round(state, data, key, hparams, release=PLAIN)``. Wherever something
leaves the clients (the participant draw, the updates the server sums, the losses or counts it
reads) the round asks ``release``: :data:`PLAIN` releases what the round computes (the identity:
the plain algorithm, exactly), :class:`~fedjax_dro.core.privacy.GaussianRelease` is client-level
differential privacy (DP-FedAvg: McMahan, Ramage, Talwar, Zhang, "Learning Differentially
Private Recurrent Language Models", ICLR 2018, arXiv:1710.06963: Poisson or fixed-size
participation, each participant's update clipped to L2 norm ``C``, Gaussian noise of standard
deviation ``z C`` on the sum, a fixed denominator). :func:`fedjax_dro.privacy.private` builds the Gaussian release from the private
algorithm's hyper-parameters each round and passes it in, the way optax's
``differentially_private_aggregate`` is one more transformation; nothing about privacy is read
from module state, and a round's privacy metrics (``dp_participants``, ``dp_dropped``,
``dp_unclipped``) come back in the values the mechanism returns.

The two mechanisms have the same methods. Each is a generic release (a weighted sum of
per-participant vectors, the participants' losses, per-group sums, a model average ...); where
the plain algorithm computes a release in a form of its own (an average of the models rather than
the start plus the mean change) :data:`PLAIN` computes exactly that form, so a plain run is the
algorithm as its paper writes it, to the bit. Where a private message must take another form
than the plain algorithm's (SCAFFOLD with ``local_epochs`` releases ``-delta_i / (K_i lr)``, a
fixed multiple of its delta, rather than its control variate's change) the round asks
``release.per_participant``: whether each participant's release is processed on its own.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_dro.core.aggregation import weighted_mean, weighted_sum
from fedjax_dro.core.sampling import sample_clients


class Draw(NamedTuple):
  """A round's participants.

  Attributes:
    idx: ``[s]`` client indices (``n`` in the empty slots of a Poisson draw: scatters drop it).
    rows: ``idx`` clamped into range (for gathers).
    present: ``[s]`` bool, which slots hold a participant; None: all.
    metrics: the draw's privacy metrics (``dp_participants``, ``dp_dropped``; none when plain).
  """

  idx: Any
  rows: Any
  present: Any
  metrics: dict


def loss_metrics(losses, present) -> dict:
  """``train_loss`` and ``train_loss_max``: the unweighted mean and the max of the ``[s]``
  participants' losses (over the filled slots ``present``, 0 when none is; None: all)."""
  if present is None:
    return {"train_loss": jnp.mean(losses), "train_loss_max": jnp.max(losses)}
  w = present.astype(losses.dtype)
  count = jnp.sum(w)
  top = jnp.max(jnp.where(present, losses, -jnp.inf))
  return {
    "train_loss": jnp.sum(w * losses) / jnp.maximum(count, 1),
    "train_loss_max": jnp.where(count > 0, top, 0),
  }


# ----------------------------------------------------------------------------------------------
# The aggregation of one local round (core.local.local_round, stateful_local_round)
# ----------------------------------------------------------------------------------------------
class PlainAggregation(NamedTuple):
  """How a plain local round aggregates: the participants' own ``weights``, normalized by their
  sum; nothing clipped or noised."""

  weights: Any  # [s] the aggregation weights (sample counts or ones)

  def send(self, delta, aux):
    """What a participant sends: its update and its other outputs, as they are."""
    return delta, aux

  def received(self, outputs, weights):
    """``(the participants' other outputs, metrics)``."""
    del weights
    return outputs, {}

  def normalized(self, weights):
    """The weights of the mean, ``weights / sum(weights)``."""
    return weights / jnp.sum(weights)

  def noised(self, mean, round_key):
    del round_key
    return mean


# ----------------------------------------------------------------------------------------------
# The plain release
# ----------------------------------------------------------------------------------------------
class PlainRelease:
  """The identity release: a round releases what it computes (the plain algorithm)."""

  private = False
  # whether each participant's release is processed on its own (clipped): a round may then not
  # fold several participants' updates into one before they leave the clients
  per_participant = False

  def draw(self, key, num_clients: int, s: int, sampling_weights=None) -> Draw:
    """``s`` clients without replacement (by ``sampling_weights`` if given, else uniformly)."""
    idx = sample_clients(key, num_clients, s, sampling_weights)
    return Draw(idx, idx, None, {})

  def uniform_draw(self, key, num_clients: int, s: int, metric: str = "dp") -> Draw:
    """``s`` clients uniformly without replacement (an algorithm's own second sample)."""
    del metric
    return self.draw(key, num_clients, s)

  def importance_draw(self, key, num_clients: int, s: int, lam):
    """``(draw, weights)``: ``s`` clients drawn with replacement with probabilities ``lam``, each
    weighted ``1 / s`` (DRFA's sample: the weighted mean is unbiased for the ``lam``-weighted
    sum over all clients)."""
    idx = sample_clients(key, num_clients, s, lam, replace=True)
    return Draw(idx, idx, None, {}), jnp.full((s,), 1.0 / s, lam.dtype)

  def aggregation(self, weights, present, s: int, num_clients: int) -> PlainAggregation:
    """How a local round aggregates: with the participants' own ``weights``."""
    del present, s, num_clients
    return PlainAggregation(weights)

  def present(self, weights):
    """Which slots hold a participant: None (all do)."""
    del weights
    return None

  def inverse_rate(self, num_clients: int, s: int):
    """``n / s``: the factor that makes a sum over the participants unbiased for all clients."""
    return num_clients / s

  def participation_share(self, default):
    """The participants' expected share of the clients: the algorithm's own ``default``."""
    return default

  def sum(self, deltas, weights, present, bound, round_key):
    """``sum_i weights_i deltas_i`` over the ``[s, ...]`` stacked ``deltas`` (slots with
    ``present`` False left out)."""
    del bound, round_key
    if present is not None:
      weights = weights * present.astype(weights.dtype)
    return weighted_sum(deltas, weights)

  def total(self, total, bound, round_key, stream: int = 3):
    """A weighted sum accumulated chunk by chunk, as it is."""
    del bound, round_key, stream
    return total

  def losses(self, losses, round_key):
    """The participants' reported losses, as they are."""
    del round_key
    return losses

  def clip_part(self, tree, parts: int):
    """``(tree, True)``: nothing is clipped."""
    del parts
    return tree, jnp.bool_(True)

  def clip_each(self, stacked, present):
    """``(stacked, {})``: nothing is clipped."""
    del present
    return stacked, {}

  def scaled_sum(self, deltas, coefficients, present, round_key):
    """``sum_i coefficients_i deltas_i`` (q-FFL's ``sum F_k^q Delta_k``): ``(sum, {})``."""
    del present, round_key
    return weighted_sum(deltas, coefficients), {}

  def ratio_denominator(self, values, present, round_key):
    """``sum_i values_i`` (q-FFL's ``sum h_k``)."""
    del round_key
    if present is not None:
      values = jnp.where(present, values, 0)
    return jnp.sum(values)

  def model_average(self, models, base, weights, present, bound, round_key):
    """``(sum_i weights_i models_i, {})`` over the ``[s, ...]`` stacked ``models`` (a tuple of
    model trees released together: DRFA's final and snapshot models)."""
    del base, present, bound, round_key
    return tuple(weighted_sum(m, weights) for m in models), {}

  def group_means(self, models, old, groups, weights, present, round_key):
    """IFCA's clusters: ``(new group models, {})``. Group ``j`` becomes the ``weights``-weighted
    mean of the stacked ``models`` of its members (``groups`` ``[s, k]`` one-hot), and keeps its
    ``old`` model where it has none."""
    del present, round_key
    k = groups.shape[1]
    weighted = groups * weights[:, None]
    totals = jnp.sum(weighted, axis=0)  # [k]
    picked = totals > 0
    normalised = weighted / jnp.where(picked, totals, 1.0)  # columns sum to 1 (or are all zero)
    averages = jax.vmap(lambda w: weighted_sum(models, w))(normalised.T)
    return jax.tree.map(
      lambda avg, o: jnp.where(picked.reshape((k,) + (1,) * (o.ndim - 1)), avg, o).astype(o.dtype),
      averages,
      old,
    ), {}

  def weighted_average(self, deltas, weights, present, bound, num_clients: int, round_key):
    """The weighted mean of the ``[s, ...]`` stacked ``deltas``, ``weights`` the participants'
    shares of a distribution over all clients (AgnosticFedAvg's ``lambda``), normalized by their
    sum."""
    del present, bound, num_clients, round_key
    return weighted_mean(deltas, weights)

  def model_mean(self, models, base, weights, present, num_clients: int, round_key):
    """``(weighted mean of the [s, ...] stacked models, {})`` (slots with ``present`` False
    left out): the server's average of the participants' models (pFedMe's ``w_{i,R}``)."""
    del base, num_clients, round_key
    return weighted_mean(models, weights, present), {}

  def unclipped(self):
    """The release whose local rounds return their updates unclipped: this one."""
    return self

  @property
  def plain(self):
    """The release of the work a protocol keeps on its clients: this one."""
    return self

  def stateful(
    self, s: int, num_clients: int, start, averaged, released, present, means=(), log_means=()
  ):
    """How a stateful local round aggregates (:func:`fedjax_dro.core.local.
    stateful_local_round`): the ``averaged`` carries' uniform mean over the participants, the
    ``means`` and ``log_means`` carries' means over their stacked values; the others
    (``released`` included) stay stacked."""
    del num_clients, start, released, present
    return PlainStatefulAggregation(tuple(averaged), s, tuple(means), tuple(log_means))


class PlainStatefulAggregation(NamedTuple):
  """A plain stateful round's aggregation: the ``averaged`` carries' uniform mean; the
  ``means`` carries' mean over the stacked values, the ``log_means`` carries' in the log
  domain; the other carries stacked."""

  averaged: tuple
  s: int
  means: tuple = ()
  log_means: tuple = ()  # (carry name, ratio name, reference) each

  @property
  def stacked(self) -> bool:
    """Whether the participants' carries come back stacked (nothing averaged by a weighted
    sum)."""
    return not self.averaged

  @property
  def weights(self):
    return jnp.full((self.s,), 1.0 / self.s)

  @property
  def present(self):
    """Which slots hold a participant: None (all do)."""
    return None

  def client(self, carry, row, loss):
    """``(averaged carries, (kept carries, loss))`` of one participant."""
    del row
    kept = {name: value for name, value in carry.items() if name not in self.averaged}
    return {name: carry[name] for name in self.averaged}, (kept, loss)

  def finish(self, carries):
    """The stacked ``means`` and ``log_means`` carries reduced over the participants."""
    carries = dict(carries)
    for name in self.means:
      carries[name] = jax.tree.map(lambda a: jnp.mean(a, axis=0), carries[name])
    for name, _, _ in self.log_means:
      carries[name] = log_mean(carries[name])
    return carries

  def received(self, mean, outputs, reference, round_key):
    """``(carries, losses, metrics)`` from the clients' weighted sum and stacked outputs."""
    del reference, round_key
    kept, losses = outputs
    return self.finish({**kept, **mean}), losses, {}


def log_mean(log_values):
  """``log mean exp(log_values)`` over the participants (the leading axis)."""
  return jax.nn.logsumexp(log_values) - jnp.log(log_values.shape[0])


# a private round's released mean of the ratios of a log_means carry is raised to at least this
# (noise can take it below 0)
LOG_MEAN_FLOOR = 1e-6


PLAIN = PlainRelease()


# ----------------------------------------------------------------------------------------------
# What an algorithm declares about its releases
# ----------------------------------------------------------------------------------------------
class Releases(NamedTuple):
  """What an algorithm's participants release each round, declared on the algorithm
  (``build_algorithm(..., releases=Releases(...))``): :func:`fedjax_dro.privacy.private` reads
  it to make the algorithm private, and passes :class:`~fedjax_dro.core.privacy.GaussianRelease` to its round function,
  which must take ``release`` and send everything that leaves the clients through it.

  Attributes:
    description: what is released and how it is privatized (shown in the private algorithm's
      settings record and the docs' table).
    losses: what scalar report each participant also releases (its loss, q-FFL's ``h_k``),
      clipped to ``[0, loss_bound]`` and noised; None: none (``loss_bound`` is then refused).
    counts: whether per-group participant counts are released (IFCA's clusters), noised with
      ``cluster_count_noise``.
    separate_loss_sample: whether the scalar reports come from a second participant sample drawn
      independently of the first (DRFA's): the accountant composes two sampled mechanisms.
    mechanism: the mechanism's name in the settings record.
  """

  description: str
  losses: Optional[str] = None
  counts: bool = False
  separate_loss_sample: bool = False
  mechanism: str = "DP-FedAvg (clipped updates, Gaussian noise on the sum, fixed denominator)"


class Refused(NamedTuple):
  """An algorithm that cannot be made client-level private, and why (declared on it)."""

  reason: str
