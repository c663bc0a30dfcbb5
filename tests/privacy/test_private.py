"""fd.private (DP-FedAvg): clipping against a per-client reference, the noise's standard
deviation, Poisson participation, epsilon against dp-accounting called directly, the plain
algorithm recovered with no noise and a huge clip, a sweep over noise multipliers against single
runs, the records carrying epsilon, and the refusals."""

import json
import math

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting import rdp

import fedjax_dro as fd
from fedjax_dro.algorithms import (
  afl,
  agnostic_fedavg,
  ditto,
  fedadam,
  fedavg,
  fedprox,
  get_algorithm,
  scaffold,
)
from fedjax_dro.algorithms.base import make_hparams
from fedjax_dro.core.local import local_round
from fedjax_dro.core.privacy import GaussianRelease, Privacy, poisson_capacity
from fedjax_dro.privacy import Releases, releases_table

LOSS_RELEASES = {
  n for n, d in releases_table().items() if isinstance(d, Releases) and d.losses is not None
}
from tests.helpers import dataset, linreg, regression_clients

N = 12


@pytest.fixture(scope="module")
def task():
  """Heterogeneous float64 linear-regression clients (21 parameters)."""
  return dataset(regression_clients(n=N, d=20, seed=0)), linreg(20)


def _fedavg(model, **kw):
  return fedavg(model, local_steps=3, batch_size=8, weighting="uniform", **kw)


def _one_round(alg, ds, hp=None, seed=0):
  params = jax.tree.map(lambda a: a.astype(jnp.float64), alg.model.init(jax.random.PRNGKey(1)))
  state = alg.init(params, ds.train, jax.random.PRNGKey(2))
  key = jax.random.PRNGKey(seed)
  new, metrics = jax.jit(alg.round)(state, ds.train, key, make_hparams(alg, hp))
  return params, new, metrics, key


def _leaves_diff(a, b):
  return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_each_update_is_clipped_before_the_sum(task):
  """Noise 0, every client taking part (fixed): the server moves by sum_i clip(delta_i) / n,
  delta_i from the plain algorithm's own per-client updates; a client with a huge update moves
  the model by at most C / n."""
  ds, model = task
  big = ds.train.replace(y=ds.train.y) if hasattr(ds.train, "replace") else ds.train
  x = np.asarray(big.x).copy()
  x[3] *= 1e3  # client 3's features blown up: its update is huge
  import dataclasses

  train = dataclasses.replace(big, x=jnp.asarray(x))
  ds = dataclasses.replace(ds, train=train)
  alg = _fedavg(model)
  clip = 0.05
  palg = fd.private(alg, clip, 0.0, sampling="fixed")
  params, new, _, key = _one_round(palg, ds)
  hp = make_hparams(alg)
  # the oracle: every participant's plain delta (the same key schedule), clipped one by one
  plain = local_round(
    model, _settings(alg), params, ds.train, key, hp["client_lr"], mean_only=False
  )
  flat = [
    np.concatenate([np.ravel(np.asarray(leaf[i])) for leaf in jax.tree.leaves(plain.deltas)])
    for i in range(N)
  ]
  norms = np.array([np.linalg.norm(f) for f in flat])
  assert norms[list(plain.idx).index(3)] > 100 * clip and norms.min() > clip  # all clipped
  expected = sum(f * min(1.0, clip / np.linalg.norm(f)) for f in flat) / N
  got = np.concatenate(
    [
      np.ravel(np.asarray(b - a))
      for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(new.params))
    ]
  )
  np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
  # the huge client's share of the move: at most C / n
  share = flat[list(plain.idx).index(3)] * min(1.0, clip / norms[list(plain.idx).index(3)]) / N
  assert np.linalg.norm(share) <= clip / N * (1 + 1e-12)


def _settings(alg):
  from fedjax_dro.core.settings import CommonSettings

  return CommonSettings(**{k: alg.config[k] for k in CommonSettings._fields if k in alg.config})


@pytest.mark.parametrize("sampling", ["fixed", "poisson"])
def test_the_noise_std_is_z_c_over_the_expected_participants(task, sampling):
  """client_lr = 0 (a zero update): the model moves by the noise alone, whose empirical std
  over many draws equals z C / m (m = s fixed, q n Poisson) within sampling error."""
  ds, model = task
  z, clip = 1.7, 0.3
  if sampling == "fixed":
    palg = fd.private(_fedavg(model, clients_per_round=4), clip, z, sampling="fixed")
    m = 4
  else:
    palg = fd.private(_fedavg(model), clip, z, rate=0.25)
    m = 0.25 * N
  params = model.init(jax.random.PRNGKey(1))
  state = palg.init(params, ds.train, jax.random.PRNGKey(2))
  hp = {**make_hparams(palg), "client_lr": jnp.float64(0.0)}  # no local move (below the checks)
  keys = jax.random.split(jax.random.PRNGKey(5), 600)
  moved = jax.jit(jax.vmap(lambda k: palg.round(state, ds.train, k, hp)[0].params))(keys)
  noise = np.concatenate(
    [
      np.ravel(np.asarray(b) - np.asarray(a)[None])
      for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(moved))
    ]
  )
  want = z * clip / m
  assert noise.size > 10_000
  assert abs(noise.mean()) < 4 * want / np.sqrt(noise.size)
  # the std estimate's own standard error is std / sqrt(2 N): 5 of them at most
  assert abs(noise.std() / want - 1) < 5 / np.sqrt(2 * noise.size)


def test_poisson_participation_has_rate_q(task):
  ds, model = task
  q = 0.3
  palg = fd.private(_fedavg(model), 1.0, 0.0, rate=q)
  params = model.init(jax.random.PRNGKey(1))
  state = palg.init(params, ds.train, jax.random.PRNGKey(2))
  hp = make_hparams(palg)
  keys = jax.random.split(jax.random.PRNGKey(7), 2000)
  metrics = jax.jit(jax.vmap(lambda k: palg.round(state, ds.train, k, hp)[1]))(keys)
  counts = np.asarray(metrics["dp_participants"])
  assert counts.shape == (2000,) and np.all(counts <= poisson_capacity(N, q))
  se = np.sqrt(N * q * (1 - q) / counts.size)
  assert abs(counts.mean() - q * N) < 4 * se
  assert abs(counts.var() / (N * q * (1 - q)) - 1) < 0.15  # binomial variance
  assert np.all(np.asarray(metrics["dp_dropped"]) == 0)


def test_a_poisson_round_writes_back_only_its_participants_rows(task):
  """SCAFFOLD's per-client control variates: the rows that change are the participants' (empty
  slots write nothing), as many as the round reports."""
  ds, model = task
  palg = fd.private(
    scaffold(model, local_steps=2, batch_size=8, weighting="uniform"), 1.0, 0.5, rate=0.4
  )
  _, new, metrics, _ = _one_round(palg, ds, seed=3)
  changed = np.any(
    np.abs(np.asarray(jax.tree.leaves(new.client_controls)[0])).reshape(N, -1) > 0, axis=1
  )
  assert changed.sum() == int(metrics["dp_participants"]) > 0


def _accountant_eps(event, rounds, delta, relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE):
  acc = rdp.RdpAccountant(neighboring_relation=relation)
  acc.compose(event, rounds)
  return acc.get_epsilon(delta)


def test_reported_epsilon_is_dp_accounting_called_directly(task, tmp_path):
  ds, model = task
  palg = fd.private(_fedavg(model), 1.0, 1.1, rate=0.25, delta=1e-6)
  hist = fd.run(palg, ds, rounds=7, eval_every=3, out_dir=str(tmp_path))
  for ev in hist.evaluations:
    want = _accountant_eps(
      dpa.PoissonSampledDpEvent(0.25, dpa.GaussianDpEvent(1.1)), ev["round"], 1e-6
    )
    assert ev["privacy"]["epsilon"] == pytest.approx(want, rel=1e-12)
    assert ev["privacy"]["delta"] == 1e-6 and ev["privacy"]["rounds"] == ev["round"]
  assert [ev["round"] for ev in hist.evaluations] == [3, 6, 7]
  assert hist.evaluations[0]["privacy"]["epsilon"] < hist.evaluations[-1]["privacy"]["epsilon"]
  # the records: metrics.jsonl's evaluations and summary.json
  evals = [json.loads(line) for line in open(tmp_path / "metrics.jsonl") if '"eval"' in line]
  assert [e["privacy"]["epsilon"] for e in evals] == [
    ev["privacy"]["epsilon"] for ev in hist.evaluations
  ]
  summary = json.load(open(tmp_path / "summary.json"))
  assert summary["privacy"]["epsilon"] == hist.evaluations[-1]["privacy"]["epsilon"]
  # fixed-size sampling: s of n without replacement, replace-one neighbours, sensitivity 2C
  pfix = fd.private(_fedavg(model, clients_per_round=4), 1.0, 1.1, sampling="fixed")
  h2 = fd.run(pfix, ds, rounds=5)
  want = _accountant_eps(
    dpa.SampledWithoutReplacementDpEvent(N, 4, dpa.GaussianDpEvent(0.55)),
    5,
    1e-5,
    dpa.NeighboringRelation.REPLACE_ONE,
  )
  assert h2.evaluations[-1]["privacy"]["epsilon"] == pytest.approx(want, rel=1e-12)


def test_privacy_budget_is_the_largest_round_count_within_epsilon():
  rounds = fd.privacy_budget(2.0, 1.0, delta=1e-5, num_clients=1000, rate=0.01)
  event = dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0))
  assert _accountant_eps(event, rounds, 1e-5) <= 2.0 < _accountant_eps(event, rounds + 1, 1e-5)
  assert fd.privacy_budget(1e-3, 0.5, delta=1e-5, num_clients=10, clients_per_round=5) == 0
  with pytest.raises(ValueError, match="exactly one of rate"):
    fd.privacy_budget(1.0, 1.0, delta=1e-5, num_clients=10)
  with pytest.raises(ValueError, match="delta must be a number in"):
    fd.privacy_budget(1.0, 1.0, delta=1.0, num_clients=10, rate=0.1)


PLAIN_CASES = {
  "fedavg": lambda m: _fedavg(m, clients_per_round=5),
  "fedprox": lambda m: fedprox(
    m, local_steps=2, batch_size=8, clients_per_round=5, weighting="uniform"
  ),
  "scaffold": lambda m: scaffold(
    m, local_steps=2, batch_size=8, clients_per_round=5, weighting="uniform"
  ),
  "fedadam": lambda m: fedadam(
    m, local_steps=2, batch_size=8, clients_per_round=5, weighting="uniform"
  ),
  "ditto": lambda m: ditto(
    m, local_steps=2, batch_size=8, clients_per_round=5, weighting="uniform"
  ),
  "afl": lambda m: afl(m, batch_size=8, clients_per_round=5),
  "agnostic_fedavg": lambda m: agnostic_fedavg(m, local_steps=2, batch_size=8),  # sum lambda = 1
  "dr_dsgd": lambda m: get_algorithm("dr_dsgd").factory(
    m, local_steps=2, batch_size=8, clients_per_round=5
  ),
  "fedavg_momentum": lambda m: get_algorithm("fedavg_momentum").factory(
    m, local_steps=2, batch_size=8, clients_per_round=5
  ),
}


@pytest.mark.parametrize("name", sorted(PLAIN_CASES))
def test_no_noise_and_a_huge_clip_is_the_plain_algorithm(task, name):
  """Fixed participation, noise 0, a clip of 1e12 (and a loss bound of 1e12): the plain run to
  1e-10 (AgnosticFedAvg with every client taking part: its weights then sum to 1 either way)."""
  ds, model = task
  alg = PLAIN_CASES[name](model)
  hp = {"lam": 100.0, "client_lr": 1e-3} if name == "dr_dsgd" else None  # exp(l / lam) finite
  plain = fd.run(alg, ds, rounds=3, seed=4, hparams=hp)
  kw = {"loss_bound": 1e12} if name in LOSS_RELEASES else {}
  priv = fd.run(
    fd.private(alg, 1e12, 0.0, sampling="fixed", **kw), ds, rounds=3, seed=4, hparams=hp
  )
  assert _leaves_diff(plain.final_state, priv.final_state) < 1e-10


def test_a_sweep_over_noise_multipliers_equals_single_runs(task):
  ds, model = task
  palg = fd.private(_fedavg(model), 0.5, 1.0, rate=0.3)
  res = fd.sweep(palg, ds, rounds=4, grid={"dp_noise": [0.3, 2.0]}, seeds=[1])
  for row, z in enumerate((0.3, 2.0)):
    single = fd.run(palg, ds, rounds=4, seed=1, hparams={"dp_noise": z})
    got = jax.tree.map(lambda a, row=row: a[row], res.final_state)
    assert _leaves_diff(got.params, single.final_state.params) < 1e-10
    assert res.privacy[row] == single.evaluations[-1]["privacy"]  # each row's own epsilon
  assert (
    _leaves_diff(
      jax.tree.map(lambda a: a[0], res.final_state).params,
      jax.tree.map(lambda a: a[1], res.final_state).params,
    )
    > 1e-3
  )  # the noise differs


def test_refusals_and_bad_inputs(task):
  ds, model = task
  with pytest.raises(ValueError, match="'karula' cannot be made client-level private: its server"):
    fd.private(get_algorithm("karula").factory(model), 1.0, 1.0, rate=0.5)
  # the declaration decides, not the name: a renamed FedAvg keeps its private form, an
  # algorithm without a declaration is refused whatever its name
  renamed = fd.private(_fedavg(model)._replace(name="my_fedavg"), 1.0, 1.0, rate=0.5)
  assert renamed.privacy.releases == _fedavg(model).releases
  mine = _fedavg(model)._replace(releases=None)
  with pytest.raises(ValueError, match="'fedavg' declares no releases: build it with"):
    fd.private(mine, 1.0, 1.0, rate=0.5)
  with pytest.raises(ValueError, match="loss_bound: 'afl' releases each participant's loss"):
    fd.private(get_algorithm("afl").factory(model), 1.0, 1.0, rate=0.5)
  with pytest.raises(ValueError, match="'fedavg' releases no losses"):
    fd.private(_fedavg(model), 1.0, 1.0, rate=0.5, loss_bound=3.0)
  with pytest.raises(ValueError, match="weighting='uniform'"):
    fd.private(fedavg(model), 1.0, 1.0, rate=0.5)
  alg = _fedavg(model)
  with pytest.raises(ValueError, match="already private"):
    fd.private(fd.private(alg, 1.0, 1.0, rate=0.5), 1.0, 1.0, rate=0.5)
  with pytest.raises(TypeError, match="alg must be an Algorithm"):
    fd.private("fedavg", 1.0, 1.0, rate=0.5)
  for kw, match in (
    (dict(clip_norm=-1.0), "clip_norm must be a positive finite number"),
    (dict(clip_norm=0.0), "clip_norm must be a positive finite number"),
    (dict(noise_multiplier=-0.1), "noise_multiplier must be a non-negative finite number"),
    (dict(delta=1.0), r"delta must be a number in \(0, 1\)"),
    (dict(rate=None), "rate: Poisson sampling needs"),
    (dict(rate=1.5), r"rate must be a number in \(0, 1\]"),
    (dict(sampling="shuffle"), "sampling must be one of"),
    (dict(sampling="fixed"), "rate is Poisson sampling's"),
    (dict(accountant="moments"), "accountant must be one of"),
  ):
    args = {"clip_norm": 1.0, "noise_multiplier": 1.0, "rate": 0.5, **kw}
    with pytest.raises(ValueError, match=match):
      fd.private(alg, **args)
  with pytest.raises(ValueError, match="hyper-parameter|dp_clip"):
    fd.run(fd.private(alg, 1.0, 1.0, rate=0.5), ds, rounds=1, hparams={"dp_clip": -1.0})


def test_released_sums_and_losses_carry_their_noise_and_clip():
  """release_sum: noise std z C bound; release_losses: clipped to [0, B], noise std z_l B."""
  z, clip, bound, zl, b = 0.8, 2.0, 0.25, 1.5, 3.0
  keys = jax.random.split(jax.random.PRNGKey(0), 4000)
  zeros = {"w": jnp.zeros((5, 3))}

  release = GaussianRelease(Privacy("fixed", None, 1e-5), clip, z, b, zl)

  def draw(k):
    total = release.sum(zeros, jnp.ones(5), None, bound, k)
    return total["w"], release.losses(jnp.array([-1.0, 0.5, 9.0]), k)

  sums, losses = jax.vmap(draw)(keys)
  assert abs(float(jnp.std(sums)) / (z * clip * bound) - 1) < 5 / np.sqrt(2 * sums.size)
  noise = np.asarray(losses) - np.array([0.0, 0.5, b])  # the clipped losses, then the noise
  assert abs(noise.mean()) < 4 * zl * b / np.sqrt(noise.size)
  assert abs(noise.std() / (zl * b) - 1) < 5 / np.sqrt(2 * noise.size)
  exact = GaussianRelease(Privacy("fixed", None, 1e-5), clip, 0.0, b, 0.0)
  np.testing.assert_array_equal(exact.losses(jnp.array([-1.0, 0.5, 9.0]), keys[0]), [0, 0.5, b])


def test_epsilon_of_an_algorithm_releasing_losses_composes_both_gaussians(task):
  """AFL releases its gradients (z) and its losses (z_l) on the same participants: one Gaussian
  mechanism of multiplier (z^-2 + z_l^-2)^(-1/2), accounted by dp-accounting."""
  ds, model = task
  palg = fd.private(
    afl(model, batch_size=8), 1.0, 1.2, rate=0.3, loss_bound=5.0, loss_noise_multiplier=2.0
  )
  hist = fd.run(palg, ds, rounds=4)
  z = (1.2**-2 + 2.0**-2) ** -0.5
  want = _accountant_eps(dpa.PoissonSampledDpEvent(0.3, dpa.GaussianDpEvent(z)), 4, 1e-5)
  assert hist.evaluations[-1]["privacy"]["epsilon"] == pytest.approx(want, rel=1e-12)
  assert hist.evaluations[-1]["privacy"]["noise_multiplier"] == pytest.approx(z)
  assert np.isfinite(np.asarray(jax.tree.leaves(hist.final_state.params)[0])).all()
  pagn = fd.private(
    agnostic_fedavg(model, local_steps=2, batch_size=8), 1.0, 1.0, rate=0.3, loss_bound=5.0
  )
  h2 = fd.run(pagn, ds, rounds=3)
  assert np.isfinite(np.asarray(h2.final_state.lam)).all()
  assert h2.evaluations[-1]["privacy"]["noise_multiplier"] == pytest.approx(2**-0.5)


def test_adaptive_clipping_moves_the_clip_toward_the_quantile(task):
  """With no count noise and every client taking part, one round moves the clip by
  exp(-eta (b / n - gamma)), b the clients whose plain update (the same key) is within the
  clip: Andrew et al.'s geometric update. The count is a release: no noise, epsilon inf; with
  noise the accountant composes z with 2 sigma_b."""
  ds, model = task
  alg = _fedavg(model)
  params = jax.tree.map(lambda a: a.astype(jnp.float64), model.init(jax.random.PRNGKey(1)))
  hp, key = make_hparams(alg), jax.random.PRNGKey(0)  # _one_round's start and round key
  plain = local_round(
    model, _settings(alg), params, ds.train, key, hp["client_lr"], mean_only=False
  )
  norms = np.sqrt(
    sum(np.sum(np.asarray(a).reshape(N, -1) ** 2, axis=1) for a in jax.tree.leaves(plain.deltas))
  )
  clip, gamma, eta = float(np.median(norms)), 0.4, 0.5  # half the clients within the clip
  palg = fd.private(
    alg, clip, 0.0, sampling="fixed", adaptive_quantile=gamma, adaptive_lr=eta, count_noise=0.0
  )
  _, new, metrics, _ = _one_round(palg, ds)
  b = int(np.sum(norms <= clip))
  assert 0 < b < N  # the clip splits the clients: the test can see a wrong count
  assert int(metrics["dp_unclipped"]) == b and float(metrics["dp_clip"]) == clip
  np.testing.assert_allclose(float(new.clip_scale), np.exp(-eta * (b / N - gamma)), rtol=1e-12)
  hist = fd.run(palg, ds, rounds=3)
  assert math.isinf(hist.evaluations[-1]["privacy"]["epsilon"])
  # Poisson: the released count is the centred sum_i (b_i - 1/2) (sensitivity 1/2), so
  # b~ = (b - p / 2) / m + 1/2 with p the participants drawn and m = q n the expected count
  pois = fd.private(
    alg, clip, 0.0, rate=0.5, adaptive_quantile=gamma, adaptive_lr=eta, count_noise=0.0
  )
  _, new_p, met, _ = _one_round(pois, ds, seed=5)
  b, p, m = float(met["dp_unclipped"]), float(met["dp_participants"]), 0.5 * N
  assert p != m  # the draw's size differs from the expected one: the centring shows
  want = np.exp(-eta * ((b - p / 2) / m + 0.5 - gamma))
  np.testing.assert_allclose(float(new_p.clip_scale), want, rtol=1e-12)
  noisy = fd.private(alg, clip, 1.0, rate=0.5, adaptive_quantile=gamma, count_noise=0.1)
  h2 = fd.run(noisy, ds, rounds=3)
  m = 0.5 * N
  z = (1.0**-2 + (2 * 0.1 * m) ** -2) ** -0.5
  want = _accountant_eps(dpa.PoissonSampledDpEvent(0.5, dpa.GaussianDpEvent(z)), 3, 1e-5)
  assert h2.evaluations[-1]["privacy"]["epsilon"] == pytest.approx(want, rel=1e-12)
  clips = np.asarray(h2.train_metrics["dp_clip"])
  assert clips[0] == clip and np.all(clips > 0) and len(set(clips.tolist())) == 3
  with pytest.raises(ValueError, match=r"adaptive_quantile must be a number in \(0, 1\)"):
    fd.private(alg, clip, 1.0, rate=0.5, adaptive_quantile=1.0)
  with pytest.raises(ValueError, match="adaptive_lr must be a positive"):
    fd.private(alg, clip, 1.0, rate=0.5, adaptive_quantile=0.5, adaptive_lr=0.0)


def test_every_algorithm_has_its_row_in_the_release_table():
  """Every registered algorithm declares what it releases or why it cannot be private;
  docs/privacy.md has a row for each."""
  import pathlib

  from fedjax_dro.algorithms import list_algorithms
  from fedjax_dro.privacy import Refused

  names = set(list_algorithms())
  table = releases_table()
  assert set(table) == names
  assert all(isinstance(d, (Releases, Refused)) for d in table.values()), table
  page = (pathlib.Path(__file__).parents[2] / "docs" / "privacy.md").read_text()
  table = [line.split("|")[1] for line in page.splitlines() if line.startswith("| ")]
  listed = {n.strip() for cell in table for n in cell.split(",")}
  assert names <= listed, sorted(names - listed)


def test_a_private_stateful_round_under_poisson(task):
  """FedAvg-M's model and momentum released together under Poisson participation: finite, its
  metrics over the filled slots only, epsilon reported."""
  ds, model = task
  alg = get_algorithm("fedavg_momentum").factory(model, local_steps=2, batch_size=8)
  hist = fd.run(fd.private(alg, 0.5, 0.8, rate=0.4), ds, rounds=4)
  m = {k: np.asarray(v) for k, v in hist.train_metrics.items()}
  assert np.all(m["dp_participants"] <= poisson_capacity(N, 0.4))
  assert np.all(np.isfinite(m["train_loss"])) and np.all(m["dp_unclipped"] <= m["dp_participants"])
  assert np.isfinite(np.asarray(hist.final_state.momentum["w"])).all()
  assert hist.evaluations[-1]["privacy"]["rounds"] == 4


def test_trackers_receive_epsilon():
  """log_evaluation passes a private run's epsilon to every tracker as privacy/epsilon (and an
  infinite epsilon, no noise, not at all)."""
  from fedjax_dro.records.loggers import log_evaluation

  class Recorder:
    def __init__(self):
      self.scalars = {}

    def log_scalars(self, step, scalars):
      self.scalars[step] = dict(scalars)

    def log_histogram(self, step, name, values):
      pass

  rec = Recorder()
  ev = {"round": 5, "summary": {}, "per_client": {}, "privacy": {"epsilon": 2.5, "delta": 1e-5}}
  log_evaluation([rec], ev)
  assert rec.scalars[5]["privacy/epsilon"] == 2.5
  log_evaluation([rec], {**ev, "round": 6, "privacy": {"epsilon": math.inf, "delta": 1e-5}})
  assert "privacy/epsilon" not in rec.scalars[6]


def test_the_capacity_table_in_the_docs_is_the_codes():
  """docs/privacy.md's table of Poisson capacities is what poisson_capacity computes, and each
  capacity holds a Binomial(n, q) draw but with probability <= 1e-12."""
  import pathlib

  from scipy.stats import binom

  page = (pathlib.Path(__file__).parents[2] / "docs" / "privacy.md").read_text()
  rows = [
    [c.strip().replace(",", "") for c in line.split("|")[1:-1]]
    for line in page.splitlines()
    if line.startswith("| ") and line.count("|") == 6 and line.split("|")[1].strip()[0].isdigit()
  ]
  assert len(rows) == 5
  for n, q, _, cap, _ in rows:
    n, q, cap = int(n), float(q), int(cap)
    assert poisson_capacity(n, q) == cap
    assert binom.sf(cap - 1, n, q) <= 1e-12 < binom.sf(cap - 2, n, q)  # one above the quantile
