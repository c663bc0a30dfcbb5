"""Bad input gets a clear ValueError / TypeError naming the argument (never an XLA traceback)."""
import numpy as np
import pytest

from fedjax_dro import algorithms as A
from fedjax_dro import cli, models, run, sweep
from fedjax_dro.data import (dirichlet_partition, from_arrays, from_client_arrays, get_dataset,
                             train_test_split, validate_data)
from tests.helpers import dataset, linreg, regression_clients

DATA = regression_clients(n=4, d=2, seed=0)


def _rng_xy(m, d=2):
  rng = np.random.default_rng(0)
  return rng.normal(size=(m, d)), rng.normal(size=m)


CASES = {
    "ragged feature shapes": (lambda: from_client_arrays([np.zeros((3, 2)), np.zeros((3, 4))],
                                                       [np.zeros(3), np.zeros(3)]), ValueError, "feature shape"),
    "x / y row mismatch": (lambda: from_client_arrays([np.zeros((3, 2))], [np.zeros(4)]), ValueError, "ys[0]"),
    "empty client": (lambda: from_client_arrays([np.zeros((3, 2)), np.zeros((0, 2))],
                                              [np.zeros(3), np.zeros(0)]), ValueError, "client 1 is empty"),
    "no clients": (lambda: from_client_arrays([], []), ValueError, "xs is empty"),
    "NaN in features": (lambda: from_client_arrays([np.array([[1.0, np.nan]])], [np.zeros(1)]), ValueError, "NaN"),
    "xs not a list": (lambda: from_client_arrays(np.zeros((2, 3, 2)), np.zeros((2, 3))), TypeError, "lists"),
    "client_id float": (lambda: from_arrays(np.zeros((4, 2)), np.zeros(4), np.zeros(4)), TypeError, "client_id"),
    "client_id missing client": (lambda: from_arrays(np.zeros((4, 2)), np.zeros(4), np.array([0, 0, 2, 2])),
                                 ValueError, "client 1 has no rows"),
    "client_id length": (lambda: from_arrays(np.zeros((4, 2)), np.zeros(4), np.array([0, 1])), ValueError, "same number of rows"),
    "non-prefix mask": (lambda: validate_data(DATA.replace(mask=DATA.mask[:, ::-1])), ValueError, "prefix mask"),
    "data wrong type": (lambda: run(A.fedavg(linreg(2)), {"x": 1}, rounds=1), TypeError, "data must be"),
    "clients_per_round > n": (lambda: run(A.fedavg(linreg(2), clients_per_round=9), dataset(DATA), rounds=1),
                              ValueError, "clients_per_round"),
    "clients_per_round zero": (lambda: A.fedavg(linreg(2), clients_per_round=0), ValueError, "clients_per_round"),
    "negative step size": (lambda: run(A.fedavg(linreg(2)), dataset(DATA), rounds=1, hparams={"client_lr": -0.1}),
                           ValueError, "client_lr"),
    "NaN step size": (lambda: run(A.fedavg(linreg(2)), dataset(DATA), rounds=1, hparams={"client_lr": float("nan")}),
                      ValueError, "client_lr"),
    "unknown hparam": (lambda: run(A.fedavg(linreg(2)), dataset(DATA), rounds=1, hparams={"learning_rate": 0.1}),
                       ValueError, "learning_rate"),
    "beta1 > 1": (lambda: run(A.fedadam(linreg(2)), dataset(DATA), rounds=1, hparams={"beta1": 1.5}), ValueError, "beta1"),
    "rounds zero": (lambda: run(A.fedavg(linreg(2)), dataset(DATA), rounds=0), ValueError, "rounds"),
    "eval_every negative": (lambda: run(A.fedavg(linreg(2)), dataset(DATA), rounds=2, eval_every=-1), ValueError, "eval_every"),
    "unknown algorithm": (lambda: A.get_algorithm("fedavgg"), ValueError, "unknown algorithm"),
    "unknown dataset": (lambda: get_dataset("mnist-online"), ValueError, "unknown dataset"),
    "unknown backend": (lambda: A.fedavg(linreg(2), backend="pmap"), ValueError, "backend"),
    "negative local steps": (lambda: A.fedavg(linreg(2), local_steps=-3), ValueError, "local_steps"),
    "batch size zero": (lambda: A.fedavg(linreg(2), batch_size=0), ValueError, "batch_size"),
    "bad weighting": (lambda: A.fedavg(linreg(2), weighting="size"), ValueError, "weighting"),
    "eval data client mismatch": (lambda: run(A.fedavg(linreg(2)), dataset(DATA), rounds=1,
                                              eval_data=regression_clients(n=3, d=2)), ValueError, "eval_data"),
    "negative l2": (lambda: models.linear_regression(3, l2=-1.0), ValueError, "l2"),
    "num_features zero": (lambda: models.logistic_regression(0), ValueError, "num_features"),
    "flax adapter non-module": (lambda: models.from_flax(lambda x: x, np.zeros((1, 2))), TypeError, "flax.linen.Module"),
    "flax adapter unknown loss": (lambda: models.mlp((2,), 3).init and models.from_flax(
        models.builtin._MLP((4,), 2), np.zeros((1, 2)), loss="hinge"), ValueError, "loss"),
    "sweep unknown grid key": (lambda: sweep(A.fedavg(linreg(2)), dataset(DATA), rounds=1, grid={"lr": [0.1]}),
                               ValueError, "lr"),
    "sweep empty seeds": (lambda: sweep(A.fedavg(linreg(2)), dataset(DATA), rounds=1, seeds=[]), ValueError, "seeds"),
    "seed not int": (lambda: run(A.fedavg(linreg(2)), dataset(DATA), rounds=1, seed="zero"), TypeError, "seed"),
    "dirichlet alpha": (lambda: dirichlet_partition(np.arange(10) % 2, 2, alpha=0.0), ValueError, "alpha"),
    "dirichlet float labels": (lambda: dirichlet_partition(np.zeros(10), 2, alpha=1.0), TypeError, "labels"),
    "split fraction": (lambda: train_test_split(DATA, 1.5), ValueError, "test_fraction"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_raises_clear_error(case):
  fn, exc, fragment = CASES[case]
  with pytest.raises(exc) as info:
    fn()
  assert fragment in str(info.value), str(info.value)


def test_cli_reports_bad_names_without_traceback(capsys):
  assert cli.main(["run", "--algorithm", "nope", "--rounds", "1", "--no-progress"]) == 2
  assert "unknown algorithm 'nope'" in capsys.readouterr().err
  assert cli.main(["run", "--dataset", "nope", "--rounds", "1", "--no-progress"]) == 2
  assert "unknown dataset 'nope'" in capsys.readouterr().err
  assert cli.main(["run", "--hparam", "client_lr=-1", "--rounds", "1", "--no-progress"]) == 2
  assert "client_lr" in capsys.readouterr().err
