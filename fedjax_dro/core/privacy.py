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

The algorithms' rounds call the shared mechanics of :mod:`fedjax_dro.core.local`;
:func:`privatizing` makes a round traced inside it private: :func:`fedjax_dro.privacy.private`
wraps an algorithm's round in it. The clip norm and the noise multiplier are traced values (the
wrapper's hyper-parameters ``dp_clip`` and ``dp_noise``), so a sweep over them is one program.

Poisson participation in fixed shapes: the round draws a Bernoulli(``q``) mask over the ``n``
clients and trains the first ``capacity`` of the drawn clients in slots of one fixed size (slots
left empty carry weight 0 and change nothing). ``capacity`` is one above the ``1 -
OVERFLOW_PROBABILITY`` quantile of a Binomial(``n``, ``q``) (:func:`poisson_capacity`); a round that
draws more keeps the first ``capacity`` (counted in the round's ``dp_dropped`` metric). The
guarantee then holds with ``delta`` increased by at most ``rounds * overflow_probability``, which
:func:`fedjax_dro.privacy.accounting.run_epsilon` reports as ``delta_overflow``.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

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


class Active(NamedTuple):
  """The privacy of the round being traced: its settings, its traced clip norm and noise (and,
  for the algorithms that release their participants' losses, the losses' clip bound and noise),
  and the round's privacy metrics as its first private draw records them."""

  privacy: Privacy
  clip_norm: Any  # [] float
  noise_multiplier: Any  # [] float
  metrics: dict  # "dp_participants", "dp_dropped", "dp_unclipped": [] traced values
  loss_bound: Any = None  # [] float: losses clipped to [0, B]
  loss_noise: Any = None  # [] float: noise std z_l B on each released loss
  count_noise: Any = None  # [] float: noise std on each released participant count (IFCA)


_ACTIVE: list = []  # the rounds being traced under privatizing(), innermost last


@contextlib.contextmanager
def privatizing(
  privacy: Privacy, clip_norm, noise_multiplier, loss_bound=None, loss_noise=None, count_noise=None
):
  """Within the block, the shared round mechanics traced (participant draws, local rounds, the
  releases of :func:`release_sum`, :func:`release_losses`, :func:`release_mean` and
  :func:`release_group_sums`) are private: Poisson or fixed participation, clipped updates,
  noised sums, fixed denominators. Yields the dict the round's privacy metrics are recorded in."""
  act = Active(privacy, clip_norm, noise_multiplier, {}, loss_bound, loss_noise, count_noise)
  _ACTIVE.append(act)
  try:
    yield act.metrics
  finally:
    _ACTIVE.pop()


@contextlib.contextmanager
def suspended():
  """Within the block nothing is private: the work a protocol keeps on its clients (pFedMe's
  personal updates of the clients not drawn) runs as in a plain round."""
  _ACTIVE.append(None)
  try:
    yield
  finally:
    _ACTIVE.pop()


def active() -> Optional[Active]:
  """The privacy of the round being traced, or None outside :func:`privatizing` (and inside
  :func:`suspended`)."""
  return _ACTIVE[-1] if _ACTIVE else None


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


def poisson_draw(sample_key, num_clients: int, sampling_weights=None):
  """A private round's Poisson participants, ``(idx, rows, present)``: ``idx`` as
  :func:`poisson_participants` (``num_clients`` in empty slots, dropped by scatters), ``rows``
  the same clamped into range (for gathers), ``present`` whether each slot holds a participant.
  None outside a private round or with fixed-size sampling (the usual draw then applies)."""
  act = active()
  if act is None or act.privacy.sampling != "poisson":
    return None
  if sampling_weights is not None:
    raise ValueError("a private round draws its participants uniformly (no sampling weights)")
  idx, present, dropped = poisson_participants(sample_key, num_clients, act.privacy.rate)
  act.metrics.setdefault("dp_participants", jnp.sum(present).astype(jnp.float32))
  act.metrics.setdefault("dp_dropped", dropped.astype(jnp.float32))
  return idx, jnp.minimum(idx, num_clients - 1), present


class PrivateRound(NamedTuple):
  """The private aggregation of one local round (:func:`private_round`)."""

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
    """The participants' other outputs, their flags counted over the filled slots (``weights``
    1 or 0, in the order the outputs ran) into the round's ``dp_unclipped`` metric."""
    aux, within = outputs
    act = active()
    count = jnp.sum(jnp.where(weights > 0, within, False)).astype(jnp.float32)
    act.metrics.setdefault("dp_unclipped", count)
    return aux

  def noised(self, mean, round_key):
    """The sum of the clipped updates over the expected count (``mean``) plus the noise on the
    sum, ``N(0, (z C)^2)`` per entry, over the same count."""
    std = self.noise_multiplier * self.clip_norm / self.expected
    return add_noise(mean, noise_key(round_key), std)


def private_round(mean_only: bool, present, s: int, num_clients: int) -> Optional[PrivateRound]:
  """The private aggregation of a local round with ``s`` slots (None outside a private round):
  each participant counts once (weight 1), the sum is divided by the expected count. Without
  ``mean_only`` the round returns the clipped updates stacked, and the algorithm releases their
  weighted sum with :func:`release_sum`."""
  act = active()
  if act is None:
    return None
  real = jnp.result_type(float)  # float64 where JAX runs in 64 bits: exact weights 1 / m
  weights = jnp.ones((s,), real) if present is None else present.astype(real)
  if act.privacy.sampling == "fixed":
    act.metrics.setdefault("dp_participants", jnp.float32(s))
    act.metrics.setdefault("dp_dropped", jnp.float32(0))
  expected = jnp.asarray(expected_participants(act.privacy, num_clients, s), real)
  return PrivateRound(act.clip_norm, act.noise_multiplier, expected, weights)


def inverse_rate(num_clients: int, s: int):
  """``1 / q`` in a private round with Poisson participation, else ``n / s``: the factor that
  makes a sum over the round's participants an unbiased estimate of the sum over all clients."""
  act = active()
  if act is not None and act.privacy.sampling == "poisson":
    return 1.0 / act.privacy.rate
  return num_clients / s


def present_slots(weights):
  """Which slots of a local round hold a participant: None outside a private round (all do),
  else where the round's ``weights`` (1 for a participant, 0 for an empty slot) are positive."""
  return None if active() is None else weights > 0


def release_sum(deltas, weights, present, bound, round_key):
  """``sum_i weights_i deltas_i`` over the ``[s, ...]`` stacked ``deltas`` (slots with ``present``
  False left out); in a private round the deltas are the clipped ones and the sum gets Gaussian
  noise of standard deviation ``z C bound``, ``bound`` the largest weight any client could have
  (server state, public): adding or removing one client moves the sum by at most ``C bound``."""
  from fedjax_dro.core.aggregation import weighted_sum

  if present is not None:
    weights = weights * present.astype(weights.dtype)
  total = weighted_sum(deltas, weights)
  act = active()
  if act is None:
    return total
  std = act.noise_multiplier * act.clip_norm * bound
  return add_noise(total, noise_key(round_key), std)


def release_losses(losses, round_key):
  """The participants' ``[s]`` reported losses: in a private round clipped to ``[0, B]`` and
  each noised with standard deviation ``z_l B`` (a client's loss is its own coordinate: adding
  or removing it moves the vector by at most ``B``); unchanged outside one."""
  act = active()
  if act is None:
    return losses
  if act.loss_bound is None:
    raise ValueError("this private round releases losses but has no loss bound")
  clipped = jnp.clip(losses, 0.0, act.loss_bound)
  std = act.loss_noise * act.loss_bound
  return add_noise(clipped, jax.random.fold_in(noise_key(round_key), 1), std)


def participation_share(default):
  """The participants' expected share of the clients in a private round (``q`` with Poisson
  sampling), else ``default`` (the algorithm's own ``s / n``)."""
  act = active()
  if act is not None and act.privacy.sampling == "poisson":
    return act.privacy.rate
  return default


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
  if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 < rate <= 1.0:
    raise ValueError(f"{name} must be a number in (0, 1], got {rate!r}")
  if not math.isfinite(rate):
    raise ValueError(f"{name} must be finite, got {rate!r}")
  return float(rate)


def release_mean(deltas, present, num_clients: int, round_key):
  """The DP-FedAvg release of ``[s, ...]`` stacked updates already computed (pFedMe's drawn
  clients under ``personal_updates="all"``): each clipped, summed over the slots ``present``
  (None: all), divided by the expected participants, noised with ``z C`` on the sum; the clip
  flags counted into ``dp_unclipped``. Must be called in a private round."""
  from fedjax_dro.core.aggregation import weighted_sum

  s = jax.tree.leaves(deltas)[0].shape[0]
  dp = private_round(False, present, s, num_clients)
  clipped, norms = jax.vmap(lambda d: clip_tree(d, dp.clip_norm))(deltas)
  dp.received((None, norms <= dp.clip_norm), dp.weights)
  return dp.noised(weighted_sum(clipped, dp.weights / dp.expected), round_key)


def release_group_sums(clipped, groups, present, round_key):
  """Per-group sums of clipped updates and per-group participant counts, both noised (IFCA's
  clusters): ``clipped`` ``[s, ...]`` updates already clipped to ``C``, ``groups`` ``[s, k]``
  one-hot group of each slot, ``present`` ``[s]`` filled slots (None: all). Returns the ``[k, ...]``
  sums, each with Gaussian noise of standard deviation ``z C`` (a client adds to one group's sum
  only, so the ``k`` sums together move by at most ``C``), and the ``[k]`` counts, each with noise
  of standard deviation ``z_c`` (the active ``count_noise``: one client moves the count vector by
  1). Outside a private round: the exact sums and counts."""
  from fedjax_dro.core.aggregation import weighted_sum

  if present is not None:
    groups = groups * present[:, None].astype(groups.dtype)
  sums = jax.vmap(lambda w: weighted_sum(clipped, w))(groups.T)
  counts = jnp.sum(groups, axis=0)
  act = active()
  if act is None:
    return sums, counts
  key = noise_key(round_key)
  sums = add_noise(sums, key, act.noise_multiplier * act.clip_norm)
  counts = add_noise(counts, jax.random.fold_in(key, 16), act.count_noise)  # its own stream
  return sums, counts


# -- releases of more than one model-sized vector per participant (SCAFFOLD with local_epochs,
# SCAFF-PD) --


def clip_part(tree, parts: int):
  """``(tree clipped to C / sqrt(parts), whether it was within)``: one of the ``parts``
  model-sized vectors a participant releases in a round at different times (a later one depends
  on what the server made of an earlier one, so they cannot be clipped together); together they
  stay within ``C``, so their noised sums (each with noise ``z C`` times its weight bound) are one
  Gaussian mechanism of multiplier ``z``, as one vector clipped to ``C`` would be. ``(tree,
  True)`` outside a private round."""
  act = active()
  if act is None:
    return tree, jnp.bool_(True)
  bound = act.clip_norm / math.sqrt(parts)
  clipped, norm = clip_tree(tree, bound)
  return clipped, norm <= bound


def release_total(total, bound, round_key, stream: int = 3):
  """:func:`release_sum` for a weighted sum already accumulated (chunk by chunk, never stacked):
  in a private round ``total`` plus Gaussian noise of standard deviation ``z C bound`` drawn from
  the round's noise stream ``stream`` (3 onward: apart from :func:`release_sum`'s, the losses'
  (1) and adaptive clipping's count (2)); unchanged outside one."""
  act = active()
  if act is None:
    return total
  std = act.noise_multiplier * act.clip_norm * bound
  return add_noise(total, jax.random.fold_in(noise_key(round_key), stream), std)


@contextlib.contextmanager
def unclipped_updates():
  """Within a private round, the local rounds traced in the block return their participants'
  updates unclipped: for an algorithm whose participants release something computed from their
  update (q-FFL's ``F_k^q Delta_k``), which it clips itself with :func:`clip_each` before
  releasing it. The block's participant draw is recorded in the round's metrics as usual
  (``dp_participants``, ``dp_dropped``); its clip flags are not (:func:`clip_each` records those
  of what is released). Only local rounds that return their stacked updates may run in the
  block (a ``mean_only`` round noises its sum with the clip norm, infinite here). Outside a
  private round, nothing changes."""
  act = active()
  if act is None:
    yield
    return
  inner = act._replace(clip_norm=math.inf, metrics={})
  _ACTIVE.append(inner)
  try:
    yield
  finally:
    _ACTIVE.pop()
    for name in ("dp_participants", "dp_dropped"):
      if name in inner.metrics:
        act.metrics.setdefault(name, inner.metrics[name])


def clip_each(stacked, present):
  """The ``[s, ...]`` stacked per-participant pytrees, each (all its leaves together: what a
  participant releases in one message, e.g. a model delta and a control-variate delta) clipped to
  L2 norm ``C`` in a private round, whose ``dp_unclipped`` metric then counts the filled slots
  (``present``; None: all) whose whole row was within ``C`` (replacing any count of a part of the
  row); unchanged outside one. Rows already clipped in part (:meth:`PrivateRound.send` clipped
  their model delta) are clipped again as a whole: when the rest of a row is a fixed multiple of
  the clipped part, as SCAFFOLD's ``-delta_i / (K_i lr)``, the two clips are one clip of the whole
  row, and a row is within ``C`` exactly when the participant's whole unclipped row was."""
  act = active()
  if act is None:
    return stacked
  clipped, norms = jax.vmap(lambda t: clip_tree(t, act.clip_norm))(stacked)
  within = norms <= act.clip_norm
  if present is not None:
    within = jnp.logical_and(within, present)
  act.metrics["dp_unclipped"] = jnp.sum(within).astype(jnp.float32)  # the whole row's flag
  return clipped


def release_bounded_sum(values, present, round_key):
  """``sum_i values_i`` over the ``[s]`` participants' scalar reports (slots with ``present``
  False left out). In a private round each report is clipped to ``[0, B]`` (the loss bound) and
  the sum gets Gaussian noise of standard deviation ``z_l B`` (adding or removing one client moves
  it by at most ``B``), on a noise stream of its own; the plain sum outside one."""
  if present is not None:
    values = jnp.where(present, values, 0)
  act = active()
  if act is None:
    return jnp.sum(values)
  if act.loss_bound is None:
    raise ValueError("this private round releases a bounded sum but has no loss bound")
  total = jnp.sum(jnp.clip(values, 0.0, act.loss_bound))
  std = act.loss_noise * act.loss_bound
  return add_noise(total, jax.random.fold_in(noise_key(round_key), 3), std)


def uniform_participants(key, num_clients: int, fixed_count: int, metric: str = "dp"):
  """A private round's uniform participants, ``(idx, rows, present)`` as :func:`poisson_draw`:
  a Poisson draw at the rate ``q``, or (fixed-size sampling) ``fixed_count`` clients uniformly
  without replacement (every slot present). For an algorithm that draws its participants itself
  (and possibly twice a round, as DRFA's second sample): the draw's size and overflow are recorded
  as the round's ``{metric}_participants`` and ``{metric}_dropped`` metrics."""
  from fedjax_dro.core.sampling import sample_clients

  act = active()
  if act is None:
    raise ValueError("uniform_participants draws the participants of a private round only")
  if act.privacy.sampling == "poisson":
    idx, present, dropped = poisson_participants(key, num_clients, act.privacy.rate)
  else:
    idx = sample_clients(key, num_clients, fixed_count).astype(jnp.int32)
    present, dropped = jnp.ones(idx.shape, bool), jnp.zeros((), jnp.int32)
  act.metrics.setdefault(f"{metric}_participants", jnp.sum(present).astype(jnp.float32))
  act.metrics.setdefault(f"{metric}_dropped", dropped.astype(jnp.float32))
  return idx, jnp.minimum(idx, num_clients - 1), present


def present_loss_metrics(losses, present) -> dict:
  """``train_loss`` and ``train_loss_max``: the unweighted mean and the max of the ``[s]``
  participants' losses over the filled slots (``present``; 0 when none is)."""
  w = present.astype(losses.dtype)
  count = jnp.sum(w)
  top = jnp.max(jnp.where(present, losses, -jnp.inf))
  return {
    "train_loss": jnp.sum(w * losses) / jnp.maximum(count, 1),
    "train_loss_max": jnp.where(count > 0, top, 0),
  }
