"""The DRO algorithms (SCAFF-PD, AFL, DRFA) take the problems of ``fedjax_dro.solvers.dro`` as
``psi``: a name and the problem object it stands for give bit-identical runs, an object's
parameter is the default of the hyper-parameter, the hyper-parameter stays a round argument
(swept by ``vmap``), and the configuration records the name."""

import json

import jax
import numpy as np
import pytest

import fedjax_dro as fd
from fedjax_dro import algorithms as A
from fedjax_dro.solvers import chi2, cvar, kl, qffl
from tests.helpers import dataset, linreg, regression_clients

DATA = dataset(regression_clients(n=5, d=3, seed=2))
MODEL = linreg(3)

# (factory, the options, the name, the object the name stands for in that factory)
CASES = [
  ("scaff_pd", {}, "chi2", chi2(0.1)),
  ("scaff_pd", {"parameter_rule": "condition_5_1"}, "cvar", cvar(0.5)),
  ("scaff_pd", {}, "qffl", qffl(1.0)),
  ("scaff_pd", {"parameter_rule": "condition_5_2"}, "chi2", chi2(0.1)),
  ("afl", {"clients_per_round": 3}, "chi2", chi2(0.0)),
  ("afl", {}, "cvar", cvar(0.5)),
  ("afl", {}, "qffl", qffl(1.0)),
  ("drfa", {}, "chi2", chi2(0.0)),
  ("drfa", {"prox": True}, "chi2", chi2(0.0)),
  ("drfa", {"sampling": "full"}, "cvar", cvar(0.5)),
]


def _bits(tree):
  return [np.asarray(leaf).tobytes() for leaf in jax.tree.leaves(tree)]


def _run(alg, **kw):
  return fd.run(alg, DATA, rounds=3, seed=1, check_finite=False, **kw)


@pytest.mark.parametrize("name,options,psi,problem", CASES)
def test_a_name_and_its_problem_give_identical_runs(name, options, psi, problem):
  factory = A.get_algorithm(name).factory
  by_name = factory(MODEL, psi=psi, **options)
  by_object = factory(MODEL, psi=problem, **options)
  assert list(by_name.hparams.items()) == list(by_object.hparams.items())
  assert by_name.config == by_object.config and by_object.config["psi"] == psi
  json.dumps(by_object.config)  # the configuration stays JSON
  a, b = _run(by_name), _run(by_object)
  assert _bits(a.final_state) == _bits(b.final_state)
  assert _bits(a.train_metrics) == _bits(b.train_metrics)


@pytest.mark.parametrize(
  "name,options,problem,key,value",
  [
    ("scaff_pd", {}, cvar(0.3), "alpha", 0.3),
    ("scaff_pd", {"parameter_rule": "condition_5_2"}, chi2(0.4), "rho", 0.4),
    ("afl", {}, qffl(2.5), "q", 2.5),
    ("drfa", {}, chi2(0.2), "rho", 0.2),
  ],
)
def test_an_objects_parameter_is_the_hyperparameters_default(name, options, problem, key, value):
  factory = A.get_algorithm(name).factory
  with_object = factory(MODEL, psi=problem, **options)
  with_name = factory(MODEL, psi=problem.name, **options)
  assert with_object.hparams[key].default == value
  assert list(with_object.hparams) == list(with_name.hparams)  # same keys, same order
  assert with_object.hparams[key]._replace(default=0) == with_name.hparams[key]._replace(default=0)
  a, b = _run(with_object), _run(with_name, hparams={key: value})
  assert _bits(a.final_state) == _bits(b.final_state)


def test_a_sweep_over_the_problems_parameter_matches_single_runs():
  alg = A.scaff_pd(MODEL, psi=cvar(0.3))
  alphas = [0.25, 0.6, 1.0]
  sw = fd.sweep(alg, DATA, rounds=2, grid={"alpha": alphas}, seeds=(1,), check_finite=False)
  for row, config in enumerate(sw.configs):  # one row per alpha (one seed)
    alpha = config["hparams"]["alpha"]
    one = fd.run(alg, DATA, rounds=2, seed=1, hparams={"alpha": alpha}, check_finite=False)
    got = np.asarray(sw.final_state.lam)[row]
    np.testing.assert_allclose(got, one.final_state.lam, rtol=1e-12, atol=1e-14)
    assert got.max() <= 1 / (alpha * 5) + 1e-12  # in the capped simplex of its own alpha
  assert sorted(c["hparams"]["alpha"] for c in sw.configs) == alphas


def test_a_private_round_takes_the_problem_too():
  pa = fd.private(A.scaff_pd(MODEL, psi="cvar"), 0.5, 0.3, rate=0.5, loss_bound=5.0)
  pb = fd.private(A.scaff_pd(MODEL, psi=cvar(0.5)), 0.5, 0.3, rate=0.5, loss_bound=5.0)
  assert _bits(_run(pa).final_state) == _bits(_run(pb).final_state)


def test_qffl_l2_is_recorded_and_used():
  alg = A.scaff_pd(MODEL, psi=qffl(2.0, "l2"))
  assert alg.config["psi"] == "qffl" and alg.config["psi_norm"] == "l2"
  assert "psi_norm" not in A.scaff_pd(MODEL, psi=qffl(2.0)).config
  lp, l2 = _run(A.scaff_pd(MODEL, psi=qffl(2.0))), _run(alg)
  assert not np.allclose(lp.final_state.lam, l2.final_state.lam)


@pytest.mark.parametrize(
  "build",
  [
    lambda: A.scaff_pd(MODEL, psi=kl(1.0)),
    lambda: A.scaff_pd(MODEL, psi="kl"),
    lambda: A.scaff_pd(MODEL, psi=cvar(0.3), parameter_rule="condition_5_2"),
    lambda: A.afl(MODEL, psi=kl(0.5)),
    lambda: A.drfa(MODEL, psi=qffl(1.0)),
    lambda: A.drfa(MODEL, psi=kl(1.0)),
    lambda: A.afl(MODEL, psi=1.0),
  ],
)
def test_problems_an_algorithm_cannot_run_are_refused(build):
  with pytest.raises(ValueError, match="psi"):
    build()
