"""``with_tied_hparams``: a tied hyper-parameter is computed from its source in every round, so a
run of the tied algorithm equals the original's run with the tie's value given by hand; the tied
name leaves the hyper-parameters; bad ties are refused."""

import jax
import numpy as np
import pytest

from fedjax_dro import algorithms as A
from fedjax_dro.algorithms.wrappers import with_tied_hparams
from fedjax_dro.engine.runner import run
from fedjax_dro.engine.sweeps import sweep
from tests.helpers import dataset, linreg, regression_clients


def _data():
  return dataset(regression_clients(n=4, d=3, seed=0))


def test_tied_run_equals_the_original_with_the_value_by_hand():
  model, data = linreg(3, l2=0.01), _data()
  base = A.scaff_pd(model, parameter_rule="user", local_steps=4, batch_size=None)
  tied = with_tied_hparams(base, tau=("client_lr", 4.0, 1))
  assert "tau" not in tied.hparams and "client_lr" in tied.hparams
  assert tied.config["tied_hparams"] == {"tau": ["client_lr", 4.0, 1.0]}
  hp = {"client_lr": 0.03, "sigma": 0.02, "rho": 0.1}
  a = run(tied, data, rounds=5, seed=1, hparams=hp)
  b = run(base, data, rounds=5, seed=1, hparams={**hp, "tau": 4 * 0.03})
  for x, y in zip(jax.tree.leaves(a.final_state.params), jax.tree.leaves(b.final_state.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  # a power: q-FedAvg's L = 1 / client_lr, inside a vmapped sweep
  q = with_tied_hparams(A.qffl(model, local_steps=2), L=("client_lr", 1.0, -1))
  res = sweep(q, data, rounds=3, grid={"client_lr": [0.01, 0.05]})
  for j, lr in enumerate([0.01, 0.05]):
    ref = run(A.qffl(model, local_steps=2), data, rounds=3, hparams={"client_lr": lr, "L": 1 / lr})
    np.testing.assert_allclose(
      res.final_summary[j]["loss"]["mean"], ref.final["loss"]["mean"], rtol=1e-5
    )


def test_bad_ties_are_refused():
  base = A.fedavg(linreg(3))
  with pytest.raises(ValueError, match="not one of"):
    with_tied_hparams(base, tau=("client_lr", 1.0, 1))
  with pytest.raises(ValueError, match="source"):
    with_tied_hparams(base, client_lr=("server_lr", 1.0, 1), server_lr=("client_lr", 1.0, 1))
  with pytest.raises(ValueError, match="factor"):
    with_tied_hparams(base, server_lr=("client_lr", 0.0, 1))
  with pytest.raises(TypeError, match="tuple"):
    with_tied_hparams(base, server_lr="client_lr")
  with pytest.raises(ValueError, match="at least one"):
    with_tied_hparams(base)
  tied = with_tied_hparams(base, server_lr=("client_lr", 2.0, 1))
  with pytest.raises(ValueError, match="server_lr"):
    run(tied, _data(), rounds=1, hparams={"server_lr": 1.0})


def test_a_tied_algorithm_made_private_passes_the_release_on():
  """fd.private of a tied (and a metric-wrapped) algorithm: the wrappers hand the round's release
  mechanism to the algorithm, so the private run draws, clips and noises as the algorithm's own
  private form does (its privacy metrics come back), and at noise 0 with a huge clip it equals
  the tied plain run."""
  import fedjax_dro as fd
  from fedjax_dro.algorithms.wrappers import with_round_metrics
  from fedjax_dro.core.precision import float64

  model, data = linreg(3), _data()
  with float64():
    base = A.qffl(model, clients_per_round=4)
    tied = with_round_metrics(
      with_tied_hparams(base, L=("client_lr", 1.0, -1)), lambda p: {"norm": jax.numpy.sum(p["w"])}
    )
    plain = run(tied, data, rounds=3, seed=1)
    private = fd.private(tied, 1e12, 0.0, sampling="fixed", loss_bound=1e12)
    priv = run(private, data, rounds=3, seed=1)
  assert "dp_participants" in priv.train_metrics and "norm" in priv.train_metrics
  for x, y in zip(jax.tree.leaves(plain.final_state), jax.tree.leaves(priv.final_state)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-9, atol=1e-10)
