"""fd.private for SCAFFOLD with local_epochs and SCAFF-PD: the plain algorithms recovered with no
noise and huge clips, every model-sized vector a participant sends clipped (control-variate deltas
and SCAFF-PD's gradients at the global model included), the noise on the released sums, epsilon
against dp-accounting called directly, Poisson rounds, and the loss bound SCAFF-PD needs."""

import dataclasses
import math

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting import rdp
from jax.flatten_util import ravel_pytree

import fedjax_dro as fd
from fedjax_dro.algorithms import scaff_pd, scaffold
from fedjax_dro.algorithms.base import make_hparams
from fedjax_dro.common.model import client_loss_and_grad
from fedjax_dro.core.local import local_round, local_sgd
from fedjax_dro.core.privacy import poisson_capacity
from fedjax_dro.core.schedule import local_step_counts
from fedjax_dro.core.settings import CommonSettings
from tests.helpers import dataset, linreg, regression_clients

N = 12
SCAFF_PD_HP = {"client_lr": 0.01, "tau": 0.2, "sigma": 0.05}  # stable over a few rounds


@pytest.fixture(scope="module")
def task():
  """Heterogeneous float64 linear-regression clients (21 parameters)."""
  return dataset(regression_clients(n=N, d=20, seed=0)), linreg(20)


def _huge_client(ds, client=3, factor=1e2):
  """``ds`` with one client's features blown up: its updates and gradients are huge."""
  x = np.asarray(ds.train.x).copy()
  x[client] *= factor
  return dataclasses.replace(ds, train=dataclasses.replace(ds.train, x=jnp.asarray(x)))


def _scaffold_epochs(model, **kw):
  return scaffold(model, local_epochs=1, batch_size=8, weighting="uniform", **kw)


def _one_round(alg, ds, hp=None, seed=0):
  params = jax.tree.map(lambda a: a.astype(jnp.float64), alg.model.init(jax.random.PRNGKey(1)))
  state = alg.init(params, ds.train, jax.random.PRNGKey(2))
  key = jax.random.PRNGKey(seed)
  new, metrics = jax.jit(alg.round)(state, ds.train, key, make_hparams(alg, hp))
  return params, state, new, metrics, key


def _leaves_diff(a, b):
  return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _flat(tree, rows=None):
  """The leaves of a pytree as one vector (``rows``: a stacked tree as ``[rows, P]``)."""
  if rows is None:
    return np.concatenate([np.ravel(np.asarray(a)) for a in jax.tree.leaves(tree)])
  return np.concatenate([np.asarray(a).reshape(rows, -1) for a in jax.tree.leaves(tree)], axis=1)


def _settings(alg):
  return CommonSettings(**{k: alg.config[k] for k in CommonSettings._fields if k in alg.config})


def _accountant_eps(event, rounds, delta):
  acc = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
  acc.compose(event, rounds)
  return acc.get_epsilon(delta)


PLAIN_CASES = {
  "scaffold_local_epochs": (
    lambda m: _scaffold_epochs(m, clients_per_round=5),
    None,
  ),
  "scaffold_local_epochs_full": (lambda m: _scaffold_epochs(m), None),
  "scaff_pd": (lambda m: scaff_pd(m, local_steps=2, batch_size=8), SCAFF_PD_HP),
  "scaff_pd_local_epochs": (lambda m: scaff_pd(m, local_epochs=1, batch_size=8), SCAFF_PD_HP),
  "scaff_pd_cvar_condition_5_1": (
    lambda m: scaff_pd(m, local_steps=2, psi="cvar", parameter_rule="condition_5_1"),
    {"client_lr": 0.01, "tau": 0.2, "sigma": 0.05},
  ),
}


@pytest.mark.parametrize("name", sorted(PLAIN_CASES))
def test_no_noise_and_huge_clips_is_the_plain_algorithm(task, name):
  """Fixed participation, noise 0, a clip of 1e12 and a loss bound of 1e12: the plain run to
  1e-10 (SCAFF-PD: every client every round either way)."""
  ds, model = task
  build, hp = PLAIN_CASES[name]
  alg = build(model)
  plain = fd.run(alg, ds, rounds=3, seed=4, hparams=hp)
  kw = {"loss_bound": 1e12} if alg.name == "scaff_pd" else {}
  priv = fd.run(
    fd.private(alg, 1e12, 0.0, sampling="fixed", **kw), ds, rounds=3, seed=4, hparams=hp
  )
  assert np.isfinite(_flat(plain.final_state.params)).all()
  assert _leaves_diff(plain.final_state, priv.final_state) < 1e-10


def test_scaffold_epochs_clips_the_model_and_control_variate_deltas_together(task):
  """Noise 0, every client taking part: x moves by sum_i clip(delta_i, u_i)[delta] / n and c by
  sum_i clip(delta_i, u_i)[u] / n (c = 0 before the round), u_i = -delta_i / (K_i lr), the pair
  clipped to C as one vector; the deltas from the plain round's own per-client updates. A client
  with a huge update moves (x, c) by at most C / n. Each client's own c_i+ is computed from its
  unclipped delta; dp_unclipped counts the pairs within C."""
  ds = _huge_client(task[0])
  model = task[1]
  alg = _scaffold_epochs(model)
  hp = make_hparams(alg)
  lr = float(hp["client_lr"])
  params = jax.tree.map(lambda a: a.astype(jnp.float64), model.init(jax.random.PRNGKey(1)))
  zeros = jax.tree.map(jnp.zeros_like, params)
  controls = jax.tree.map(lambda a: jnp.zeros((N,) + a.shape, a.dtype), params)
  key = jax.random.PRNGKey(0)  # _one_round's round key
  correct = lambda w, g, c_i: jax.tree.map(lambda gi, ci, c: gi - ci + c, g, c_i, zeros)
  plain = local_round(
    model, _settings(alg), params, ds.train, key, lr, client_state=controls, grad_transform=correct
  )
  assert list(np.asarray(plain.idx)) == list(range(N))
  delta = _flat(plain.deltas, N)
  steps = np.maximum(np.asarray(local_step_counts(_settings(alg), plain.num_examples)), 1)
  u = -delta / (steps[:, None] * lr)
  pair = np.concatenate([delta, u], axis=1)
  norms = np.linalg.norm(pair, axis=1)
  clip = float(np.median(norms))
  assert norms[3] > 100 * clip and 0 < np.sum(norms <= clip) < N  # the clip splits the clients
  clipped = pair * np.minimum(1.0, clip / norms)[:, None]
  palg = fd.private(alg, clip, 0.0, sampling="fixed")
  _, state, new, metrics, _ = _one_round(palg, ds)
  p = delta.shape[1]
  np.testing.assert_allclose(
    _flat(new.params) - _flat(params), clipped[:, :p].sum(0) / N, rtol=1e-10, atol=1e-13
  )
  np.testing.assert_allclose(_flat(new.control), clipped[:, p:].sum(0) / N, rtol=1e-10, atol=1e-13)
  assert np.linalg.norm(clipped[3]) / N <= clip / N * (1 + 1e-12)  # the huge client's share
  # its own control variate: c_i+ = -delta_i / (K_i lr) from the unclipped delta
  np.testing.assert_allclose(_flat(new.client_controls, N), u, rtol=1e-10, atol=1e-13)
  assert int(metrics["dp_unclipped"]) == int(np.sum(norms <= clip))


def test_scaff_pd_clips_its_gradients_and_directions(task):
  """Noise 0, full batches (deterministic), every client: the released correction is c =
  sum_i lambda_i clip(g_i(x), C / sqrt(2)), each client's local steps use g - g_i(x) + c with
  its own unclipped g_i(x), and x moves by -tau sum_i lambda_i clip(du_i, C / sqrt(2)): the oracle
  below to 1e-10. The huge client's gradient and direction are both clipped, so its share of
  (c, the move of x / tau) is at most lambda_i C."""
  ds = _huge_client(task[0])
  model = task[1]
  alg = scaff_pd(model, local_steps=2)
  hp = {**make_hparams(alg), **{k: jnp.float64(v) for k, v in SCAFF_PD_HP.items()}}
  lr, tau = float(hp["client_lr"]), float(hp["tau"])
  params = jax.tree.map(lambda a: a.astype(jnp.float64), model.init(jax.random.PRNGKey(1)))
  key = jax.random.PRNGKey(0)
  train = ds.train
  client = lambda i: (train.x[i], train.y[i], train.num_examples[i])
  grads = [client_loss_and_grad(model, params, *client(i), key, None)[1] for i in range(N)]
  g = np.stack([_flat(t) for t in grads])
  clip = float(np.median(np.linalg.norm(g, axis=1))) * np.sqrt(2)
  half = clip / np.sqrt(2)
  palg = fd.private(alg, clip, 0.0, sampling="fixed", loss_bound=1e12)
  new, metrics = jax.jit(palg.round)(
    palg.init(params, train, jax.random.PRNGKey(2)), train, key, {**make_hparams(palg), **hp}
  )
  lam = np.asarray(new.lam)
  gn = np.linalg.norm(g, axis=1)
  g_sent = g * np.minimum(1.0, half / gn)[:, None]
  c_flat = lam @ g_sent
  unflat = ravel_pytree(params)[1]
  c = unflat(jnp.asarray(c_flat))
  dus = []
  for i in range(N):
    correct = lambda w, gr, gi=grads[i]: jax.tree.map(lambda a, b, cc: a - b + cc, gr, gi, c)
    u, _ = local_sgd(
      model, params, *client(i), key, num_steps=2, batch_size=None, lr=lr, grad_transform=correct
    )
    dus.append((_flat(params) - _flat(u)) / (lr * 2))
  du = np.stack(dus)
  dn = np.linalg.norm(du, axis=1)
  du_sent = du * np.minimum(1.0, half / dn)[:, None]
  want = _flat(params) - tau * lam @ du_sent
  np.testing.assert_allclose(_flat(new.params), want, rtol=1e-10, atol=1e-12)
  assert gn[3] > 10 * half and dn[3] > 10 * half  # the huge client: both vectors clipped
  assert 0 < np.sum(gn <= half) < N  # the clip splits the clients
  share = np.hypot(np.linalg.norm(g_sent[3]), np.linalg.norm(du_sent[3]))
  assert share <= clip * (1 + 1e-12)  # lambda_i times this in c and in the move of x / tau
  assert int(metrics["dp_unclipped"]) == int(np.sum((gn <= half) & (dn <= half)))


@pytest.mark.parametrize("sampling", ["fixed", "poisson"])
def test_scaffold_epochs_noise_std_is_z_c_over_the_expected_participants(task, sampling):
  """The same round with and without noise (same key, same participants): x and c differ by the
  noise on the two released sums, std z C / m on x and share * z C / m on c (m = s fixed, q n
  Poisson; share = s / n or q), within sampling error."""
  ds, model = task
  z, clip = 1.3, 0.2
  if sampling == "fixed":
    palg = fd.private(_scaffold_epochs(model, clients_per_round=4), clip, z, sampling="fixed")
    m, share = 4.0, 4 / N
  else:
    palg = fd.private(_scaffold_epochs(model), clip, z, rate=0.25)
    m, share = 0.25 * N, 0.25
  params = model.init(jax.random.PRNGKey(1))
  state = palg.init(params, ds.train, jax.random.PRNGKey(2))
  hp = make_hparams(palg)
  quiet = {**hp, "dp_noise": jnp.float64(0.0)}
  keys = jax.random.split(jax.random.PRNGKey(5), 500)

  def moved(k):
    noisy, plain = palg.round(state, ds.train, k, hp)[0], palg.round(state, ds.train, k, quiet)[0]
    sub = lambda a, b: jax.tree.map(jnp.subtract, a, b)
    return sub(noisy.params, plain.params), sub(noisy.control, plain.control)

  dx, dc = jax.jit(jax.vmap(moved))(keys)
  for noise, want in ((_flat(dx), z * clip / m), (_flat(dc), share * z * clip / m)):
    assert noise.size > 10_000
    assert abs(noise.mean()) < 4 * want / np.sqrt(noise.size)
    assert abs(noise.std() / want - 1) < 5 / np.sqrt(2 * noise.size)


@pytest.mark.parametrize("sampling", ["fixed", "poisson"])
def test_scaff_pd_noise_std_on_its_released_sums_and_losses(task, sampling):
  """One local full-batch step makes every participant's direction du_i = c~ (the released
  correction; below its clip here), so x moves by -tau (S c~ + xi) with S = sum_{i in S}
  lambda_i / q (1 with every client) and c~ = signal + zeta: with and without noise (same key)
  x differs by -tau (S zeta + xi), zeta and xi of std z C max(lambda) / q. The released losses
  (prev_losses: L_i / q for a participant, 0 for the others) carry noise of std z_l B / q."""
  ds, model = task
  alg = scaff_pd(model, local_steps=1)
  params = jax.tree.map(lambda a: a.astype(jnp.float64), model.init(jax.random.PRNGKey(1)))
  g = np.stack(
    [
      _flat(
        client_loss_and_grad(
          model, params, ds.train.x[i], ds.train.y[i], ds.train.num_examples[i], None, None
        )[1]
      )
      for i in range(N)
    ]
  )
  clip = 100 * float(np.linalg.norm(g, axis=1).max())  # gradients within it; noise well below
  z, zl, bound = 0.02, 0.7, 1e4
  q = 1.0 if sampling == "fixed" else 0.5
  kw = {"sampling": "fixed"} if sampling == "fixed" else {"rate": q}
  palg = fd.private(alg, clip, z, loss_bound=bound, loss_noise_multiplier=zl, **kw)
  state = palg.init(params, ds.train, jax.random.PRNGKey(2))
  hp = {**make_hparams(palg), **{k: jnp.float64(v) for k, v in SCAFF_PD_HP.items()}}
  exact_losses = {**hp, "dp_loss_noise": jnp.float64(0.0)}
  quiet = {**exact_losses, "dp_noise": jnp.float64(0.0)}
  keys = jax.random.split(jax.random.PRNGKey(6), 400)

  def one(k):
    noisy = palg.round(state, ds.train, k, exact_losses)  # noise on the sums only
    plain = palg.round(state, ds.train, k, quiet)[0]
    lossy = palg.round(state, ds.train, k, {**quiet, "dp_loss_noise": jnp.float64(zl)})[0]
    dx = jax.tree.map(jnp.subtract, noisy[0].params, plain.params)
    return dx, noisy[0].lam, plain.prev_losses, lossy.prev_losses - plain.prev_losses

  dx, lam, losses, loss_noise = jax.jit(jax.vmap(one))(keys)
  lam, losses, loss_noise = np.asarray(lam), np.asarray(losses), np.asarray(loss_noise)
  present = losses != 0  # participants report positive losses (regression)
  assert np.all(losses[present] > 0) and present.sum() > 0
  if sampling == "fixed":
    assert present.all()
  else:
    assert 0.3 < present.mean() < 0.7
  # each key's x noise in units of its own std: tau z C max(lambda) / q sqrt(S^2 + 1)
  weight = (lam * present).sum(axis=1) / q
  std = float(hp["tau"]) * z * clip * lam.max(axis=1) / q * np.sqrt(weight**2 + 1)
  units = (_flat(dx, len(keys)) / std[:, None]).ravel()
  assert abs(units.mean()) < 4 / np.sqrt(units.size)
  assert abs(units.std() - 1) < 5 / np.sqrt(2 * units.size)
  # the losses: noise z_l B on each participant's, scaled by 1 / q like the loss
  noise = loss_noise[present] * q / (zl * bound)
  assert np.all(loss_noise[~present] == 0)
  assert abs(noise.mean()) < 4 / np.sqrt(noise.size)
  assert abs(noise.std() - 1) < 5 / np.sqrt(2 * noise.size)


def test_reported_epsilon_is_dp_accounting_called_directly(task):
  """SCAFF-PD: its sums (z) and its losses (z_l) on the same Poisson participants, one Gaussian
  of multiplier (z^-2 + z_l^-2)^(-1/2); SCAFFOLD with local_epochs: its one joint release, z."""
  ds, model = task
  palg = fd.private(
    scaff_pd(model, local_steps=2, batch_size=8),
    1.0,
    1.2,
    rate=0.3,
    loss_bound=50.0,
    loss_noise_multiplier=2.0,
    delta=1e-6,
  )
  hist = fd.run(palg, ds, rounds=4, hparams=SCAFF_PD_HP)
  z = (1.2**-2 + 2.0**-2) ** -0.5
  want = _accountant_eps(dpa.PoissonSampledDpEvent(0.3, dpa.GaussianDpEvent(z)), 4, 1e-6)
  assert hist.evaluations[-1]["privacy"]["epsilon"] == pytest.approx(want, rel=1e-12)
  assert hist.evaluations[-1]["privacy"]["noise_multiplier"] == pytest.approx(z, rel=1e-12)
  assert hist.evaluations[-1]["privacy"]["rounds"] == 4
  pscaf = fd.private(_scaffold_epochs(model), 0.5, 1.1, rate=0.25)
  h2 = fd.run(pscaf, ds, rounds=3)
  want = _accountant_eps(dpa.PoissonSampledDpEvent(0.25, dpa.GaussianDpEvent(1.1)), 3, 1e-5)
  assert h2.evaluations[-1]["privacy"]["epsilon"] == pytest.approx(want, rel=1e-12)
  assert h2.evaluations[-1]["privacy"]["noise_multiplier"] == 1.1


def test_poisson_rounds_write_back_only_their_participants(task):
  """SCAFFOLD with local_epochs under Poisson: finite, the control-variate rows that change are
  the participants' (as many as dp_participants); SCAFF-PD: finite, the released losses of the
  participants only, dp_participants and dp_dropped reported."""
  ds, model = task
  palg = fd.private(_scaffold_epochs(model), 1.0, 0.5, rate=0.4)
  _, _, new, metrics, _ = _one_round(palg, ds, seed=3)
  changed = np.any(np.abs(_flat(new.client_controls, N)) > 0, axis=1)
  assert changed.sum() == int(metrics["dp_participants"]) > 0
  assert 0 < changed.sum() < N and float(metrics["dp_dropped"]) == 0
  assert np.isfinite(_flat(new.params)).all() and np.isfinite(_flat(new.control)).all()
  hist = fd.run(palg, ds, rounds=4)
  assert np.isfinite(_flat(hist.final_state.client_controls)).all()
  counts = np.asarray(hist.train_metrics["dp_participants"])
  assert np.all(counts <= poisson_capacity(N, 0.4)) and np.all(counts >= 0)

  ppd = fd.private(
    scaff_pd(model, local_steps=2, batch_size=8), 1.0, 0.5, rate=0.4, loss_bound=50.0
  )
  _, _, new, metrics, _ = _one_round(ppd, ds, hp=SCAFF_PD_HP, seed=3)
  reported = np.asarray(new.prev_losses) != 0
  assert reported.sum() == int(metrics["dp_participants"]) > 0 and reported.sum() < N
  assert np.isfinite(_flat(new.params)).all() and np.isfinite(np.asarray(new.lam)).all()
  assert "dp_dropped" in metrics and "dp_unclipped" in metrics
  assert float(metrics["dp_unclipped"]) <= float(metrics["dp_participants"])
  hist = fd.run(ppd, ds, rounds=4, hparams=SCAFF_PD_HP)
  assert np.isfinite(_flat(hist.final_state.params)).all()
  assert np.all(np.isfinite(np.asarray(hist.train_metrics["train_loss"])))
  assert math.isfinite(hist.evaluations[-1]["privacy"]["epsilon"])


def test_scaff_pd_needs_a_loss_bound(task):
  ds, model = task
  with pytest.raises(ValueError, match="loss_bound: 'scaff_pd' releases each participant's loss"):
    fd.private(scaff_pd(model), 1.0, 1.0, rate=0.5)
  with pytest.raises(ValueError, match="loss_bound must be a positive"):
    fd.private(scaff_pd(model), 1.0, 1.0, rate=0.5, loss_bound=0.0)
