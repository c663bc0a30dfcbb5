"""Algorithm costs (``Algorithm.cost``, :mod:`fedjax_dro.core.costs`) against counts taken in the
per-client reference loops of the other tests: their gradient calls (the gradient function
wrapped), the uploads their server aggregates (the aggregated lists: one message per entry, its
floats) and the longest chain of gradient calls of one client in a round. The comparisons are
exact equalities, and one test shows that they fail on a wrong count. Plus: every registered
algorithm states a finite, non-negative cost."""

import inspect
import math

import jax
import numpy as np
import pytest

from fedjax_dro import algorithms as A, run
from fedjax_dro.core.costs import COST_FIELDS, RoundCost, parameter_count
from fedjax_dro.core.sampling import sample_clients
from tests.algorithms import test_personalized_baselines as personal_refs, test_reference as refs
from tests.helpers import dataset, linreg, regression_clients


class Tally:
  """What a reference loop did: gradient calls, uploads (messages and floats) and, per round,
  the gradient calls of each client (``sequential_steps`` is the sum over rounds of the longest)."""

  def __init__(self):
    self.grads = self.messages = self.floats = 0
    self.rounds = []  # per round: the gradient calls of each client

  def new_round(self):
    self.rounds.append([])

  def new_client(self):
    self.rounds[-1].append(0)

  def grad(self):
    self.grads += 1
    self.rounds[-1][-1] += 1

  def upload(self, messages, floats):
    self.messages += messages
    self.floats += floats

  def counts(self, chains_per_client=1) -> RoundCost:
    """``chains_per_client``: independent chains a client's gradient calls alternate between
    (Ditto's global and personal passes), whose longest is one chain's length."""
    longest = sum(max(clients, default=0) for clients in self.rounds)
    return RoundCost(self.messages, self.floats, self.grads, longest / chains_per_client)


def assert_counts(cost: RoundCost, counted: RoundCost):
  """Exact equality of every field (counts are whole numbers, exactly represented)."""
  for field in COST_FIELDS:
    assert getattr(cost, field) == getattr(counted, field), (field, cost, counted)


class CountingNumpy:
  """``numpy`` for a reference module, counting what its server aggregates with ``tensordot``:
  the stacked deltas, one message each."""

  def __init__(self, tally):
    self._tally = tally

  def __getattr__(self, name):
    return getattr(np, name)

  def tensordot(self, weights, stacked, axes):
    self._tally.upload(len(stacked), np.size(stacked))
    return np.tensordot(weights, stacked, axes)


class CountingNumpyWithScalars(CountingNumpy):
  """... and the floats of the same messages that ``_reference`` aggregates with ``dot`` (the
  intercepts' deltas) and ``mean`` (SCAFFOLD's control variates); it aggregates nothing else
  with them."""

  def dot(self, weights, values):
    self._tally.upload(0, np.size(values))
    return np.dot(weights, values)

  def mean(self, values, *args, **kwargs):
    self._tally.upload(0, np.size(values))
    return np.mean(values, *args, **kwargs)


def counting(fn, tally_step):
  def wrapped(*args, **kwargs):
    tally_step()
    return fn(*args, **kwargs)

  return wrapped


# ----------------------------------------------------------------------------------------------
# FedAvg, FedProx, SCAFFOLD, FedSGD: tests/algorithms/test_reference.py::_reference
# ----------------------------------------------------------------------------------------------


def _count_reference(monkeypatch, name, data, rounds, s, J, B, hp):
  tally = Tally()
  # sample_clients starts a round, step_rows a client (once per client with a batch_size)
  monkeypatch.setattr(refs, "sample_clients", counting(refs.sample_clients, tally.new_round))
  monkeypatch.setattr(refs, "step_rows", counting(refs.step_rows, tally.new_client))
  monkeypatch.setattr(refs, "numpy_linreg_grad", counting(refs.numpy_linreg_grad, tally.grad))
  monkeypatch.setattr(refs, "np", CountingNumpyWithScalars(tally))
  refs._reference(name, data, rounds, 3, s, J, B, hp)
  return tally.counts()


FEDAVG_HP = {"client_lr": 0.05, "server_lr": 0.9, "mu": 0.3}


@pytest.mark.parametrize(
  "name, s",
  [("fedavg", 3), ("fedavg", 7), ("fedprox", 3), ("scaffold", 3), ("scaffold", 7), ("fedsgd", 3)],
)
def test_fedavg_family_costs_are_the_reference_loops_counts(monkeypatch, name, s):
  data, model, rounds, B = regression_clients(n=7, d=3, seed=1), linreg(3), 6, 4
  if name == "fedsgd":  # one local step of size 1 per client, averaged (tests/.../test_reference)
    alg = A.fedsgd(model, clients_per_round=s, batch_size=B)
    counted = _count_reference(monkeypatch, "fedavg", data, rounds, s, 1, B, FEDAVG_HP)
  else:
    factory = A.get_algorithm(name).factory
    alg = factory(model, clients_per_round=s, local_steps=4, batch_size=B)
    counted = _count_reference(monkeypatch, name, data, rounds, s, 4, B, FEDAVG_HP)
  P = parameter_count(model)
  assert P == 4 and counted.uploading_clients == rounds * s
  assert counted.upload_floats == rounds * s * P * (2 if name == "scaffold" else 1)
  assert_counts(alg.cost(data).spent(rounds), counted)
  assert_counts(alg.cost(data).round.scaled(rounds), counted)  # no setup


def test_the_count_comparison_can_fail(monkeypatch):
  """SCAFFOLD's loop uploads control variates too: FedAvg's cost does not match its counts, and a
  count one off is caught."""
  data, model = regression_clients(n=7, d=3, seed=1), linreg(3)
  counted = _count_reference(monkeypatch, "scaffold", data, 6, 3, 4, 4, FEDAVG_HP)
  fedavg = A.fedavg(model, clients_per_round=3, local_steps=4, batch_size=4).cost(data).spent(6)
  with pytest.raises(AssertionError, match="upload_floats"):
    assert_counts(fedavg, counted)
  scaffold = A.scaffold(model, clients_per_round=3, local_steps=4, batch_size=4).cost(data)
  assert_counts(scaffold.spent(6), counted)
  for field in COST_FIELDS:
    with pytest.raises(AssertionError, match=field):
      assert_counts(scaffold.spent(6)._replace(**{field: getattr(counted, field) + 1}), counted)


# ----------------------------------------------------------------------------------------------
# pFedMe, Ditto, IFCA: tests/algorithms/test_personalized_baselines.py::ref_pfedme, ref_ditto,
# ref_ifca
# ----------------------------------------------------------------------------------------------


class ClientKeys:
  """A round's per-client keys; reading client ``k``'s key starts that client (every reference
  loop reads it once, as its local work begins)."""

  def __init__(self, keys, tally):
    self._keys, self._tally = keys, tally

  def __getitem__(self, k):
    self._tally.new_client()
    return self._keys[k]


def _count_personal(monkeypatch, reference, *args, **kwargs):
  """Runs ``reference`` with its rounds, gradients and server sums counted. The server sums a
  list of arrays (``sum(p_i * w_i)``): every array term is one uploaded model."""
  tally, rounds = Tally(), personal_refs._rounds

  def counted_rounds(*a, **k):
    for idx, keys in rounds(*a, **k):
      tally.new_round()
      yield idx, ClientKeys(keys, tally)

  def server_sum(terms):
    terms = list(terms)
    for term in terms:
      if isinstance(term, np.ndarray):
        tally.upload(1, term.size)
    return sum(terms)

  monkeypatch.setattr(personal_refs, "_rounds", counted_rounds)
  monkeypatch.setattr(personal_refs, "_grad", counting(personal_refs._grad, tally.grad))
  monkeypatch.setattr(personal_refs, "sum", server_sum, raising=False)
  monkeypatch.setattr(personal_refs, "np", CountingNumpy(tally))
  reference(*args, **kwargs)
  return tally


N, S, ROUNDS = personal_refs.N, personal_refs.S, personal_refs.ROUNDS


@pytest.mark.parametrize("personal_updates, s", [("all", S), ("participants", S), ("all", N)])
def test_pfedme_cost_is_the_reference_loops_counts(monkeypatch, personal_updates, s):
  """``"all"`` under partial participation: every client runs its R K gradients, the s sampled
  upload."""
  data, model, R, K, B = personal_refs._data(), linreg(personal_refs.D), 3, 4, 4
  hp = personal_refs.PFEDME_HP
  tally = _count_personal(
    monkeypatch, personal_refs.ref_pfedme, data, 3, R, K, B, hp, personal_updates, s=s
  )
  trained = N if personal_updates == "all" else s
  assert tally.grads == ROUNDS * trained * R * K and tally.messages == ROUNDS * s
  alg = A.pfedme(
    model,
    clients_per_round=s,
    local_steps=R,
    personal_steps=K,
    batch_size=B,
    personal_updates=personal_updates,
  )
  assert_counts(alg.cost(data).spent(ROUNDS), tally.counts())


@pytest.mark.parametrize("epochs", [None, 2])
def test_ditto_cost_is_the_reference_loops_counts(monkeypatch, epochs):
  """Two gradients a step (global and personal, on the same minibatch); the two chains are
  independent, so the critical path is one chain. ``local_epochs`` with clients of different
  sizes: under full participation (the expectation over the sampling is then the count)."""
  data, model, J, B = personal_refs._data(), linreg(personal_refs.D), 3, 4
  s = S if epochs is None else N
  monkeypatch.setattr(personal_refs, "S", s)
  tally = _count_personal(
    monkeypatch, personal_refs.ref_ditto, data, 3, J, B, personal_refs.DITTO_HP, epochs=epochs
  )
  steps = dict(local_steps=J) if epochs is None else dict(local_epochs=epochs)
  alg = A.ditto(model, clients_per_round=s, batch_size=B, **steps)
  if epochs is not None:
    nex = np.asarray(data.num_examples)
    assert len(set(nex.tolist())) > 1
    assert tally.grads == ROUNDS * 2 * epochs * np.sum(-(-nex // B))
  assert_counts(alg.cost(data).spent(ROUNDS), tally.counts(chains_per_client=2))


def test_ifca_cost_is_the_reference_loops_counts(monkeypatch):
  """Each aggregated model comes with the cluster identity that places it (one more float); the
  cluster losses of the identities are no gradients."""
  data, model, J, B, k = personal_refs._data(), linreg(personal_refs.D), 3, 4, 2
  clusters = np.random.default_rng(0).normal(size=(k, personal_refs.D + 1))
  loss_calls = []
  monkeypatch.setattr(
    personal_refs, "_loss", counting(personal_refs._loss, lambda: loss_calls.append(1))
  )
  tally = _count_personal(
    monkeypatch, personal_refs.ref_ifca, data, 3, clusters, J, B, {"client_lr": 0.1}
  )
  assert loss_calls and tally.grads == ROUNDS * S * J and tally.messages == ROUNDS * S
  counted = tally.counts()._replace(upload_floats=tally.floats + tally.messages)
  alg = A.ifca(model, num_clusters=k, clients_per_round=S, local_steps=J, batch_size=B)
  assert_counts(alg.cost(data).spent(ROUNDS), counted)


# ----------------------------------------------------------------------------------------------
# Karula: a plain numpy loop of Algorithm 1 (checked against the simulator)
# ----------------------------------------------------------------------------------------------


def karula_reference(data, rounds, seed, s, eta, tally_setup, tally_rounds):
  """Karula's Algorithm 1 with full-batch gradients and inactive constraints (the projection is
  the identity): the setup fills the table with every client's gradient; each round the ``s``
  sampled clients send a fresh gradient and the server takes the SAGA step. Returns ``theta``."""
  x, y, nex = personal_refs._arrays(data)
  n = data.num_clients
  alpha = n * nex / nex.sum()
  _, _, run_key = jax.random.split(jax.random.PRNGKey(seed), 3)
  theta = np.zeros((n, x.shape[-1] + 1))

  def client_gradient(i, tally):  # client i's oracle, (alpha_i / n) grad f_i(theta_i)
    tally.new_client()
    tally.grad()
    return alpha[i] / n * personal_refs._grad(theta[i], x[i, : nex[i]], y[i, : nex[i]])

  tally_setup.new_round()
  table = np.array([client_gradient(i, tally_setup) for i in range(n)])
  tally_setup.upload(len(table), table.size)
  for r in range(rounds):
    tally_rounds.new_round()
    sample_key, _ = jax.random.split(jax.random.fold_in(run_key, r))
    idx = np.asarray(sample_clients(sample_key, n, s))
    fresh = np.array([client_gradient(i, tally_rounds) for i in idx])
    tally_rounds.upload(len(fresh), fresh.size)
    nu = table.copy()
    nu[idx] += n / s * (fresh - table[idx])
    table[idx] = fresh
    theta = theta - eta * nu
  return theta


@pytest.mark.parametrize("s", [2, N])
def test_karula_cost_is_the_reference_loops_counts(s):
  data, model, rounds = personal_refs._data(), linreg(personal_refs.D, l2=personal_refs.L2), 5
  setup, per_round = Tally(), Tally()
  theta = karula_reference(data, rounds, 3, s, 0.5, setup, per_round)
  alg = A.karula(model, dissimilarity="ones", clients_per_round=s)
  if s < N:  # the loop is Karula's (once: the simulator's compilation is the test's cost)
    hist = run(alg, dataset(data), rounds=rounds, seed=3, hparams={"eta": 0.5, "t": 1e6})
    np.testing.assert_allclose(
      personal_refs._flat(hist.final_state.params), theta, rtol=0, atol=1e-10
    )
  cost = alg.cost(data)
  assert setup.grads == N and per_round.grads == rounds * s
  assert_counts(cost.setup, setup.counts())
  assert_counts(cost.round.scaled(rounds), per_round.counts())
  assert_counts(cost.spent(rounds), setup.counts() + per_round.counts())


# ----------------------------------------------------------------------------------------------
# Every registered algorithm
# ----------------------------------------------------------------------------------------------

OPTIONS = {"karula": {"dissimilarity": "ones"}}


@pytest.mark.parametrize("name", sorted(A.list_algorithms()))
@pytest.mark.parametrize("partial", [False, True])
def test_every_algorithm_states_a_finite_nonnegative_cost(name, partial):
  data, model = regression_clients(n=6, d=3, seed=0), linreg(3)
  factory = A.get_algorithm(name).factory
  options = dict(OPTIONS.get(name, {}))
  if partial:
    if "clients_per_round" not in inspect.signature(factory).parameters:
      pytest.skip(f"{name} has full participation only")
    options["clients_per_round"] = 2
  alg = factory(model, **options)
  cost = A.algorithm_cost(alg, dataset(data))
  assert cost == alg.cost(data)
  for part in (cost.round, cost.setup):
    assert all(math.isfinite(v) and v >= 0 for v in part), (name, part)
  per_round = cost.round
  assert per_round.gradient_evaluations > 0 and per_round.sequential_steps >= 1
  if name == "local":
    assert per_round.uploading_clients == per_round.upload_floats == 0
  else:
    assert per_round.uploading_clients >= (2 if partial else 6)
    assert per_round.upload_floats >= per_round.uploading_clients
    # at least one model of P floats from every participant
    assert per_round.upload_floats >= parameter_count(model) * (2 if partial else 6)
  for rounds in (0, 3):
    assert cost.spent(rounds) == cost.setup + per_round.scaled(rounds)
