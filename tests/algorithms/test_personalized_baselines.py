"""pFedMe, IFCA and Ditto (Dinh et al. 2020; Ghosh et al. 2020; Li et al. 2021) against plain
per-client numpy loops of the papers' pseudo-code (float64, the simulator's key schedule), plus
behaviour that can fail: pFedMe's large-lambda consensus, Ditto's lam = 0 (local training) and
large-lam limits, IFCA recovering two planted clusters; and bad settings."""

import jax
import numpy as np
import pytest

from fedjax_dro import models, run
from fedjax_dro.algorithms import make_hparams
from fedjax_dro.algorithms.ditto import ditto
from fedjax_dro.algorithms.fedavg import fedavg
from fedjax_dro.algorithms.ifca import ifca
from fedjax_dro.algorithms.local import local
from fedjax_dro.algorithms.pfedme import pfedme
from fedjax_dro.core.sampling import sample_clients
from fedjax_dro.data import from_client_arrays
from tests.helpers import (
  dataset,
  linreg,
  numpy_epoch_batches,
  numpy_linreg_grad,
  regression_clients,
)

L2 = 0.01
N, D, S = 6, 3, 3  # clients, features, clients per round
ROUNDS = 4  # 3 of 6 clients per round: every round leaves 3 personal rows unchanged


def _data():
  return regression_clients(n=N, d=D, seed=7, shift=0.5)


def _arrays(data):
  return np.asarray(data.x), np.asarray(data.y), np.asarray(data.num_examples)


def _grad(theta, x, y):
  gw, gb = numpy_linreg_grad(theta[:-1], theta[-1], x, y, L2)
  return np.append(gw, gb)


def _loss(theta, x, y):
  r = x @ theta[:-1] + theta[-1] - y
  return 0.5 * np.mean(r * r) + 0.5 * L2 * theta @ theta


def _batch(x, y, nex, i, step_key, B):
  if B is None:
    return x[i, : nex[i]], y[i, : nex[i]]
  rows = np.asarray(jax.random.randint(step_key, (B,), 0, nex[i]))
  return x[i, rows], y[i, rows]


def _rounds(seed, rounds, n, s, num_keys=None):
  """The simulator's key schedule: ``(participants, per-client keys)`` of every round; the keys
  are ``split(local_key, num_keys)`` (default ``s``: one per participant, in sampled order)."""
  _, _, run_key = jax.random.split(jax.random.PRNGKey(seed), 3)
  for r in range(rounds):
    sample_key, local_key = jax.random.split(jax.random.fold_in(run_key, r))
    idx = np.asarray(sample_clients(sample_key, n, s))
    yield idx, jax.random.split(local_key, num_keys or s)


def _flat(params):
  """``(w, b)`` params -> ``[..., d + 1]``."""
  return np.concatenate([np.asarray(params["w"]), np.asarray(params["b"])[..., None]], axis=-1)


# ----------------------------------------------------------------------------------------------
# The papers' pseudo-code in numpy
# ----------------------------------------------------------------------------------------------


def ref_pfedme(data, seed, R, K, B, hp, personal_updates="all", weighting="uniform", s=S):
  """pFedMe's Algorithm 1. ``"all"``: every client i runs the local loop with key
  ``split(local_key, N)[i]`` and the server aggregates the sampled S; ``"participants"``: only S
  run it, participant ``idx[k]`` with ``split(local_key, s)[k]``. Returns ``(w, theta, losses)``,
  ``losses[t]`` the mean over S of the first local minibatch loss at ``w^t``."""
  x, y, nex = _arrays(data)
  w, theta = np.zeros(D + 1), np.zeros((N, D + 1))
  lam, eta, plr, beta = hp["lam"], hp["client_lr"], hp["personal_lr"], hp["beta"]
  train_losses = []
  every = personal_updates == "all"
  for idx, client_keys in _rounds(seed, ROUNDS, N, s, num_keys=N if every else s):
    local_models, first_losses = {}, {}
    for k, i in enumerate(range(N) if every else idx):  # the server sends w^t
      wi, th = w.copy(), w.copy()
      for r, step_key in enumerate(jax.random.split(client_keys[k], R)):
        bx, by = _batch(x, y, nex, i, step_key, B)
        if r == 0:
          first_losses[i] = _loss(th, bx, by)
        for _ in range(K):  # approximately solve min f_i(th; D) + lam/2 ||th - w_i||^2
          th = th - plr * (_grad(th, bx, by) + lam * (th - wi))
        wi = wi - eta * lam * (wi - th)
      local_models[i] = wi
      theta[i] = th
    # the server aggregates the sampled clients S only
    p = np.array([float(nex[i]) if weighting == "num_examples" else 1.0 for i in idx])
    p = p / p.sum()
    w = (1 - beta) * w + beta * sum(pj * local_models[i] for pj, i in zip(p, idx))
    train_losses.append(np.mean([first_losses[i] for i in idx]))
  return w, theta, np.array(train_losses)


def ref_ditto(data, seed, J, B, hp, epochs=None):
  x, y, nex = _arrays(data)
  w, v = np.zeros(D + 1), np.zeros((N, D + 1))
  for idx, client_keys in _rounds(seed, ROUNDS, N, S):
    deltas, weights = [], []
    for k, i in enumerate(idx):
      wi = w.copy()
      if epochs is None:
        batches = (_batch(x, y, nex, i, sk, B) for sk in jax.random.split(client_keys[k], J))
      else:  # both passes on the same epochs' minibatches
        batches = numpy_epoch_batches(x[i], y[i], int(nex[i]), client_keys[k], B, epochs)
      for bx, by in batches:
        v[i] = v[i] - hp["personal_lr"] * (_grad(v[i], bx, by) + hp["lam"] * (v[i] - w))
        wi = wi - hp["client_lr"] * _grad(wi, bx, by)
      deltas.append(wi - w)
      weights.append(float(nex[i]))
    w = w + np.tensordot(np.array(weights) / np.sum(weights), np.array(deltas), 1)
  return w, v


def ref_ifca(data, seed, clusters, J, B, hp, weighting="uniform"):
  x, y, nex = _arrays(data)
  theta = clusters.copy()
  k = len(theta)

  def identity(i):  # line 6: argmin_j F_i(theta_j) on the whole local data
    return int(np.argmin([_loss(t, x[i, : nex[i]], y[i, : nex[i]]) for t in theta]))

  for idx, client_keys in _rounds(seed, ROUNDS, N, S):
    chosen, models, sizes = [], [], []
    for c, i in enumerate(idx):
      j = identity(i)
      u = theta[j].copy()
      for step_key in jax.random.split(client_keys[c], J):
        u = u - hp["client_lr"] * _grad(u, *_batch(x, y, nex, i, step_key, B))
      chosen.append(j)
      models.append(u)
      sizes.append(float(nex[i]) if weighting == "num_examples" else 1.0)
    for j in range(k):  # option II: average the models of each cluster's members
      members = [(m, p) for m, p, cj in zip(models, sizes, chosen) if cj == j]
      if members:
        total = sum(p for _, p in members)
        theta[j] = sum(p / total * m for m, p in members)
  return theta, np.array([identity(i) for i in range(N)])


# ----------------------------------------------------------------------------------------------
# Equality with the reference loops
# ----------------------------------------------------------------------------------------------

PFEDME_HP = {"lam": 5.0, "client_lr": 0.03, "personal_lr": 0.05, "beta": 1.5}
DITTO_HP = {"client_lr": 0.05, "personal_lr": 0.04, "lam": 0.7}


def _sizes_differ_among_participants(data, seed, s=S):
  """Some round samples clients of different sizes (so the weightings differ)."""
  nex = np.asarray(data.num_examples)
  return any(len(set(nex[idx].tolist())) > 1 for idx, _ in _rounds(seed, ROUNDS, N, s))


def _pfedme_run(data, seed, batch_size, **settings):
  settings = dict(dict(clients_per_round=S, backend="vmap"), **settings)
  alg = pfedme(linreg(D, l2=L2), local_steps=3, personal_steps=4, batch_size=batch_size, **settings)
  hist = run(alg, dataset(data), rounds=ROUNDS, seed=seed, hparams=PFEDME_HP, eval_every=ROUNDS)
  return alg, hist


@pytest.mark.parametrize(
  "batch_size, personal_updates, weighting",
  [
    (4, "all", "uniform"),
    (4, "all", "num_examples"),
    (4, "participants", "uniform"),
    (4, "participants", "num_examples"),
    (None, "all", "num_examples"),
    (None, "participants", "uniform"),
  ],
)
def test_pfedme_matches_reference_loop(batch_size, personal_updates, weighting):
  data, seed = _data(), 3
  assert _sizes_differ_among_participants(data, seed)
  alg, hist = _pfedme_run(
    data, seed, batch_size, personal_updates=personal_updates, weighting=weighting
  )
  assert alg.config["personal_updates"] == personal_updates
  assert alg.config["weighting"] == weighting
  w, theta, losses = ref_pfedme(
    data, seed, 3, 4, batch_size, PFEDME_HP, personal_updates, weighting
  )
  np.testing.assert_allclose(_flat(hist.final_state.params), w, rtol=0, atol=1e-10)
  np.testing.assert_allclose(_flat(alg.client_models(hist.final_state)), theta, rtol=0, atol=1e-10)
  np.testing.assert_allclose(hist.train_metrics["train_loss"], losses, rtol=0, atol=1e-10)


def test_pfedme_defaults_are_the_papers_algorithm():
  """The default is the paper's Algorithm 1 (every client updates theta_i, uniform average)."""
  alg = pfedme(linreg(D))
  assert alg.config["personal_updates"] == "all"
  assert alg.config["weighting"] == "uniform"
  data, seed = _data(), 3
  default, hist = _pfedme_run(data, seed, 4)
  w, theta, _ = ref_pfedme(data, seed, 3, 4, 4, PFEDME_HP)
  np.testing.assert_allclose(_flat(hist.final_state.params), w, rtol=0, atol=1e-10)
  np.testing.assert_allclose(
    _flat(default.client_models(hist.final_state)), theta, rtol=0, atol=1e-10
  )


@pytest.mark.parametrize("clients_per_round", [None, N])
def test_pfedme_all_equals_participants_under_full_participation(clients_per_round):
  data, seed = _data(), 6
  states, losses = [], []
  for mode in ("all", "participants"):
    _, hist = _pfedme_run(data, seed, 4, clients_per_round=clients_per_round, personal_updates=mode)
    states.append(hist.final_state)
    losses.append(hist.train_metrics["train_loss"])
  for a, b in zip(jax.tree.leaves(states[0]), jax.tree.leaves(states[1])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_array_equal(losses[0], losses[1])
  # and both are the paper's loop with every client sampled
  w, theta, _ = ref_pfedme(data, seed, 3, 4, 4, PFEDME_HP, "participants", s=N)
  np.testing.assert_allclose(_flat(states[0].params), w, rtol=0, atol=1e-10)
  np.testing.assert_allclose(_flat(states[0].personal), theta, rtol=0, atol=1e-10)


def test_pfedme_all_updates_every_personal_model_under_partial_participation():
  """One round, S of N sampled: under "all" every theta_i moves away from the initial model; under
  "participants" the N - S non-participants keep it, so the two modes differ there."""
  data, seed = _data(), 3
  model = linreg(D, l2=L2)
  out = {}
  for mode in ("all", "participants"):
    alg = pfedme(
      model,
      clients_per_round=S,
      local_steps=3,
      personal_steps=4,
      batch_size=4,
      backend="vmap",
      personal_updates=mode,
    )
    hist = run(alg, dataset(data), rounds=1, seed=seed, hparams=PFEDME_HP, eval_every=1)
    model_key, init_key, _ = jax.random.split(jax.random.PRNGKey(seed), 3)  # as `run` does
    initial = _flat(alg.init(model.init(model_key), data, init_key).personal)
    out[mode] = _flat(alg.client_models(hist.final_state)), initial
  idx, _ = next(_rounds(seed, 1, N, S))
  others = np.setdiff1d(np.arange(N), idx)
  assert len(others) == N - S > 0
  theta_all, initial = out["all"]
  theta_part, _ = out["participants"]
  assert np.all(np.abs(theta_all - initial).max(axis=1) > 1e-3)  # every client trained
  np.testing.assert_array_equal(theta_part[others], initial[others])  # non-participants kept
  assert np.all(np.abs(theta_part[idx] - initial[idx]).max(axis=1) > 1e-3)
  assert np.all(np.abs(theta_all[others] - theta_part[others]).max(axis=1) > 1e-3)


@pytest.mark.parametrize("batch_size,epochs", [(4, None), (None, None), (4, 2)])
def test_ditto_matches_reference_loop(batch_size, epochs):
  data, seed = _data(), 4
  work = {"local_steps": 3} if epochs is None else {"local_epochs": epochs}
  alg = ditto(linreg(D, l2=L2), clients_per_round=S, batch_size=batch_size, backend="vmap", **work)
  hist = run(alg, dataset(data), rounds=ROUNDS, seed=seed, hparams=DITTO_HP, eval_every=ROUNDS)
  w, v = ref_ditto(data, seed, 3, batch_size, DITTO_HP, epochs)
  np.testing.assert_allclose(_flat(hist.final_state.params), w, rtol=0, atol=1e-10)
  np.testing.assert_allclose(_flat(alg.client_models(hist.final_state)), v, rtol=0, atol=1e-10)


@pytest.mark.parametrize(
  "batch_size, weighting", [(4, "uniform"), (None, "uniform"), (4, "num_examples")]
)
def test_ifca_matches_reference_loop(batch_size, weighting):
  data, seed, hp = _data(), 5, {"client_lr": 0.05}
  assert _sizes_differ_among_participants(data, seed)
  model = linreg(D, l2=L2)
  alg = ifca(
    model,
    num_clusters=3,
    init_scale=1.0,
    clients_per_round=S,
    local_steps=3,
    batch_size=batch_size,
    backend="vmap",
    weighting=weighting,
  )
  assert alg.config["weighting"] == weighting
  hist = run(alg, dataset(data), rounds=ROUNDS, seed=seed, hparams=hp, eval_every=ROUNDS)
  # initial clusters: the state `run` builds (model key, init key, run key = split(seed, 3))
  model_key, init_key, _ = jax.random.split(jax.random.PRNGKey(seed), 3)
  initial = _flat(alg.init(model.init(model_key), data, init_key).clusters)
  theta, identities = ref_ifca(data, seed, initial, 3, batch_size, hp, weighting)
  state = hist.final_state
  np.testing.assert_allclose(_flat(state.clusters), theta, rtol=0, atol=1e-10)
  np.testing.assert_array_equal(np.asarray(state.assignment), identities)
  np.testing.assert_allclose(_flat(alg.client_models(state)), theta[identities], rtol=0, atol=1e-10)
  assert len(set(identities.tolist())) > 1  # the test exercises more than one cluster


# ----------------------------------------------------------------------------------------------
# Behaviour
# ----------------------------------------------------------------------------------------------


def test_pfedme_large_lambda_is_fedavg_consensus():
  """lambda -> inf: theta_i -> w_i - grad f_i / lambda, so the local step w_i - eta lambda (w_i -
  theta_i) -> w_i - eta grad f_i (FedAvg's) and the personal models collapse onto the global one;
  a small lambda keeps them apart. One local step (R = 1), so the local copies w_i do not drift
  from the global model within a round."""
  data = regression_clients(n=N, d=D, seed=8, shift=1.0)
  model = linreg(D, l2=L2)
  settings = dict(local_steps=1, batch_size=None, backend="vmap")
  rounds = 40
  fed = run(
    fedavg(model, weighting="uniform", **settings),
    dataset(data),
    rounds=rounds,
    hparams={"client_lr": 0.05},
    eval_every=rounds,
  )
  target = _flat(fed.final_state.params)

  def gaps(lam):
    hp = {"lam": lam, "client_lr": 0.05, "personal_lr": 0.5 / (lam + 20.0), "beta": 1.0}
    alg = pfedme(model, personal_steps=10, **settings)
    hist = run(alg, dataset(data), rounds=rounds, hparams=hp, eval_every=rounds)
    w = _flat(hist.final_state.params)
    personal = np.abs(_flat(alg.client_models(hist.final_state)) - w).max()
    return np.abs(w - target).max() / np.abs(target).max(), personal

  global_gap, personal_gap = gaps(2000.0)
  small_global_gap, small_personal_gap = gaps(0.5)
  assert global_gap < 2e-2, global_gap
  # personal_gap is ~ max_i |grad f_i| / lambda plus the last round's global step
  assert personal_gap < 0.05 * small_personal_gap, (personal_gap, small_personal_gap)
  assert small_global_gap > 10 * global_gap, (small_global_gap, global_gap)


def test_ditto_lam_zero_is_local_training_and_large_lam_is_the_global_model():
  data = _data()
  model = linreg(D, l2=L2)
  settings = dict(clients_per_round=S, local_steps=4, batch_size=4, backend="vmap")
  hp = {"client_lr": 0.05, "personal_lr": 0.05}
  rounds = 6
  h0 = run(
    ditto(model, **settings),
    dataset(data),
    rounds=rounds,
    seed=2,
    hparams={**hp, "lam": 0.0},
    eval_every=rounds,
  )
  hl = run(
    local(model, **settings),
    dataset(data),
    rounds=rounds,
    seed=2,
    hparams={"client_lr": 0.05},
    eval_every=rounds,
  )
  np.testing.assert_allclose(
    _flat(h0.final_state.personal), _flat(hl.final_state.client_params), rtol=0, atol=1e-12
  )

  def spread(lam, personal_lr):  # largest distance of a personal model from the global model
    full = dict(settings, clients_per_round=None, batch_size=None, personal_steps=20)
    hp = {"client_lr": 0.05, "personal_lr": personal_lr, "lam": lam}
    # 200 rounds: FedAvg's global model has settled, so w^T ~ the w^t the last round pulled to
    hist = run(ditto(model, **full), dataset(data), rounds=200, hparams=hp, eval_every=200)
    state = hist.final_state
    return np.abs(_flat(state.personal) - _flat(state.params)).max()

  # v_i -> w - grad f_i(v_i) / lam (0.027 against 2.24 with lam = 0; full batches, all clients:
  # deterministic); personal_lr * lam = 1 keeps the personal steps stable
  assert spread(100.0, 0.01) < 0.05 * spread(0.0, 0.05)


def _two_groups(per_group=5, m=40, seed=0):
  """Two planted groups of linear-regression clients with far-apart true models."""
  rng = np.random.default_rng(seed)
  truths = [(np.array([3.0, -2.0, 1.0]), 2.0), (np.array([-2.0, 1.0, 3.0]), -2.0)]
  xs, ys, group = [], [], []
  for g, (w, b) in enumerate(truths):
    for _ in range(per_group):
      x = rng.normal(size=(m, D))
      xs.append(x)
      ys.append(x @ w + b + 0.1 * rng.normal(size=m))
      group.append(g)
  return from_client_arrays(xs, ys, dtype=np.float64), np.array(group), truths


@pytest.mark.parametrize("seed", [0, 1])
def test_ifca_recovers_planted_clusters(seed):
  data, group, truths = _two_groups(seed=seed)
  alg = ifca(
    linreg(D), num_clusters=2, clients_per_round=6, local_steps=5, batch_size=8, backend="vmap"
  )
  hist = run(alg, dataset(data), rounds=30, seed=seed, hparams={"client_lr": 0.05}, eval_every=30)
  state = hist.final_state
  assignment = np.asarray(state.assignment)
  # the same partition as the planted groups (up to relabelling)
  assert len(set(assignment.tolist())) == 2
  for g in (0, 1):
    assert len(set(assignment[group == g].tolist())) == 1
  clusters = _flat(state.clusters)
  for g, (w, b) in enumerate(truths):
    j = assignment[group == g][0]
    np.testing.assert_allclose(clusters[j], np.append(w, b), atol=0.1)


def test_ifca_initial_clusters():
  data = _data()
  key = jax.random.PRNGKey(0)
  # zero-initialised linear regression: every draw is the same, so the clusters are perturbed
  zero = linreg(D)
  params = zero.init(key)
  clusters = _flat(ifca(zero, num_clusters=4, init_scale=0.5).init(params, data, key).clusters)
  assert len({tuple(row) for row in clusters}) == 4
  assert 0.2 < clusters.std() < 1.0
  # a random init is used as drawn: cluster 0 is `params`, the zero bias is not perturbed
  random = models.linear_regression(D, init_scale=1.0)
  params = random.init(jax.random.PRNGKey(1))
  clusters = _flat(ifca(random, num_clusters=3).init(params, data, key).clusters)
  np.testing.assert_array_equal(clusters[0], _flat(params))
  np.testing.assert_array_equal(clusters[:, -1], 0.0)
  assert len({tuple(row) for row in clusters}) == 3
  # one cluster: the given params, and IFCA is FedAvg with unweighted averaging
  one = ifca(zero, num_clusters=1, local_steps=3, batch_size=4, backend="vmap")
  np.testing.assert_array_equal(_flat(one.init(params, data, key).clusters)[0], _flat(params))
  fed = fedavg(zero, weighting="uniform", local_steps=3, batch_size=4, backend="vmap")
  h1 = run(one, dataset(data), rounds=3, seed=1, eval_every=3)
  h2 = run(fed, dataset(data), rounds=3, seed=1, eval_every=3)
  np.testing.assert_allclose(
    _flat(h1.final_state.clusters)[0], _flat(h2.final_state.params), rtol=0, atol=1e-12
  )


# ----------------------------------------------------------------------------------------------
# Bad inputs
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "factory, kwargs, name",
  [
    (ifca, {"num_clusters": 0}, "num_clusters"),
    (ifca, {"num_clusters": -2}, "num_clusters"),
    (ifca, {"num_clusters": 2.0}, "num_clusters"),
    (ifca, {"num_clusters": True}, "num_clusters"),
    (ifca, {"init_scale": -0.1}, "init_scale"),
    (ifca, {"init_scale": float("nan")}, "init_scale"),
    (ifca, {"local_steps": 0}, "local_steps"),
    (pfedme, {"personal_steps": 0}, "personal_steps"),
    (pfedme, {"personal_steps": 1.5}, "personal_steps"),
    (pfedme, {"batch_size": 0}, "batch_size"),
    (pfedme, {"personal_updates": "some"}, "personal_updates"),
    (pfedme, {"personal_updates": "All"}, "personal_updates"),
    (pfedme, {"personal_updates": ""}, "personal_updates"),
    (pfedme, {"weighting": "samples"}, "weighting"),
    (pfedme, {"weighting": None}, "weighting"),
    (ifca, {"weighting": "examples"}, "weighting"),
    (ditto, {"personal_steps": 0}, "personal_steps"),
    (ditto, {"clients_per_round": 0}, "clients_per_round"),
  ],
)
def test_bad_settings_raise(factory, kwargs, name):
  with pytest.raises(ValueError, match=name):
    factory(linreg(D), **kwargs)


@pytest.mark.parametrize("bad", [None, 1, True, ("all",), ["participants"]])
def test_pfedme_personal_updates_must_be_a_string(bad):
  with pytest.raises(TypeError, match="personal_updates"):
    pfedme(linreg(D), personal_updates=bad)


@pytest.mark.parametrize(
  "factory, hparams, name",
  [
    (pfedme, {"lam": -1.0}, "lam"),
    (pfedme, {"lam": 0.0}, "lam"),
    (pfedme, {"personal_lr": 0.0}, "personal_lr"),
    (pfedme, {"beta": -0.5}, "beta"),
    (ditto, {"lam": -0.1}, "lam"),
    (ditto, {"personal_lr": -1.0}, "personal_lr"),
    (ifca, {"client_lr": 0.0}, "client_lr"),
  ],
)
def test_bad_hparams_raise(factory, hparams, name):
  with pytest.raises(ValueError, match=f"'{name}'"):
    make_hparams(factory(linreg(D)), hparams)
  if factory is ditto:
    make_hparams(factory(linreg(D)), {"lam": 0.0})  # lam = 0 (local training) is allowed
