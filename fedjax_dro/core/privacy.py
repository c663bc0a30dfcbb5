"""Client-level differential privacy inside a round: participation, clipping, noise.

The mechanism is DP-FedAvg's (McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private
Recurrent Language Models", ICLR 2018, arXiv:1710.06963): each participant's model update is
clipped to L2 norm ``C``, the clipped updates are summed, Gaussian noise of standard deviation
``z C`` is added to the sum once, on the server, and the sum is divided by the *expected* number of
participants (the fixed denominator: one client's share of the average is at most ``C / m``
whatever the others send). Participants are drawn either by Poisson sampling (each client
independently with probability ``q``, the sampled Gaussian mechanism's assumption) or as a
fixed-size uniform sample without replacement, each with its own accounting
(:mod:`fedjax_dro.privacy.accounting`).

:class:`GaussianRelease` is the mechanism a private round is given (the argument ``release`` of
every round function; :mod:`fedjax_dro.core.release`), built each round by
:func:`fedjax_dro.privacy.private` from the hyper-parameters ``dp_clip`` and ``dp_noise`` (traced
values: a sweep over them is one program); this module also holds its arithmetic (the Poisson
draw in fixed shapes, clipping, noise, the noise streams).

Poisson participation in fixed shapes: the round draws a Bernoulli(``q``) mask over the ``n``
clients and trains the first ``capacity`` of the drawn clients in slots of one fixed size (slots
left empty carry weight 0 and change nothing). ``capacity`` is one above the ``1 -
OVERFLOW_PROBABILITY`` quantile of a Binomial(``n``, ``q``) (:func:`poisson_capacity`); a round that
draws more keeps the first ``capacity`` (counted in the round's ``dp_dropped`` metric). The
guarantee then holds with ``delta`` increased by at most ``rounds * overflow_probability``, which
:func:`fedjax_dro.privacy.accounting.run_epsilon` reports as ``delta_overflow``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_dro.common.checks import ArgumentError, is_real
from fedjax_dro.core.aggregation import tree_add, weighted_sum
from fedjax_dro.core.release import LOG_MEAN_FLOOR, PLAIN, Draw, PlainStatefulAggregation
from fedjax_dro.core.sampling import sample_clients

OVERFLOW_PROBABILITY = 1e-12  # per round, the chance that Poisson draws more than the capacity
NOISE_STREAM = 0x0D5  # fold_in tag of the round key's noise stream (apart from sampling, local)
SAMPLING = ("poisson", "fixed")


class Privacy(NamedTuple):
  """The static settings of a private algorithm (the clip norm and the noise multiplier are its
  hyper-parameters ``dp_clip`` and ``dp_noise``).

  Attributes:
    sampling: ``"poisson"`` (each client with probability ``rate``) or ``"fixed"`` (the
      algorithm's ``clients_per_round``, uniformly without replacement).
    rate: the Poisson rate ``q`` (None with fixed sampling).
    delta: the delta at which epsilon is reported.
  """

  sampling: str
  rate: Optional[float]
  delta: float


def poisson_capacity(num_clients: int, rate: float) -> int:
  """Slots that hold a Poisson draw of ``num_clients`` clients at ``rate`` but with probability
  at most :data:`OVERFLOW_PROBABILITY`: one above the binomial's ``1 - OVERFLOW_PROBABILITY``
  quantile (all clients when that is fewer)."""
  from scipy.stats import binom

  if rate >= 1.0:
    return num_clients
  c = int(binom.isf(OVERFLOW_PROBABILITY, num_clients, rate)) + 1
  return max(1, min(num_clients, c))


def overflow_probability(num_clients: int, rate: float) -> float:
  """The chance that one round's Poisson draw exceeds :func:`poisson_capacity`."""
  from scipy.stats import binom

  return float(binom.sf(poisson_capacity(num_clients, rate), num_clients, rate))


def expected_participants(privacy: Privacy, num_clients: int, fixed_count: int) -> float:
  """The fixed denominator: ``q n`` (Poisson) or the sample size (fixed)."""
  if privacy.sampling == "poisson":
    return privacy.rate * num_clients
  return float(fixed_count)


def poisson_participants(key, num_clients: int, rate: float):
  """``(idx, valid)``: ``[capacity]`` slots holding, in client order, the clients of a Poisson
  draw (``idx`` = ``num_clients`` in empty slots: gathers clamp it, scatters drop it) and whether
  each slot is filled; and the ``[]`` count of drawn clients that did not fit."""
  capacity = poisson_capacity(num_clients, rate)
  drawn = jax.random.bernoulli(key, rate, (num_clients,))
  (idx,) = jnp.nonzero(drawn, size=capacity, fill_value=num_clients)
  valid = idx < num_clients
  dropped = jnp.sum(drawn) - jnp.sum(valid)
  return idx.astype(jnp.int32), valid, dropped


def global_norm(tree):
  """The L2 norm of a pytree's leaves taken together (in float32 or wider)."""
  leaves = jax.tree.leaves(tree)
  wide = lambda x: x.astype(jnp.promote_types(x.dtype, jnp.float32))
  return jnp.sqrt(sum(jnp.sum(jnp.square(wide(x))) for x in leaves))


def clip_tree(tree, clip_norm):
  """``(tree * min(1, clip_norm / ||tree||), ||tree||)``: the tree scaled into the L2 ball of
  radius ``clip_norm`` (unchanged inside it)."""
  norm = global_norm(tree)
  scale = jnp.minimum(1.0, clip_norm / jnp.maximum(norm, 1e-30))
  return jax.tree.map(lambda x: (x * scale).astype(x.dtype), tree), norm


def add_noise(tree, key, std):
  """``tree`` plus independent Gaussian noise of standard deviation ``std`` on every entry."""
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(key, len(leaves))
  noisy = [
    (x + std * jax.random.normal(k, x.shape, jnp.promote_types(x.dtype, jnp.float32))).astype(
      x.dtype
    )
    for x, k in zip(leaves, keys)
  ]
  return jax.tree.unflatten(treedef, noisy)


def noise_key(round_key):
  """The round's noise stream, apart from its sampling and local-training streams."""
  return jax.random.fold_in(round_key, NOISE_STREAM)


def count_key(round_key):
  """The noise stream of adaptive clipping's count (apart from the updates' and the losses')."""
  return jax.random.fold_in(noise_key(round_key), 2)


def check_rate(rate, name: str = "rate") -> float:
  """A Poisson rate in (0, 1]."""
  if not is_real(rate) or not 0.0 < rate <= 1.0:
    raise ArgumentError(name, f" must be a number in (0, 1], got {rate!r}")
  if not math.isfinite(rate):
    raise ArgumentError(name, f" must be finite, got {rate!r}")
  return float(rate)


# ----------------------------------------------------------------------------------------------
# The aggregation of a private local round
# ----------------------------------------------------------------------------------------------
class PrivateAggregation(NamedTuple):
  """How a private local round aggregates (DP-FedAvg): every participant counts once (weight 1,
  0 for an empty slot), its update clipped to ``clip_norm``, the sum over the expected number of
  participants, noised once on the server."""

  clip_norm: Any  # [] float
  noise_multiplier: Any  # [] float
  expected: Any  # [] float: the fixed denominator
  weights: Any  # [s] float: 1 for a participant, 0 for an empty slot

  def clip(self, tree):
    """A participant's update clipped to L2 norm ``clip_norm``."""
    return clip_tree(tree, self.clip_norm)[0]

  def send(self, delta, aux):
    """What a participant sends: its update clipped, and with its other outputs ``aux`` the flag
    of an update within the clip (norm <= C: adaptive clipping's report)."""
    clipped, norm = clip_tree(delta, self.clip_norm)
    return clipped, (aux, norm <= self.clip_norm)

  def received(self, outputs, weights):
    """``(the participants' other outputs, metrics)``: their flags counted over the filled slots
    (``weights`` 1 or 0, in the order the outputs ran) into ``dp_unclipped``."""
    aux, within = outputs
    count = jnp.sum(jnp.where(weights > 0, within, False)).astype(jnp.float32)
    return aux, {"dp_unclipped": count}

  def normalized(self, weights):
    """The weights of the mean: ``weights`` over the expected count."""
    return weights / self.expected

  def noised(self, mean, round_key):
    """The sum of the clipped updates over the expected count (``mean``) plus the noise on the
    sum, ``N(0, (z C)^2)`` per entry, over the same count."""
    std = self.noise_multiplier * self.clip_norm / self.expected
    return add_noise(mean, noise_key(round_key), std)


# ----------------------------------------------------------------------------------------------
# Client-level differential privacy
# ----------------------------------------------------------------------------------------------
class GaussianRelease(NamedTuple):
  """Client-level differential privacy (DP-FedAvg; module docstring) for one round.

  Poisson participation in fixed shapes: the round draws a Bernoulli(``q``) mask over the ``n``
  clients and trains the first ``capacity`` of the drawn clients in slots of one fixed size
  (:func:`~fedjax_dro.core.privacy.poisson_capacity`; a round that draws more keeps the first
  ``capacity``, counted in ``dp_dropped``). With fixed-size sampling the participants are the
  algorithm's own uniform draw.

  Attributes:
    privacy: the static settings (sampling, rate, delta).
    clip_norm: ``C``, the L2 bound of what a participant releases (traced).
    noise_multiplier: ``z``: noise of standard deviation ``z C`` on each released sum (traced).
    loss_bound: ``B``: reported losses (and other scalar reports) clipped to ``[0, B]``.
    loss_noise: ``z_l``: noise of standard deviation ``z_l B`` on each reported loss.
    count_noise: ``z_c``: noise of standard deviation ``z_c`` on each released count (IFCA).
  """

  privacy: Privacy
  clip_norm: Any
  noise_multiplier: Any
  loss_bound: Any = None
  loss_noise: Any = None
  count_noise: Any = None

  private = True
  per_participant = True  # each participant's release is clipped on its own

  def draw(self, key, num_clients: int, s: int, sampling_weights=None) -> Draw:
    """Poisson participants (capacity slots, the empty ones not present), or the fixed-size
    uniform draw of ``s`` clients; with the draw's ``dp_participants`` and ``dp_dropped``."""
    if self.privacy.sampling != "poisson":
      idx = sample_clients(key, num_clients, s, sampling_weights)
      return Draw(idx, idx, None, {"dp_participants": jnp.float32(s), "dp_dropped": jnp.float32(0)})
    if sampling_weights is not None:
      raise ValueError("a private round draws its participants uniformly (no sampling weights)")
    idx, present, dropped = poisson_participants(key, num_clients, self.privacy.rate)
    metrics = {
      "dp_participants": jnp.sum(present).astype(jnp.float32),
      "dp_dropped": dropped.astype(jnp.float32),
    }
    return Draw(idx, jnp.minimum(idx, num_clients - 1), present, metrics)

  def uniform_draw(self, key, num_clients: int, s: int, metric: str = "dp") -> Draw:
    """A uniform draw an algorithm makes itself (possibly twice a round, as DRFA's second
    sample): Poisson at ``q``, or ``s`` clients without replacement (every slot present); its
    size and overflow recorded as ``{metric}_participants`` and ``{metric}_dropped``."""
    if self.privacy.sampling == "poisson":
      idx, present, dropped = poisson_participants(key, num_clients, self.privacy.rate)
    else:
      idx = sample_clients(key, num_clients, s).astype(jnp.int32)
      present, dropped = jnp.ones(idx.shape, bool), jnp.zeros((), jnp.int32)
    metrics = {
      f"{metric}_participants": jnp.sum(present).astype(jnp.float32),
      f"{metric}_dropped": dropped.astype(jnp.float32),
    }
    return Draw(idx, jnp.minimum(idx, num_clients - 1), present, metrics)

  def importance_draw(self, key, num_clients: int, s: int, lam):
    """``(draw, weights)``: a uniform draw (Poisson at ``q``, or ``s`` of ``n``) whose
    participants are weighted ``lam_i / q`` (``q = s / n`` with fixed sampling): unbiased for
    the ``lam``-weighted sum, and a sample that does not depend on anyone's data."""
    draw = self.uniform_draw(key, num_clients, s)
    return draw, self.inverse_rate(num_clients, s) * lam[draw.rows]

  def aggregation(self, weights, present, s: int, num_clients: int) -> PrivateAggregation:
    """How a local round of ``s`` slots aggregates: each participant once (weight 1), the sum
    over the expected participants (the participants' own ``weights`` are not used)."""
    del weights
    real = jnp.result_type(float)  # float64 where JAX runs in 64 bits: exact weights 1 / m
    w = jnp.ones((s,), real) if present is None else present.astype(real)
    expected = jnp.asarray(expected_participants(self.privacy, num_clients, s), real)
    return PrivateAggregation(self.clip_norm, self.noise_multiplier, expected, w)

  def present(self, weights):
    """Which slots of a local round hold a participant: where its weights are positive."""
    return weights > 0

  def inverse_rate(self, num_clients: int, s: int):
    """``1 / q`` with Poisson participation, else ``n / s``."""
    if self.privacy.sampling == "poisson":
      return 1.0 / self.privacy.rate
    return num_clients / s

  def participation_share(self, default):
    """``q`` with Poisson participation, else ``default`` (the algorithm's ``s / n``)."""
    if self.privacy.sampling == "poisson":
      return self.privacy.rate
    return default

  def sum(self, deltas, weights, present, bound, round_key):
    """``sum_i weights_i deltas_i`` over the clipped ``[s, ...]`` ``deltas`` (slots with
    ``present`` False left out), plus Gaussian noise of standard deviation ``z C bound``,
    ``bound`` the largest weight any client could have (server state, public): adding or
    removing one client moves the sum by at most ``C bound``."""
    if present is not None:
      weights = weights * present.astype(weights.dtype)
    total = weighted_sum(deltas, weights)
    std = self.noise_multiplier * self.clip_norm * bound
    return add_noise(total, noise_key(round_key), std)

  def total(self, total, bound, round_key, stream: int = 3):
    """:meth:`sum` for a weighted sum already accumulated (never stacked): ``total`` plus noise
    ``z C bound`` from the round's noise stream ``stream`` (3 onward: apart from :meth:`sum`'s,
    the losses' (1) and adaptive clipping's count (2))."""
    std = self.noise_multiplier * self.clip_norm * bound
    return add_noise(total, jax.random.fold_in(noise_key(round_key), stream), std)

  def losses(self, losses, round_key):
    """The participants' ``[s]`` reported losses clipped to ``[0, B]`` and each noised with
    standard deviation ``z_l B`` (a client's loss is its own coordinate)."""
    if self.loss_bound is None:
      raise ValueError("this private round releases losses but has no loss bound")
    clipped = jnp.clip(losses, 0.0, self.loss_bound)
    std = self.loss_noise * self.loss_bound
    return add_noise(clipped, jax.random.fold_in(noise_key(round_key), 1), std)

  def clip_part(self, tree, parts: int):
    """``(tree clipped to C / sqrt(parts), whether it was within)``: one of the ``parts``
    model-sized vectors a participant releases in a round at different times (a later one
    depends on what the server made of an earlier one, so they cannot be clipped together);
    together they stay within ``C``, so their noised sums (each with noise ``z C`` times its
    weight bound) are one Gaussian mechanism of multiplier ``z``."""
    bound = self.clip_norm / math.sqrt(parts)
    clipped, norm = clip_tree(tree, bound)
    return clipped, norm <= bound

  def clip_each(self, stacked, present):
    """``(clipped, metrics)``: each of the ``[s, ...]`` stacked per-participant pytrees (all its
    leaves together: one message) clipped to ``C``; ``dp_unclipped`` counts the filled slots
    (``present``; None: all) whose whole row was within ``C``. Rows already clipped in part are
    clipped again as a whole: when the rest of a row is a fixed multiple of the clipped part, as
    SCAFFOLD's ``-delta_i / (K_i lr)``, the two clips are one clip of the whole row."""
    clipped, norms = jax.vmap(lambda t: clip_tree(t, self.clip_norm))(stacked)
    within = norms <= self.clip_norm
    if present is not None:
      within = jnp.logical_and(within, present)
    return clipped, {"dp_unclipped": jnp.sum(within).astype(jnp.float32)}

  def scaled_sum(self, deltas, coefficients, present, round_key):
    """``(sum, metrics)``: each participant releases ``coefficients_i deltas_i`` (q-FFL's
    ``F_k^q Delta_k``) clipped to ``C``; the sum is noised with ``z C``."""
    scaled = jax.tree.map(
      lambda d: d * coefficients.reshape((-1,) + (1,) * (d.ndim - 1)).astype(d.dtype), deltas
    )
    clipped, metrics = self.clip_each(scaled, present)
    return self.sum(clipped, jnp.ones_like(coefficients), present, 1.0, round_key), metrics

  def ratio_denominator(self, values, present, round_key):
    """The denominator of a ratio of two noised sums (q-FFL's step): ``sum_i values_i`` with
    each value clipped to ``[0, B]`` and noise ``z_l B`` on the sum, floored at the noise's
    standard deviation (so that noise cannot make it small or negative)."""
    if present is not None:
      values = jnp.where(present, values, 0)
    if self.loss_bound is None:
      raise ValueError("this private round releases a bounded sum but has no loss bound")
    total = jnp.sum(jnp.clip(values, 0.0, self.loss_bound))
    std = self.loss_noise * self.loss_bound
    total = add_noise(total, jax.random.fold_in(noise_key(round_key), 3), std)
    tiny = jnp.finfo(jnp.result_type(total)).tiny
    return jnp.maximum(total, jnp.maximum(std, tiny))

  def model_average(self, models, base, weights, present, bound, round_key):
    """``(averages, metrics)``: each participant's models' changes from ``base`` (a tuple of
    model trees released together, DRFA's final and snapshot models) clipped together to ``C``,
    their ``weights``-weighted sums noised for the largest weight ``bound``, added to ``base``."""
    deltas = tuple(jax.tree.map(lambda a, b: a - b, m, base) for m in models)
    clipped, metrics = self.clip_each(deltas, present)
    moved = self.sum(clipped, weights, present, bound, round_key)
    return tuple(jax.tree.map(jnp.add, base, m) for m in moved), metrics

  def group_sums(self, deltas, groups, present, round_key):
    """``(sums, counts)``: per group (``groups`` ``[s, k]`` one-hot) the sum of its members'
    clipped ``deltas`` with noise ``z C`` on each (a client adds to one group only, so the
    ``k`` sums together move by at most ``C``), and its member count with noise ``z_c`` (its
    own stream: one client moves the count vector by 1); empty slots (``present`` False) left
    out."""
    if present is not None:
      groups = groups * present[:, None].astype(groups.dtype)
    sums = jax.vmap(lambda w: weighted_sum(deltas, w))(groups.T)
    counts = jnp.sum(groups, axis=0)
    key = noise_key(round_key)
    sums = add_noise(sums, key, self.noise_multiplier * self.clip_norm)
    counts = add_noise(counts, jax.random.fold_in(key, 16), self.count_noise)
    return sums, counts

  def group_means(self, deltas, old, groups, weights, present, round_key):
    """IFCA's clusters from the participants' clipped changes ``deltas`` (``[s, ...]``, from
    their group's model; :meth:`group_sums`): group ``j`` moves by its noised sum over
    ``max(noised count, 1)`` where the noised count is at least 1/2. ``(groups, {})``."""
    del weights
    k = groups.shape[1]
    sums, counts = self.group_sums(deltas, groups, present, round_key)
    picked = counts >= 0.5  # with no noise: somebody picked it (counts are whole numbers)
    steps = jax.vmap(lambda t, c: jax.tree.map(lambda a: a / jnp.maximum(c, 1.0), t))(sums, counts)
    return jax.tree.map(
      lambda o, d: jnp.where(picked.reshape((k,) + (1,) * (o.ndim - 1)), o + d.astype(o.dtype), o),
      old,
      steps,
    ), {}

  def unclipped(self):
    """The release whose local rounds return their participants' updates unclipped (q-FFL's
    participants release ``F_k^q Delta_k``, clipped with :meth:`scaled_sum`): this one with an
    infinite clip norm. Only local rounds that return their stacked updates may use it."""
    return self._replace(clip_norm=math.inf)

  @property
  def plain(self):
    """The release of the work a protocol keeps on its clients (pFedMe's personal updates of
    the clients not drawn): :data:`PLAIN`."""
    return PLAIN

  def mean(self, deltas, present, num_clients: int, round_key):
    """``(mean, metrics)``: the DP-FedAvg release of ``[s, ...]`` stacked updates already
    computed (pFedMe's drawn clients): each clipped, summed over the slots ``present``, divided
    by the expected participants, noised with ``z C`` on the sum; ``dp_unclipped`` counted."""
    s = jax.tree.leaves(deltas)[0].shape[0]
    agg = self.aggregation(None, present, s, num_clients)
    clipped, norms = jax.vmap(lambda d: clip_tree(d, agg.clip_norm))(deltas)
    _, metrics = agg.received((None, norms <= agg.clip_norm), agg.weights)
    return agg.noised(weighted_sum(clipped, agg.weights / agg.expected), round_key), metrics

  def weighted_average(self, deltas, weights, present, bound, num_clients: int, round_key):
    """The weighted mean of the clipped ``deltas`` (``weights`` the participants' shares of a
    distribution over all clients, the largest of which any client has is ``bound``) with a
    fixed denominator: the weights' expected sum over the participants, ``q`` (``s / n`` with
    fixed sampling), so one client moves the mean by at most ``C bound / q``, and the noise is
    ``z C bound / q``."""
    s = jax.tree.leaves(deltas)[0].shape[0]
    rate = self.inverse_rate(num_clients, s)
    return self.sum(deltas, weights * rate, present, bound * rate, round_key)

  def model_mean(self, models, base, weights, present, num_clients: int, round_key):
    """``(base + the DP-FedAvg release of the models' changes from base, metrics)``: each
    participant's ``models_i - base`` clipped, their sum over the filled slots divided by the
    expected participants and noised (:meth:`mean`; the ``weights`` are not used: each
    participant counts once)."""
    del weights
    deltas = jax.tree.map(lambda a, b: a - b, models, base)
    mean, metrics = self.mean(deltas, present, num_clients, round_key)
    return tree_add(base, mean), metrics

  def stateful(
    self, s: int, num_clients: int, start, averaged, released, present, means=(), log_means=()
  ):
    """How a private stateful local round aggregates: each participant's changes of the
    ``averaged``, ``means`` and ``released`` carries from its ``start`` (and of each
    ``log_means`` carry its ratio to the public reference, less 1), clipped together; the
    averaged ones summed over the expected participants, noised and added to the start (a
    ``log_means`` carry: the reference times the mean ratio, in the log domain), the
    ``released`` ones returned clipped and stacked, the other carries (state kept on the
    clients) stacked. With none of them, every carry comes back stacked and unclipped, for the
    algorithm to release itself (:meth:`model_mean`)."""
    averaged = tuple(averaged) + tuple(means)
    if not averaged and not released and not log_means:
      return PlainStatefulAggregation((), s)
    agg = self.aggregation(None, present, s, num_clients)
    return PrivateStatefulAggregation(agg, start, averaged, tuple(released), tuple(log_means))


class PrivateStatefulAggregation(NamedTuple):
  """A private stateful round's aggregation (:meth:`GaussianRelease.stateful`)."""

  agg: PrivateAggregation
  start: Any
  averaged: tuple
  released: tuple
  log_means: tuple = ()  # (carry name, ratio name, reference) each

  stacked = False  # what is released goes through the clipped weighted sum

  @property
  def weights(self):
    return self.agg.weights / self.agg.expected

  @property
  def present(self):
    """Which slots hold a participant (every slot's flag, also under fixed-size sampling)."""
    return self.agg.weights > 0

  def client(self, carry, row, loss):
    """``(clipped averaged deltas, ((kept, released deltas), within))`` of one participant."""
    sent = self.averaged + self.released
    base = self.start(row)
    deltas = {name: jax.tree.map(jnp.subtract, carry[name], base[name]) for name in sent}
    real = jnp.result_type(float)
    # v_i / v_bar, its exponent capped where its square (in the clip's norm) stays finite
    cap = 0.5 * math.log(float(jnp.finfo(real).max)) - 2.0
    for name, ratio, reference in self.log_means:
      r = jnp.exp(jnp.minimum(carry[name] - reference, cap)).astype(real)
      deltas[ratio] = jnp.subtract(r, jnp.ones((), real))
    kept = {name: value for name, value in carry.items() if name not in sent}
    clipped, (aux, within) = self.agg.send(deltas, (kept, loss))
    rel = {name: clipped[name] for name in self.released}
    ratios = tuple(ratio for _, ratio, _ in self.log_means)
    return {name: clipped[name] for name in self.averaged + ratios}, ((aux, rel), within)

  def received(self, mean, outputs, reference, round_key):
    """``(carries, losses, metrics)``: the averaged carries are the start plus the noised mean
    of the clipped deltas; the released ones the stacked clipped deltas."""
    ((kept, losses), rel), metrics = self.agg.received(outputs, self.agg.weights)
    carries = {**kept, **rel}
    if self.averaged or self.log_means:
      mean = self.agg.noised(mean, round_key)
      carries.update(
        {name: jax.tree.map(jnp.add, reference[name], mean[name]) for name in self.averaged}
      )
    real = jnp.result_type(float)
    for name, ratio, ref in self.log_means:
      # the mean of v over the participants is v_bar times the released mean ratio, kept
      # positive (noise can take it below 0): at least LOG_MEAN_FLOOR
      rel = jnp.maximum(jnp.add(jnp.ones((), real), mean[ratio]), LOG_MEAN_FLOOR)
      carries[name] = (ref + jnp.log(rel)).astype(jnp.result_type(ref))
    return carries, losses, metrics
