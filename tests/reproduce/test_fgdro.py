"""``fedjax-dro reproduce fgdro-table7``: the paper's protocol end to end on tiny generated CIFAR-10
binary files (function and CLI), its three accuracies against numpy from the final models, the
digits stand-in's labelling, the grids' helpers and bad inputs."""

import json
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro import algorithms as A, cli, models, reproduce, run, sweep
from fedjax_dro.algorithms.wrappers import with_class_weighted_accuracy
from fedjax_dro.data import load_cifar10
from fedjax_dro.data.digits import digits_dirichlet_with_extras
from fedjax_dro.data.user_cifar import write_cifar10_bin
from fedjax_dro.reproduce import fgdro as fgdro_module
from fedjax_dro.reproduce.fgdro_protocol import (
  PAPER_TABLE7,
  cifar_round_time,
  configurations,
  edges,
  image_partition,
  protocol,
  split_holdout,
)


def _cifar_files(folder, per_class=100, test_per_class=12, seed=0):
  """Tiny CIFAR-10 binary files: class ``c`` images are noise around a class colour, so a CNN
  learns something in two rounds."""
  rng = np.random.default_rng(seed)

  def images(n):
    y = np.repeat(np.arange(10), n)
    base = rng.integers(0, 256, (10, 1, 1, 3))[y]
    x = np.clip(base + rng.integers(-40, 41, (y.size, 32, 32, 3)), 0, 255).astype(np.uint8)
    return x, y

  x, y = images(per_class)
  xt, yt = images(test_per_class)
  return write_cifar10_bin(str(folder), x, y, xt, yt)


def _hand_accuracies(params, model, x, y, proportions):
  """(worst class, worst client, average) from the model's predictions, in numpy."""
  pred = np.asarray(jnp.argmax(model.apply(params, jnp.asarray(x)), -1))
  acc = np.array([np.mean(pred[y == c] == c) for c in range(10)])
  client = proportions @ acc
  return acc.min(), client.min(), client.mean()


def _check_cifar_result(res, data_dir, labels):
  """The reported test accuracies of every row and seed equal numpy's on a retrained model."""
  assert res["stand_in"] is False and "STAND-IN" not in res["title"]
  assert res["setting"]["data"].startswith("CIFAR-10")
  images = load_cifar10(data_dir)
  _, test = split_holdout(images.x_test, images.y_test, 0)
  settings = protocol("cifar10", quick=True)
  model = models.cnn((32, 32, 3), 10, features=settings["features"], dense=None, conv="patches")
  rows = {r["label"]: r for r in settings["rows"]}
  for part in res["partitions"]:
    train, _ = image_partition(images.x_train, images.y_train, 10, part["alpha"], 0)
    nex = np.asarray(train.num_examples)
    y = np.asarray(train.y)
    proportions = np.stack([np.bincount(y[i, : nex[i]], minlength=10) / nex[i] for i in range(100)])
    assert part["train_rows"] == 5 * 100 + 5 * 20  # the first 20% of the 5 x 100 pooled rows kept
    assert list(part["algorithms"]) == labels
    for label, row in part["algorithms"].items():
      alg = A.get_algorithm(row["algorithm"]).factory(
        model, local_steps=2, batch_size=4, backend="auto", **row["options"]
      )
      for k, s in enumerate(res["setting"]["seeds"]):
        hp = {**rows[label]["fixed"], **row["hparams"]}
        final = sweep(alg, train, rounds=2, seeds=[s], hparams=hp, eval_every=2).final_state
        params = alg.client_models(jax.tree.map(lambda a: a[0], final))
        hand = _hand_accuracies(params, model, test[0], test[1], proportions)
        got = [row["per_seed_" + m][k] for m in ("worst_class_acc", "worst_acc", "avg_acc")]
        np.testing.assert_allclose(got, hand, atol=1e-6)
      assert row["worst_class_acc"] <= row["avg_acc"] + 1e-12
      assert row["worst_acc"] <= row["avg_acc"] + 1e-12


@pytest.mark.slow  # ~60 s on 2 idle cores: one row, two alphas, compilation-bound
def test_cifar10_protocol_end_to_end_on_generated_binary_files(tmp_path):
  data_dir = _cifar_files(tmp_path / "cifar")
  out = str(tmp_path / "out")
  res = reproduce.fgdro_table7(
    out, quick=True, data_dir=data_dir, algorithms=["FedAvg-M"], verbose=False, plot=False
  )
  _check_cifar_result(res, data_dir, ["FedAvg-M"])
  with open(os.path.join(out, "fgdro_table7.json")) as f:
    saved = json.load(f)
  assert saved["setting"]["local_iterations"] == 2 * 2 and saved["runtime_estimate_s"] > 0
  with open(os.path.join(out, "fgdro_table7.md")) as f:
    table = f.read()
  assert "CIFAR-10 (the paper's protocol)" in table and "stand-in" not in table.lower()


# In the default suite (CI runs the CIFAR-10 path on tiny generated files): one row, two alphas,
# through the command line; the function-level test above covers more and is slow.
def test_cli_runs_the_cifar10_protocol_from_data_dir(tmp_path, monkeypatch):
  data_dir = _cifar_files(tmp_path / "cifar")
  labels = ["FedAvg-M"]
  real = fgdro_module.protocol

  def two_rows(kind, quick=False):
    out = real(kind, quick)
    out["rows"] = [r for r in out["rows"] if r["label"] in labels]
    return out

  monkeypatch.setattr(fgdro_module, "protocol", two_rows)
  out = tmp_path / "out"
  argv = ["reproduce", "fgdro-table7", "--data-dir", data_dir, "--quick", "--out", str(out)]
  assert cli.main(argv) == 0
  with open(out / "fgdro_table7.json") as f:
    saved = json.load(f)
  _check_cifar_result(saved, data_dir, labels)
  assert (out / "fgdro_table7.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # ~60 s
def test_digits_stand_in_is_labelled_and_kept_apart_from_the_papers_numbers(tmp_path):
  out = str(tmp_path / "fgdro")
  labels = ["FedAvg", "FGDRO-KL"]
  res = reproduce.fgdro_table7(out, quick=True, algorithms=labels, verbose=False)
  with open(os.path.join(out, "fgdro_table7.json")) as f:
    saved = json.load(f)
  with open(os.path.join(out, "fgdro_table7.md")) as f:
    table = f.read()
  assert saved["stand_in"] is True and "STAND-IN" in saved["title"]
  title = [line for line in table.splitlines() if line.strip()][1]  # after the quick banner
  assert "STAND-IN" in saved["setting"]["data"] and "STAND-IN" in title
  ours, paper = table.split("The paper's Table 7")
  assert "0.528" not in ours and "| FGDRO-KL-Adam | 0.528 | 0.706 | 0.511 | 0.729 |" in paper
  for part in saved["partitions"]:
    for row in part["algorithms"].values():
      for m in ("worst_class_acc", "worst_acc", "avg_acc"):
        assert row[m] == pytest.approx(np.mean(row["per_seed_" + m]))
        assert row[m + "_std"] == pytest.approx(np.std(row["per_seed_" + m]))
        assert f"{row[m]:.3f} (±{row[m + '_std']:.3f})" in ours
  assert res["md_path"].endswith("fgdro_table7.md")


def test_class_weighted_accuracy_metric_matches_numpy():
  ds, extras = digits_dirichlet_with_extras(1, num_clients=12, alpha=0.5)
  model = models.cnn((8, 8), 10, features=(4, 8), dense=None, conv="patches")
  alg = A.fedavg(model, local_steps=2, batch_size=4, backend="vmap")
  x, y = extras.test_x[:200], extras.test_y[:200]
  wrapped = with_class_weighted_accuracy(alg, {"hold": (x, y)}, extras.proportions, 10)
  hist = run(wrapped, ds.train, rounds=3, eval_every=3, hparams={"client_lr": 0.1})
  params = hist.final_state.params
  pred = np.asarray(jnp.argmax(model.apply(params, jnp.asarray(x)), -1))
  present = [c for c in range(10) if np.any(y == c)]
  acc = np.array([np.mean(pred[y == c] == c) if np.any(y == c) else 0.0 for c in range(10)])
  client = extras.proportions @ acc
  final = {k: v[-1] for k, v in hist.train_metrics.items()}
  np.testing.assert_allclose(final["hold_worst_acc"], client.min(), atol=1e-12)
  np.testing.assert_allclose(final["hold_avg_acc"], client.mean(), atol=1e-12)
  np.testing.assert_allclose(final["hold_worst_class_acc"], acc[present].min(), atol=1e-12)
  np.testing.assert_allclose(final["hold_class_avg_acc"], acc[present].mean(), atol=1e-12)


def test_paper_protocol_settings_and_grids():
  p = protocol("cifar10")
  assert (p["rounds"] * p["local_steps"], p["local_steps"], p["batch_size"]) == (20000, 32, 32)
  rows = {r["label"]: r for r in p["rows"]}
  assert set(PAPER_TABLE7) < set(rows) and {"FedAvg-M", "LocalAdam"} < set(rows)
  for label in ("FedAvg", "SCAFFOLD", "FedProx", "DRFA", "FGDRO-KL", "FedAvg-M"):
    assert rows[label]["grid"]["client_lr"] == (1e-4, 1e-3, 1e-2, 1e-1)
  assert rows["FGDRO-KL"]["tied"] == {("beta1", "beta2", "beta3"): (0.01, 0.1, 0.2, 0.5)}
  assert rows["FedAvg-M"]["tied"] == {("beta3",): (0.01, 0.1, 0.2, 0.5)}
  # the old edges are interior now: CVaR alpha 0.5, KL lambda 5, DR-DSGD lambda 10, DRFA 0.01
  for label, name, old in [
    ("FGDRO-CVaR", "alpha", 0.5),
    ("FGDRO-KL", "lam", 5.0),
    ("DR-DSGD", "lam", 10.0),
    ("DRFA", "gamma", 0.01),
  ]:
    values = rows[label]["grid"][name]
    assert min(values) < old < max(values)
  configs = configurations(rows["FGDRO-KL"])
  assert len(configs) == 4 * 6 * 4
  assert all(c["beta1"] == c["beta2"] == c["beta3"] for c in configs)
  assert len({tuple(sorted(c.items())) for c in configs}) == len(configs)
  stand_in = protocol("digits")
  assert stand_in["rounds"] * stand_in["local_steps"] == 320


def test_edges_names_the_parameters_chosen_at_a_grid_edge():
  grid = {"client_lr": (0.1, 0.3, 1.0), "lam": (1.0, 5.0), "tau": (0.5,)}
  assert edges(grid, {"client_lr": 0.3, "lam": 5.0, "tau": 0.5}) == ["lam=5 (high edge)"]
  assert edges(grid, {"client_lr": 0.1, "lam": 3.0, "tau": 0.5}) == ["client_lr=0.1 (low edge)"]


def test_bad_inputs(tmp_path):
  with pytest.raises(ValueError, match="rounds"):
    reproduce.fgdro_table7(None, rounds=0)
  with pytest.raises(ValueError, match="seeds"):
    reproduce.fgdro_table7(None, seeds=[])
  with pytest.raises(ValueError, match="algorithms"):
    reproduce.fgdro_table7(None, algorithms=["FedAvg", "FedNope"])
  with pytest.raises(FileNotFoundError):
    reproduce.fgdro_table7(None, data_dir=str(tmp_path / "missing"), quick=True)
  with pytest.raises(ValueError, match="kind"):
    protocol("imagenet")
  with pytest.raises(ValueError, match="label"):
    cifar_round_time("FedNope")
  with pytest.raises(ValueError, match="rounds"):
    cifar_round_time(rounds=0)
  assert "fgdro-table7" in reproduce.EXPERIMENTS
  assert jax.config.jax_enable_x64  # the metric test above compares in float64


def _fake_run(values, diverged=False):
  """A one-row sweep result whose final metrics are ``values`` (``val_*`` and ``test_*``)."""
  metrics = {k: np.array([[0.0, v]]) for k, v in values.items()}
  return types.SimpleNamespace(train_metrics=metrics, diverged=np.array([diverged]))


def _fake_metrics(val_class, val_client, test):
  out = {"val_worst_class_acc": val_class, "val_worst_acc": val_client}
  for m in ("worst_class_acc", "worst_acc", "avg_acc", "class_avg_acc"):
    out[f"test_{m}"] = test
  return out


def test_each_reported_accuracy_is_selected_on_its_own_validation_metric():
  """Config a has the best validation worst-class accuracy, config b the best worst-client one:
  the worst-class and average columns come from a's runs, the worst-client column from b's (the
  test fails if the selection metric and the reported metric differ); a diverged reporting seed
  scores 0 and is counted."""
  spec = {"name": "fedavg", "options": {}, "tied": {}, "grid": {"client_lr": [0.1, 0.2, 0.3]}}
  spec["fixed"] = {}
  tests = {0.1: 0.5, 0.2: 0.7, 0.3: 0.1}  # test accuracy of each configuration's runs
  tuning = [
    ({"client_lr": 0.1}, _fake_run(_fake_metrics(0.9, 0.2, 0.0))),
    ({"client_lr": 0.2}, _fake_run(_fake_metrics(0.1, 0.8, 0.0))),
    ({"client_lr": 0.3}, _fake_run(_fake_metrics(float("nan"), 0.99, 0.0), diverged=True)),
  ]
  trained = []

  def train(hp, seed):
    trained.append((hp["client_lr"], seed))
    return _fake_run(_fake_metrics(0.0, 0.0, tests[hp["client_lr"]]), diverged=seed == 2)

  out = fgdro_module._summarise(spec, tuning, [0, 1, 2], train)
  assert out["selected"]["worst_class_acc"]["hparams"] == {"client_lr": 0.1}
  assert out["selected"]["worst_acc"]["hparams"] == {"client_lr": 0.2}  # the diverged 0.99 loses
  assert out["per_seed_worst_class_acc"] == [0.5, 0.5, 0.0]
  assert out["per_seed_avg_acc"] == [0.5, 0.5, 0.0]
  assert out["per_seed_worst_acc"] == [0.7, 0.7, 0.0]
  assert out["failures"] == {"worst_class_acc": 1, "worst_acc": 1}
  assert sorted(trained) == [(0.1, 0), (0.1, 1), (0.1, 2), (0.2, 0), (0.2, 1), (0.2, 2)]
  assert out["grid"][2]["validation_worst_acc"] == fgdro_module.FAILURE_SCORE
  # one selection for both when one configuration is best on both: its runs are shared
  trained.clear()
  tuning[1] = ({"client_lr": 0.2}, _fake_run(_fake_metrics(0.1, 0.1, 0.0)))
  out = fgdro_module._summarise(spec, tuning, [0, 1], train)
  assert out["selected"]["worst_acc"]["hparams"] == {"client_lr": 0.1}
  assert sorted(trained) == [(0.1, 0), (0.1, 1)]
