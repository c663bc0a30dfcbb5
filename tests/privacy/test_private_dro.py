"""fd.private for q-FFL and DRFA: the plain algorithm (or its expectation) with no noise and huge
bounds, per-client references of the clipping and the lambda weights, the noise's standard
deviation, the floor of q-FFL's denominator, epsilon against dp-accounting called directly
(DRFA's two independently sampled mechanisms composed), Poisson runs, and the bad inputs."""

import dataclasses

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting import rdp
from jax.flatten_util import ravel_pytree

import fedjax_dro as fd
from fedjax_dro.algorithms import drfa, qffl
from fedjax_dro.algorithms.base import make_hparams
from fedjax_dro.algorithms.drfa import local_sgd_with_snapshot
from fedjax_dro.common.model import client_loss_and_grad
from fedjax_dro.core.local import local_round, participant_losses
from fedjax_dro.core.privacy import GaussianRelease, Privacy, poisson_capacity
from fedjax_dro.core.release import PLAIN
from fedjax_dro.core.sampling import sample_clients
from fedjax_dro.core.settings import CommonSettings
from fedjax_dro.privacy import Releases, releases_table
from fedjax_dro.solvers.simplex import prox_chi2
from tests.helpers import dataset, linreg, regression_clients

N = 12


@pytest.fixture(scope="module")
def task():
  """Heterogeneous float64 linear-regression clients (21 parameters)."""
  return dataset(regression_clients(n=N, d=20, seed=0)), linreg(20)


def _blown_up(ds, client):
  """``ds`` with one client's features multiplied by 1e3: its update is huge."""
  x = np.asarray(ds.train.x).copy()
  x[client] *= 1e3
  return dataclasses.replace(ds, train=dataclasses.replace(ds.train, x=jnp.asarray(x)))


def _start(alg, ds, lam=None):
  params = jax.tree.map(lambda a: a.astype(jnp.float64), alg.model.init(jax.random.PRNGKey(1)))
  state = alg.init(params, ds.train, jax.random.PRNGKey(2))
  if lam is not None:
    inner = getattr(state, "inner", state)
    state = inner._replace(lam=jnp.asarray(lam, jnp.float64))
  return params, state


def _flat(tree):
  return np.concatenate([np.ravel(np.asarray(a)) for a in jax.tree.leaves(tree)])


def _diff(a, b):
  return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _settings(alg):
  return CommonSettings(**{k: alg.config[k] for k in CommonSettings._fields if k in alg.config})


def _accountant_eps(event, delta, relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE):
  acc = rdp.RdpAccountant(neighboring_relation=relation)
  acc.compose(event)
  return acc.get_epsilon(delta)


LAM = np.linspace(1.0, 3.0, N) / np.sum(np.linspace(1.0, 3.0, N))  # a non-uniform lambda


# ----------------------------------------------------------------------------------------- q-FFL


def test_qffl_no_noise_and_huge_bounds_is_the_plain_algorithm(task):
  """Fixed participation, noise 0, clip and loss bound 1e12: plain q-FFL to 1e-10."""
  ds, model = task
  alg = qffl(model, local_steps=3, batch_size=8, clients_per_round=5)
  plain = fd.run(alg, ds, rounds=3, seed=4, hparams={"q": 2.5})
  palg = fd.private(alg, 1e12, 0.0, sampling="fixed", loss_bound=1e12)
  priv = fd.run(palg, ds, rounds=3, seed=4, hparams={"q": 2.5})
  assert _diff(plain.final_state, priv.final_state) < 1e-10
  assert _diff(plain.final_state.params, alg.init(*_init_args(alg, ds)).params) > 1e-3  # moved


def _init_args(alg, ds):
  params = jax.tree.map(lambda a: a.astype(jnp.float64), alg.model.init(jax.random.PRNGKey(0)))
  return params, ds.train, jax.random.PRNGKey(0)


def _qffl_reference(alg, ds, params, key, hp, clip, bound):
  """Per client, from the plain local round of the same key: u_k = clip_C(-L F^q delta_k) and
  h_k clipped to [0, B]; returns (u [n, P] unclipped, h unclipped, U, H)."""
  settings, model = _settings(alg), alg.model

  @jax.jit
  def plain_round():  # jitted: the reference's own local round, unclipped
    plain = local_round(model, settings, params, ds.train, key, hp["client_lr"])
    return plain, participant_losses(model, settings, params, ds.train, plain.idx)

  plain, f = plain_round()
  f = np.asarray(f) + 1e-10
  q, L = float(hp["q"]), float(hp["L"])
  deltas = np.stack([_flat(jax.tree.map(lambda a, i=i: a[i], plain.deltas)) for i in range(N)])
  u = -L * f[:, None] ** q * deltas
  h = q * f ** (q - 1) * L**2 * np.sum(deltas**2, axis=1) + L * f**q
  norms = np.linalg.norm(u, axis=1)
  clipped = u * np.minimum(1.0, clip / norms)[:, None]
  return u, h, clipped.sum(0), np.clip(h, 0, bound).sum(), clipped


def test_qffl_clips_each_participants_release(task):
  """Noise 0, every client taking part: the model moves by -sum clip_C(F^q Delta_k) / sum
  clip_[0,B](h_k) from the plain algorithm's own per-client updates; the blown-up client's part
  of the numerator is at most C."""
  ds, model = task
  ds = _blown_up(ds, 3)
  alg = qffl(model, local_steps=2, batch_size=8)
  hp = make_hparams(alg)
  params, _ = _start(alg, ds)
  key = jax.random.PRNGKey(0)
  u, h, _, _, _ = _qffl_reference(alg, ds, params, key, hp, 1.0, 1.0)
  norms = np.linalg.norm(u, axis=1)
  clip, bound = float(np.median(norms)), float(np.median(h))
  assert norms[3] > 1e3 * clip  # the blown-up client
  u, h, U, H, clipped = _qffl_reference(alg, ds, params, key, hp, clip, bound)
  assert 0 < np.sum(h > bound) < N and 0 < np.sum(norms > clip) < N  # both bounds bite
  palg = fd.private(alg, clip, 0.0, sampling="fixed", loss_bound=bound)
  _, state = _start(palg, ds)
  new, metrics = jax.jit(palg.round)(state, ds.train, key, make_hparams(palg))
  np.testing.assert_allclose(_flat(new.params) - _flat(params), -U / H, rtol=1e-10, atol=1e-13)
  assert int(metrics["dp_unclipped"]) == np.sum(norms <= clip)
  assert int(metrics["dp_participants"]) == N
  assert np.linalg.norm(clipped[3]) <= clip * (1 + 1e-12)  # its part of the numerator


def test_qffl_denominator_is_floored_at_its_noise_std(task):
  """No update noise, loss noise z_l B far above the sum of the h_k: the denominator is
  max(H + noise, z_l B), so the step is never longer than ||U|| / (z_l B) and equals it when
  the noise draws below z_l B - H (about 84% of the keys: P(N(0, 1) < 1))."""
  ds, model = task
  alg = qffl(model, local_steps=2)  # full batches: U and H do not depend on the round key
  hp = make_hparams(alg)
  params, _ = _start(alg, ds)
  _, _, U, H, _ = _qffl_reference(alg, ds, params, jax.random.PRNGKey(0), hp, 1.0, 1e12)
  bound, zl = 1e12, 1e-2  # z_l B = 1e10, far above H
  assert H < 1e-3 * zl * bound
  palg = fd.private(alg, 1.0, 0.0, sampling="fixed", loss_bound=bound, loss_noise_multiplier=zl)
  _, state = _start(palg, ds)
  php = make_hparams(palg)
  keys = jax.random.split(jax.random.PRNGKey(3), 400)
  moved = jax.jit(jax.vmap(lambda k: palg.round(state, ds.train, k, php)[0].params))(keys)
  steps = np.linalg.norm(
    np.concatenate(
      [
        (np.asarray(b) - np.asarray(a)[None]).reshape(len(keys), -1)
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(moved))
      ],
      axis=1,
    ),
    axis=1,
  )
  longest = np.linalg.norm(U) / (zl * bound)
  assert np.all(steps <= longest * (1 + 1e-9))
  at_floor = np.mean(np.isclose(steps, longest, rtol=1e-9, atol=0))
  assert abs(at_floor - 0.8413) < 4 * np.sqrt(0.8413 * 0.1587 / len(keys))


def test_qffl_numerator_noise_std_is_z_c(task):
  """client_lr = 0 (zero updates, so every u_k = 0 and h_k = L F_k^q) and z_l = 0: the model
  moves by -N(0, (z C)^2) / sum_k L F_k^q."""
  ds, model = task
  z, clip = 1.3, 0.4
  alg = qffl(model, local_steps=2, batch_size=8)
  palg = fd.private(alg, clip, z, sampling="fixed", loss_bound=1e6, loss_noise_multiplier=0.0)
  params, state = _start(palg, ds)
  hp = {**make_hparams(palg), "client_lr": jnp.float64(0.0)}
  f = np.asarray(participant_losses(model, _settings(alg), params, ds.train, jnp.arange(N)))
  H = np.sum(float(hp["L"]) * (f + 1e-10) ** float(hp["q"]))
  keys = jax.random.split(jax.random.PRNGKey(5), 500)
  moved = jax.jit(jax.vmap(lambda k: palg.round(state, ds.train, k, hp)[0].params))(keys)
  noise = -H * np.concatenate(
    [
      np.ravel(np.asarray(b) - np.asarray(a)[None])
      for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(moved))
    ]
  )
  want = z * clip
  assert noise.size > 10_000
  assert abs(noise.mean()) < 4 * want / np.sqrt(noise.size)
  assert abs(noise.std() / want - 1) < 5 / np.sqrt(2 * noise.size)


def test_ratio_denominator_clips_noises_and_floors():
  """q-FFL's denominator: each report clipped to [0, B], absent slots left out, the sum's noise
  std z_l B, floored at that standard deviation; the plain sum when plain."""
  b, zl = 3.0, 0.1
  values = jnp.array([-1.0, 0.5, 9.0, 100.0])
  present = jnp.array([True, True, True, False])
  keys = jax.random.split(jax.random.PRNGKey(0), 20_000)
  release = GaussianRelease(Privacy("fixed", None, 1e-5), 1.0, 0.0, b, zl)
  sums = np.asarray(jax.vmap(lambda k: release.ratio_denominator(values, present, k))(keys))
  noise = sums - (0.0 + 0.5 + b)  # the floor (0.3) is 10 standard deviations below: never met
  assert abs(noise.mean()) < 4 * zl * b / np.sqrt(noise.size)
  assert abs(noise.std() / (zl * b) - 1) < 5 / np.sqrt(2 * noise.size)
  # the floor: a sum of zeros with noise is at least the noise's standard deviation
  loud = GaussianRelease(Privacy("fixed", None, 1e-5), 1.0, 0.0, b, 0.7)
  zero = jax.vmap(lambda k: loud.ratio_denominator(jnp.zeros(4), None, k))(keys[:2000])
  assert float(jnp.min(zero)) == pytest.approx(0.7 * b) and float(jnp.mean(zero == 0.7 * b)) > 0.4
  assert float(PLAIN.ratio_denominator(values, present, keys[0])) == 8.5  # absent left out


# ------------------------------------------------------------------------------------------ DRFA


def test_drfa_every_client_no_noise_is_plain_drfa_in_expectation(task):
  """Every client drawn (fixed, m = n), noise 0, huge bounds: the private update is
  sum_i lambda_i (d_i, e_i), the expectation of the plain lambda-sampled round's update, which is
  plain DRFA with sampling='full' (full batches: the same local iterates and snapshot losses
  whatever the keys). Three rounds, lambda moving away from uniform: to 1e-10."""
  ds, model = task
  hp = {"gamma": 0.05}
  full = fd.run(drfa(model, local_steps=3, sampling="full"), ds, rounds=3, seed=4, hparams=hp)
  palg = fd.private(drfa(model, local_steps=3), 1e12, 0.0, sampling="fixed", loss_bound=1e12)
  priv = fd.run(palg, ds, rounds=3, seed=4, hparams=hp)
  assert _diff(full.final_state, priv.final_state) < 1e-10
  lam = np.asarray(priv.final_state.lam)
  assert lam.max() - lam.min() > 1e-3  # lambda weighted the later rounds unevenly


def test_drfa_private_and_plain_updates_have_the_same_expectation(task):
  """4 of 12 clients, a non-uniform lambda, full-batch local steps (each client's delta d_i
  fixed), noise 0 and huge bounds: over many round keys the plain round's model (m draws by
  lambda with replacement, averaged) and the private one's (a uniform sample weighted by
  lambda_i n / m) both average to w + sum_i lambda_i d_i, which is plain DRFA with
  sampling='full' (within 5 standard errors, every coordinate)."""
  ds, model = task
  plain = drfa(model, local_steps=2, clients_per_round=4)
  palg = fd.private(plain, 1e12, 0.0, sampling="fixed", loss_bound=1e12)
  full = drfa(model, local_steps=2, sampling="full")
  keys = jax.random.split(jax.random.PRNGKey(9), 400)

  def models(alg):
    params, state = _start(alg, ds, lam=LAM)
    hp = make_hparams(alg)
    moved = jax.jit(jax.vmap(lambda k: alg.round(state, ds.train, k, hp)[0].params))(keys)
    return params, np.asarray(jax.vmap(lambda p: ravel_pytree(p)[0])(moved))

  params, exact = models(full)
  want = exact[0]
  assert np.ptp(exact, axis=0).max() < 1e-12  # sampling='full' is deterministic here
  assert np.abs(want - _flat(params)).max() > 1e-2  # the round moves the model
  for alg in (plain, palg):
    every = models(alg)[1]
    se = every.std(axis=0) / np.sqrt(len(keys))
    assert np.all(se > 1e-6)  # the samples differ from key to key
    assert np.all(np.abs(every.mean(axis=0) - want) < 5 * se)


def test_drfa_private_round_against_a_per_client_reference(task):
  """Noise 0, 5 of 12 clients (fixed), a non-uniform lambda, clip and loss bound that bite, a
  blown-up participant: the model moves by sum_i (lambda_i n / m) clip_C(d_i, e_i) (the pair
  clipped jointly), the snapshot likewise, lambda takes its projected step with the second
  sample's losses at that snapshot clipped to [0, B] and scaled by n / m; the blown-up client
  moves the model by at most C lambda_i n / m."""
  ds, model = task
  m, tau = 5, 3
  alg = drfa(model, local_steps=tau, batch_size=8, clients_per_round=m)
  key = jax.random.PRNGKey(0)
  k_sample, k_snap, k_local, k_usample, k_eval = jax.random.split(key, 5)
  idx = np.asarray(sample_clients(k_sample, N, m))
  ds = _blown_up(ds, int(idx[1]))
  params, _ = _start(alg, ds)
  hp = {**make_hparams(alg), "gamma": jnp.float64(0.5)}
  t_snap = jax.random.randint(k_snap, (), 0, tau)
  tr = ds.train
  pairs = []
  one_client = jax.jit(
    lambda x, y, nex, k: local_sgd_with_snapshot(
      model,
      params,
      x,
      y,
      nex,
      k,
      num_steps=tau,
      batch_size=8,
      lr=hp["client_lr"],
      snapshot_step=t_snap,
    )
  )
  for j, i in enumerate(idx):
    final, snap, _ = one_client(
      tr.x[i], tr.y[i], tr.num_examples[i], jax.random.split(k_local, m)[j]
    )
    pairs.append((_flat(final) - _flat(params), _flat(snap) - _flat(params)))
  norms = np.array([np.sqrt(np.sum(d**2) + np.sum(e**2)) for d, e in pairs])
  clip = float(np.median(norms))
  assert norms[1] > 1e3 * clip and 0 < np.sum(norms > clip) < m
  w = LAM[idx] * N / m
  scaled = [min(1.0, clip / nrm) for nrm in norms]
  moved = sum(wi * c * d for wi, c, (d, _) in zip(w, scaled, pairs))
  snap_moved = sum(wi * c * e for wi, c, (_, e) in zip(w, scaled, pairs))
  assert np.linalg.norm(w[1] * scaled[1] * np.concatenate(pairs[1])) <= clip * w[1] * (1 + 1e-12)
  snapshot = ravel_pytree(params)[1](jnp.asarray(_flat(params) + snap_moved))
  uidx = np.asarray(sample_clients(k_usample, N, m))
  one_loss = jax.jit(lambda w, x, y, nex, k: client_loss_and_grad(model, w, x, y, nex, k, 8)[0])
  eval_keys = jax.random.split(k_eval, m)
  losses = np.array(
    [
      float(one_loss(snapshot, tr.x[i], tr.y[i], tr.num_examples[i], k))
      for i, k in zip(uidx, eval_keys)
    ]
  )
  bound = float(np.median(losses))
  assert 0 < np.sum(losses > bound) < m
  v = np.zeros(N)
  v[uidx] = N / m * np.clip(losses, 0, bound)
  lam_want = prox_chi2(jnp.asarray(LAM), jnp.asarray(v), 0.5 * tau, jnp.float64(0.0))

  palg = fd.private(alg, clip, 0.0, sampling="fixed", loss_bound=bound)
  _, state = _start(palg, ds, lam=LAM)
  php = {**make_hparams(palg), "gamma": jnp.float64(0.5)}
  new, metrics = jax.jit(palg.round)(state, ds.train, key, php)
  np.testing.assert_allclose(_flat(new.params) - _flat(params), moved, rtol=1e-9, atol=1e-12)
  np.testing.assert_allclose(np.asarray(new.lam), np.asarray(lam_want), rtol=1e-9, atol=1e-12)
  assert np.abs(np.asarray(new.lam) - LAM).max() > 1e-3  # lambda moved
  assert int(metrics["dp_unclipped"]) == np.sum(norms <= clip)
  assert int(metrics["dp_participants"]) == m and int(metrics["dp_loss_participants"]) == m


def test_drfa_noise_std_is_z_c_max_lambda_over_q(task):
  """client_lr = 0 (zero deltas) under Poisson participation: the model moves by the noise
  alone, std z C max(lambda) / q."""
  ds, model = task
  z, clip, rate = 0.9, 0.3, 0.25
  palg = fd.private(drfa(model, local_steps=2, batch_size=8), clip, z, rate=rate, loss_bound=5.0)
  params, state = _start(palg, ds, lam=LAM)
  hp = {**make_hparams(palg), "client_lr": jnp.float64(0.0)}
  keys = jax.random.split(jax.random.PRNGKey(5), 500)
  moved = jax.jit(jax.vmap(lambda k: palg.round(state, ds.train, k, hp)[0].params))(keys)
  noise = np.concatenate(
    [
      np.ravel(np.asarray(b) - np.asarray(a)[None])
      for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(moved))
    ]
  )
  want = z * clip * LAM.max() / rate
  assert noise.size > 10_000
  assert abs(noise.mean()) < 4 * want / np.sqrt(noise.size)
  assert abs(noise.std() / want - 1) < 5 / np.sqrt(2 * noise.size)


# ------------------------------------------------------------------------------ accounting, runs


def test_qffl_epsilon_composes_its_two_gaussians(task):
  """q-FFL's F^q Delta sum (z) and h sum (z_l) are on the same participants: one Gaussian of
  multiplier (z^-2 + z_l^-2)^(-1/2), accounted by dp-accounting."""
  ds, model = task
  palg = fd.private(
    qffl(model, local_steps=2, batch_size=8),
    1.0,
    1.2,
    rate=0.3,
    loss_bound=50.0,
    loss_noise_multiplier=2.0,
  )
  hist = fd.run(palg, ds, rounds=4)
  z = (1.2**-2 + 2.0**-2) ** -0.5
  event = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.3, dpa.GaussianDpEvent(z)), 4)
  rec = hist.evaluations[-1]["privacy"]
  assert rec["epsilon"] == pytest.approx(_accountant_eps(event, 1e-5), rel=1e-12)
  assert rec["noise_multiplier"] == pytest.approx(z)


def test_drfa_epsilon_composes_two_independently_sampled_mechanisms(task):
  """DRFA's updates (z) and losses (z_l) come from two independent samples: each round is
  ComposedDpEvent of two sampled Gaussians, self-composed over the rounds (RDP and PLD), not the
  single Gaussian of the combined multiplier."""
  ds, model = task
  alg = drfa(model, local_steps=2, batch_size=8)
  z, zl, q = 1.2, 2.0, 0.3
  palg = fd.private(alg, 1.0, z, rate=q, loss_bound=5.0, loss_noise_multiplier=zl)
  hist = fd.run(palg, ds, rounds=4)
  rec = hist.evaluations[-1]["privacy"]

  def rounds(events, t=4):
    return dpa.SelfComposedDpEvent(dpa.ComposedDpEvent(events), t)

  pois = [dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(x)) for x in (z, zl)]
  want = _accountant_eps(rounds(pois), 1e-5)
  assert rec["epsilon"] == pytest.approx(want, rel=1e-12)
  assert rec["noise_multiplier"] == z and rec["loss_noise_multiplier"] == zl
  from fedjax_dro.core.privacy import overflow_probability

  assert rec["delta_overflow"] == pytest.approx(2 * 4 * overflow_probability(N, q))
  combined = (z**-2 + zl**-2) ** -0.5
  single = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(combined)), 4)
  assert abs(rec["epsilon"] / _accountant_eps(single, 1e-5) - 1) > 0.01  # the flag matters
  # the runner's record comes from run_epsilon (as above); the other accountings through it:
  # the PLD accountant on the same events
  from dp_accounting import pld

  from fedjax_dro.privacy.accounting import run_epsilon

  noises = {"dp_noise": z, "dp_loss_noise": zl}
  ppld = fd.private(alg, 1.0, z, rate=q, loss_bound=5.0, loss_noise_multiplier=zl, accountant="pld")
  acc = pld.PLDAccountant()
  acc.compose(rounds(pois, 2))
  got = run_epsilon(ppld.config, 2, noises, N)["epsilon"]
  assert got == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
  # fixed-size samples: without replacement, replace-one neighbours, z / 2 and z_l / 2
  pfix = fd.private(
    drfa(model, local_steps=2, batch_size=8, clients_per_round=4),
    1.0,
    z,
    sampling="fixed",
    loss_bound=5.0,
    loss_noise_multiplier=zl,
  )
  fixed = [dpa.SampledWithoutReplacementDpEvent(N, 4, dpa.GaussianDpEvent(x / 2)) for x in (z, zl)]
  want = _accountant_eps(rounds(fixed, 3), 1e-5, dpa.NeighboringRelation.REPLACE_ONE)
  assert run_epsilon(pfix.config, 3, noises, N)["epsilon"] == pytest.approx(want, rel=1e-12)
  # no loss noise: the losses are released exactly
  assert run_epsilon(palg.config, 1, {**noises, "dp_loss_noise": 0.0}, N)["epsilon"] == np.inf


@pytest.mark.parametrize("name", ["qffl", "drfa"])
def test_a_poisson_run_is_finite_and_reports_its_participants(task, name):
  ds, model = task
  rate = 0.4
  if name == "qffl":
    alg = qffl(model, local_steps=2, batch_size=8)
  else:
    alg = drfa(model, local_steps=2, batch_size=8)
  hist = fd.run(fd.private(alg, 0.5, 0.8, rate=rate, loss_bound=50.0), ds, rounds=5)
  m = {k: np.asarray(v) for k, v in hist.train_metrics.items()}
  cap = poisson_capacity(N, rate)
  assert np.all((0 <= m["dp_participants"]) & (m["dp_participants"] <= cap))
  assert len(set(m["dp_participants"].tolist())) > 1  # Poisson: the count varies
  assert np.all(m["dp_unclipped"] <= m["dp_participants"])
  assert np.all(np.isfinite(m["train_loss"])) and np.all(np.isfinite(m["lambda_max"]))
  if name == "drfa":
    assert np.all(m["dp_loss_participants"] <= cap) and "dp_loss_dropped" in m
    assert np.all(np.isfinite(np.asarray(hist.final_state.lam)))
  assert np.isfinite(_flat(hist.final_state.params)).all()
  rec = hist.evaluations[-1]["privacy"]
  assert rec["rounds"] == 5 and 0 < rec["epsilon"] < np.inf


def test_bad_inputs_and_the_release_table(task):
  ds, model = task
  table = releases_table()
  assert all(isinstance(table[n], Releases) and table[n].losses for n in ("qffl", "drfa"))
  with pytest.raises(ValueError, match=r"loss_bound: 'qffl' releases each participant's h_k"):
    fd.private(qffl(model), 1.0, 1.0, rate=0.5)
  with pytest.raises(ValueError, match="loss_bound: 'drfa' releases each participant's loss"):
    fd.private(drfa(model), 1.0, 1.0, sampling="fixed")
  with pytest.raises(
    ValueError, match="'drfa' cannot be made client-level private: with sampling='full'"
  ):
    fd.private(drfa(model, sampling="full"), 1.0, 1.0, rate=0.5, loss_bound=1.0)
  with pytest.raises(ValueError, match="loss_bound must be a positive"):
    fd.private(qffl(model), 1.0, 1.0, rate=0.5, loss_bound=0.0)
  with pytest.raises(ValueError, match="loss_noise_multiplier must be a non-negative"):
    fd.private(drfa(model), 1.0, 1.0, rate=0.5, loss_bound=1.0, loss_noise_multiplier=-1.0)
