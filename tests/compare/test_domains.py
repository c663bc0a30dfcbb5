"""Held-out-domain comparisons (``selection="domains"``) on the Camelyon17 stand-in: the chosen
configuration is the one whose global model scores best on the validation hospital, its score
and its reported test value equal an independent rerun evaluated on those splits, and a
personalized algorithm, a plateau budget or a mismatched metric stat are refused."""

import os

import jax
import numpy as np
import pytest

import fedjax_dro as fd
from fedjax_dro import algorithms as A, compare as C
from fedjax_dro.compare.domains import split_summary


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
  base = tmp_path_factory.mktemp("c17")
  raw = fd.data.prepared.write_standin("camelyon17", str(base / "raw"))
  out = fd.data.prepared.prepare("camelyon17", raw, str(base / "p"), progress=False)
  return {s: fd.data.load_prepared(out, s) for s in ("train", "val", "test")}


def test_the_choice_and_the_reported_value_equal_independent_reruns(splits):
  model = fd.models.cnn((96, 96, 3), 2, features=(4,), dense=None)

  def make(m):
    return A.fedavg(m, local_steps=2, batch_size=2, clients_per_round=3)

  lrs = [0.01, 0.3]
  experiment = C.Experiment(
    name="c17",
    data=lambda s: fd.data.FederatedDataset(
      train=splits["train"], validation=splits["val"], test=splits["test"]
    ),
    model=model,
    strategies=[C.Strategy("FedAvg", make, grid={"client_lr": lrs})],
    protocol=C.Protocol(
      seeds=(0,),
      metric=C.Metric("loss", "split"),
      budget=C.Budget("rounds", rounds=2),
      selection="domains",
      max_widenings=0,
    ),
  )
  (row,) = C.compare(experiment, verbose=False).to_json()["per_seed"]["FedAvg"]
  alg = make(model)
  val, test = {}, {}
  for lr in lrs:
    h = fd.run(alg, splits["train"], rounds=2, seed=0, hparams={"client_lr": lr})
    val[lr] = split_summary(alg, h.final_state, splits["val"])["loss"]
    test[lr] = split_summary(alg, h.final_state, splits["test"])["loss"]
  best = min(lrs, key=lambda lr: val[lr])  # the loss: lower is better
  assert row["chosen"] == {"client_lr": best}
  assert row["selection_score"] == pytest.approx(val[best], rel=1e-5)
  assert row["value"] == pytest.approx(test[best], rel=1e-5)
  assert np.isfinite(row["value"])


def test_misuses_are_refused(splits):
  with pytest.raises(ValueError, match="stat='split'"):
    C.Protocol(selection="domains", metric=C.Metric("accuracy", "mean"))
  with pytest.raises(ValueError, match="plateau"):
    C.Protocol(
      selection="domains",
      metric=C.Metric("accuracy", "split"),
      budget=C.Budget("plateau", cap=4),
    )
  model = fd.models.cnn((96, 96, 3), 2, features=(4,), dense=None)
  alg = A.ditto(model, local_steps=1, batch_size=2, clients_per_round=3)
  state = alg.init(model.init(jax.random.PRNGKey(0)), splits["train"].to_device(), None)
  with pytest.raises(ValueError, match="personalized"):
    split_summary(alg, state, splits["val"])
  assert os.path.isdir(splits["val"].store.path)
