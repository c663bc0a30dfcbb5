"""fd.private for the algorithms whose participants carry more than a model (FGDRO's threshold
and estimators, pFedMe's personal models, IFCA's cluster choice) and for FedSGD: the plain
algorithm with no noise and a huge clip, each participant's release clipped as one vector
(against the plain algorithm's own one-client round), the noise's standard deviation, state kept
on the clients written back only for the drawn, and IFCA's noised cluster sums and counts."""

import dataclasses
import math

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting import rdp

import fedjax_dro as fd
from fedjax_dro.algorithms import get_algorithm
from fedjax_dro.algorithms.base import make_hparams
from fedjax_dro.core.privacy import GaussianRelease, Privacy, poisson_capacity
from tests.helpers import dataset, linreg, regression_clients

N = 12


@pytest.fixture(scope="module")
def task():
  """Heterogeneous float64 linear-regression clients (21 parameters)."""
  return dataset(regression_clients(n=N, d=20, seed=0)), linreg(20)


def _make(name, model, **kw):
  return get_algorithm(name).factory(model, **kw)


CASES = {
  "fedsgd": dict(clients_per_round=5, batch_size=8, weighting="uniform"),
  "fgdro_cvar": dict(clients_per_round=5, local_steps=3, batch_size=8),
  "fgdro_kl": dict(clients_per_round=5, local_steps=3, batch_size=8),
  "fgdro_kl_adam": dict(clients_per_round=5, local_steps=3, batch_size=8),
  "pfedme": dict(clients_per_round=5, local_steps=2, batch_size=8, personal_steps=2),
  "pfedme-participants": dict(
    clients_per_round=5, local_steps=2, batch_size=8, personal_steps=2,
    personal_updates="participants",
  ),
  "ifca": dict(clients_per_round=5, local_steps=2, batch_size=8, num_clusters=3),
}  # fmt: skip


def _case(name, model, **over):
  return _make(name.split("-")[0], model, **{**CASES[name], **over})


def _leaves_diff(a, b):
  return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_noise_and_a_huge_clip_is_the_plain_algorithm(task, name):
  """Fixed participation, noise 0, clip 1e12: the plain run (three rounds) to 1e-10, state kept
  on the clients (u, theta, the cluster choices) included."""
  ds, model = task
  alg = _case(name, model)
  # FGDRO-KL: lambda 10 keeps v's change within a round (exp(u / lambda)) inside the clip
  hp = {"lam": 10.0} if name.startswith("fgdro_kl") else None
  plain = fd.run(alg, ds, rounds=3, seed=4, hparams=hp)
  priv = fd.run(fd.private(alg, 1e12, 0.0, sampling="fixed"), ds, rounds=3, seed=4, hparams=hp)
  assert _leaves_diff(plain.final_state, priv.final_state) < 1e-10
  moved = _leaves_diff(plain.final_state, alg.init(*_start(alg, ds)))
  assert moved > 1e-4  # the runs did something


def _start(alg, ds):
  params = jax.tree.map(lambda a: a.astype(jnp.float64), alg.model.init(jax.random.PRNGKey(1)))
  return params, ds.train, jax.random.PRNGKey(2)


def _one_client(ds, client):
  """A federation of client ``client`` alone."""
  return dataclasses.replace(ds, train=ds.train.take_clients(jnp.array([client])))


def _released(name, old, new):
  """What a participant of ``name`` releases, as one flat vector, from the server states before
  and after a one-client round (the plain round: the client's own update)."""
  flat = lambda tree: np.concatenate([np.ravel(np.asarray(a)) for a in jax.tree.leaves(tree)])
  if name == "fgdro_cvar":
    return np.concatenate([flat(new.params) - flat(old.params), [new.threshold - old.threshold]])
  if name.startswith("fgdro_kl"):
    parts = [flat(new.params) - flat(old.params), flat(new.momentum) - flat(old.momentum)]
    if name == "fgdro_kl_adam":
      parts.append(flat(new.second_moment) - flat(old.second_moment))
    return np.concatenate([*parts, [math.expm1(float(new.log_v - old.log_v))]])
  if name == "ifca":
    return flat(new.clusters) - flat(old.clusters)  # one cluster moved: its delta
  return flat(new.params) - flat(old.params)  # fedsgd (lr 1), pfedme (beta 1)


@pytest.mark.parametrize("name", ["fedsgd", "fgdro_cvar", "fgdro_kl", "fgdro_kl_adam", "ifca"])
def test_a_participant_release_is_clipped_as_one_vector(task, name):
  """One client, noise 0, a clip of a tenth of its update's norm: the private round releases
  exactly the plain round's release scaled into the ball of radius C (the threshold, the
  moments and v's relative change clipped together with the model), so the server state moves
  by at most C."""
  ds, model = task
  one = _one_client(ds, 3)
  over = dict(clients_per_round=None)
  if name == "fedsgd":
    over["batch_size"] = None
  alg = _case(name, model, **over)
  hp = {"lr": 1.0} if name == "fedsgd" else {"lam": 10.0} if name.startswith("fgdro_kl") else {}
  params, train, ikey = _start(alg, one)
  state = alg.init(params, train, ikey)
  key = jax.random.PRNGKey(9)
  plain, _ = jax.jit(alg.round)(state, train, key, make_hparams(alg, hp))
  full = _released(name, state, plain)
  clip = 0.1 * float(np.linalg.norm(full))
  palg = fd.private(alg, clip, 0.0, sampling="fixed")
  new, metrics = jax.jit(palg.round)(state, train, key, make_hparams(palg, hp))
  got = _released(name, state, new)
  np.testing.assert_allclose(got, full * clip / np.linalg.norm(full), rtol=1e-9, atol=1e-12)
  assert np.linalg.norm(got) <= clip * (1 + 1e-9)
  assert float(metrics["dp_unclipped"]) == 0.0


def test_fgdro_cvar_noise_has_std_z_c_over_the_expected_participants(task):
  """No local move (both step sizes 0): the model and the threshold move by the noise alone,
  of standard deviation z C / m (m = q n under Poisson)."""
  ds, model = task
  z, clip, q = 1.3, 0.4, 0.5
  palg = fd.private(_case("fgdro_cvar", model, clients_per_round=None), clip, z, rate=q)
  params, train, ikey = _start(palg, ds)
  state = palg.init(params, train, ikey)
  hp = {**make_hparams(palg), "client_lr": jnp.float64(0.0), "threshold_lr": jnp.float64(0.0)}
  keys = jax.random.split(jax.random.PRNGKey(5), 500)
  moved = jax.jit(jax.vmap(lambda k: palg.round(state, train, k, hp)[0]))(keys)
  noise = np.concatenate(
    [np.asarray(moved.threshold)[:, None]]
    + [np.asarray(b).reshape(500, -1) - np.ravel(a) for a, b in zip(params.values(), [
      moved.params[k] for k in params])],
    axis=1,
  )  # fmt: skip
  want = z * clip / (q * N)
  assert abs(noise.mean()) < 4 * want / np.sqrt(noise.size)
  assert abs(noise.std() / want - 1) < 5 / np.sqrt(2 * noise.size)


@pytest.mark.parametrize("name", ["fgdro_cvar", "pfedme-participants", "ifca"])
def test_a_poisson_run_keeps_client_state_for_the_drawn_only(task, name):
  """Poisson participation: finite, at most the capacity, the state kept on the clients (u,
  theta) changed in exactly the rows of the clients drawn, epsilon reported."""
  ds, model = task
  palg = fd.private(_case(name, model, clients_per_round=None), 0.5, 0.7, rate=0.4)
  params, train, ikey = _start(palg, ds)
  state = palg.init(params, train, ikey)
  new, metrics = jax.jit(palg.round)(state, train, jax.random.PRNGKey(3), make_hparams(palg))
  assert 0 < float(metrics["dp_participants"]) <= poisson_capacity(N, 0.4)
  assert np.isfinite(float(metrics["train_loss"]))
  assert np.all(np.isfinite(np.concatenate([np.ravel(a) for a in jax.tree.leaves(new)])))
  if name != "ifca":
    rows = new.loss_estimates - state.loss_estimates if name == "fgdro_cvar" else None
    if rows is None:
      rows = jax.tree.leaves(new.personal)[0] - jax.tree.leaves(state.personal)[0]
    changed = np.any(np.abs(np.asarray(rows)).reshape(N, -1) > 0, axis=1)
    assert changed.sum() == int(metrics["dp_participants"])
  hist = fd.run(palg, ds, rounds=3)
  assert hist.evaluations[-1]["privacy"]["rounds"] == 3
  assert np.all(np.isfinite(np.asarray(hist.train_metrics["train_loss"])))


def test_pfedme_all_trains_every_client_and_releases_the_drawn():
  """personal_updates='all' under Poisson: every client's theta moves (it trains on the client),
  the global model moves by the noised clipped mean of the drawn clients only."""
  ds = dataset(regression_clients(n=N, d=20, seed=0))
  palg = fd.private(_case("pfedme", linreg(20), clients_per_round=None), 1e12, 0.0, rate=0.3)
  params, train, ikey = _start(palg, ds)
  state = palg.init(params, train, ikey)
  new, metrics = jax.jit(palg.round)(state, train, jax.random.PRNGKey(3), make_hparams(palg))
  theta = np.asarray(jax.tree.leaves(new.personal)[0] - jax.tree.leaves(state.personal)[0])
  assert np.all(np.any(np.abs(theta.reshape(N, -1)) > 0, axis=1))
  assert 0 < float(metrics["dp_participants"]) < N


def test_ifca_cluster_sums_and_counts_carry_their_noise():
  """group_sums: the sums of the clipped updates by group with noise std z C each, the
  counts with noise std z_c each; exact with no noise (empty slots left out)."""
  z, clip, zc = 0.6, 2.0, 1.7
  deltas = {"w": jnp.arange(12.0).reshape(4, 3)}
  groups = jax.nn.one_hot(jnp.array([0, 2, 0, 1]), 3)
  present = jnp.array([True, True, False, True])
  exact = GaussianRelease(Privacy("fixed", None, 1e-5), clip, 0.0, count_noise=0.0)
  sums, counts = exact.group_sums(deltas, groups, present, jax.random.PRNGKey(0))
  np.testing.assert_array_equal(sums["w"], [[0, 1, 2], [9, 10, 11], [3, 4, 5]])
  np.testing.assert_array_equal(counts, [1, 1, 1])

  noisy = GaussianRelease(Privacy("fixed", None, 1e-5), clip, z, count_noise=zc)

  def draw(k):
    return noisy.group_sums(deltas, groups, present, k)

  sums_n, counts_n = jax.vmap(draw)(jax.random.split(jax.random.PRNGKey(1), 4000))
  noise = np.asarray(sums_n["w"]) - np.asarray(sums["w"])[None]
  assert abs(noise.std() / (z * clip) - 1) < 5 / np.sqrt(2 * noise.size)
  cnoise = np.asarray(counts_n) - 1.0
  assert abs(cnoise.std() / zc - 1) < 5 / np.sqrt(2 * cnoise.size)
  assert abs(np.corrcoef(noise[:, 0, 0], cnoise[:, 0])[0, 1]) < 0.1  # independent streams


def test_ifca_epsilon_composes_the_counts_with_the_updates(task):
  """IFCA's sums (z) and counts (z_c) on the same participants: dp-accounting's epsilon of one
  Gaussian of multiplier (z^-2 + z_c^-2)^(-1/2) per round."""
  ds, model = task
  z, zc = 1.2, 2.5
  palg = fd.private(_case("ifca", model), 1.0, z, rate=0.3, cluster_count_noise=zc)
  hist = fd.run(palg, ds, rounds=4)
  acc = rdp.RdpAccountant()
  zeff = (z**-2 + zc**-2) ** -0.5
  acc.compose(dpa.PoissonSampledDpEvent(0.3, dpa.GaussianDpEvent(zeff)), 4)
  assert hist.evaluations[-1]["privacy"]["epsilon"] == pytest.approx(
    acc.get_epsilon(1e-5), rel=1e-12
  )
  assert hist.evaluations[-1]["privacy"]["noise_multiplier"] == pytest.approx(zeff)


def test_count_noise_is_ifcas_alone(task):
  ds, model = task
  fedavg = _make("fedavg", model, weighting="uniform")
  with pytest.raises(ValueError, match="cluster_count_noise: 'fedavg' releases no participant"):
    fd.private(fedavg, 1.0, 1.0, rate=0.5, cluster_count_noise=1.0)
  with pytest.raises(ValueError, match="cluster_count_noise must be a non-negative"):
    fd.private(_case("ifca", model), 1.0, 1.0, rate=0.5, cluster_count_noise=-1.0)
  with pytest.raises(ValueError, match="weighting='uniform'"):
    fd.private(_make("fedsgd", model), 1.0, 1.0, rate=0.5)


ADAPTIVE = {
  "fedsgd": lambda m: _case("fedsgd", m),
  "fgdro_kl": lambda m: _case("fgdro_kl", m),
  "pfedme-all": lambda m: _case("pfedme", m),
  "ifca": lambda m: _case("ifca", m),
  "qffl": lambda m: _make("qffl", m, clients_per_round=5, local_steps=2, batch_size=8),
  "drfa": lambda m: _make("drfa", m, clients_per_round=5, local_steps=2, batch_size=8),
  "scaff_pd": lambda m: _make("scaff_pd", m, local_steps=2, batch_size=8),
  "scaffold-epochs": lambda m: _make(
    "scaffold", m, clients_per_round=5, local_epochs=1, batch_size=8, weighting="uniform"
  ),
}


@pytest.mark.parametrize("name", sorted(ADAPTIVE))
def test_adaptive_clipping_counts_what_each_private_form_releases(task, name):
  """A clip of 1e-9 clips every participant's first-round release: with no count noise the
  count of updates within it is 0, so the clip grows by exactly exp(eta gamma) after the round
  (fixed sampling); the private form records its flags where adaptive clipping reads them.
  (Later rounds may count some: SCAFFOLD's corrected gradient of a client drawn again, with the
  model all but unmoved, is about the tiny server control variate.)"""
  ds, model = task
  kw = {"loss_bound": 2.0} if name in ("qffl", "drfa", "scaff_pd") else {}
  palg = fd.private(
    ADAPTIVE[name](model),
    1e-9,
    0.0,
    sampling="fixed",
    adaptive_quantile=0.9,
    adaptive_lr=0.3,
    count_noise=0.0,
    **kw,
  )
  hist = fd.run(palg, ds, rounds=2)
  clip = np.asarray(hist.train_metrics["dp_clip"])
  assert float(hist.train_metrics["dp_unclipped"][0]) == 0
  assert clip[1] / clip[0] == pytest.approx(math.exp(0.3 * 0.9), rel=1e-9)
