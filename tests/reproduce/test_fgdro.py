"""``fedjax-dro reproduce fgdro-table7`` on the comparison harness: the CIFAR-10 path end to end on
tiny generated binary files (every recorded accuracy against numpy on the model trained again from
its recorded choice), the held-out set's three accuracies against numpy, the same number of
configurations on every row on the paper's grids, per-seed data, the digits stand-in's labelling,
the CIFAR-10 timing protocol's helpers and bad inputs."""

import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro import algorithms as A, cli, models, reproduce, run
from fedjax_dro.algorithms.wrappers import with_class_weighted_accuracy
from fedjax_dro.data import load_cifar10
from fedjax_dro.data.digits import digits_dirichlet_with_extras
from fedjax_dro.data.user_cifar import write_cifar10_bin
from fedjax_dro.reproduce.fgdro_protocol import (
  PAPER_TABLE7,
  cifar_round_time,
  configurations,
  edges,
  protocol,
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


def _check_cifar_comparisons(out, data_dir, labels):
  """Every comparison's reported test accuracies of every row and seed equal numpy's on the
  final model trained again from its recorded choice, on that seed's own partition."""
  from fedjax_dro.reproduce.fgdro import METRICS, SIZES, table7_data, table7_strategies

  with open(out / "fgdro_table7.json") as f:
    saved = json.load(f)
  assert saved["stand_in"] is False and saved["data"].startswith("CIFAR-10")
  images = load_cifar10(data_dir)
  rounds, steps, batch, features = SIZES["quick"]
  model = models.cnn((32, 32, 3), 10, features=features, dense=None, conv="patches")
  makes = {s.label: s.make for s in table7_strategies(False, steps, batch)}
  assert set(saved["results"]) == {f"dir{a:g}_{m}" for a in (0.3, 10) for m in METRICS.values()}
  record = saved["results"]["dir0.3_worst_client_accuracy"]
  assert list(record["table"]) == labels and record["reference"] == "FGDRO-KL"
  for label in labels:
    for row in record["per_seed"][label]:
      ds = table7_data(0.3, row["seed"], images)
      nex = np.asarray(ds.train.num_examples)
      assert int(nex.sum()) == 5 * 100 + 5 * 20  # the first 20% of the 5 x 100 pooled rows kept
      alg = makes[label](model)
      hp = {k: float(v) for k, v in row["chosen"].items()}
      final = run(alg, ds.train, rounds=rounds, seed=row["seed"], hparams=hp, eval_every=rounds)
      params = alg.client_models(final.final_state)
      x, y = ds.test.x, ds.test.y
      pred = np.asarray(jnp.argmax(model.apply(params, jnp.asarray(x)), -1))
      acc = np.array([np.mean(pred[y == c] == c) for c in range(10)])
      client = np.asarray(ds.test.proportions) @ acc
      np.testing.assert_allclose(row["value"], client.min(), atol=1e-5)
      np.testing.assert_allclose(row["extra"]["worst_class_accuracy"], acc.min(), atol=1e-5)
      np.testing.assert_allclose(row["extra"]["mean_client_accuracy"], client.mean(), atol=1e-5)
  return saved


@pytest.mark.slow  # ~2 min on 2 idle cores: two rows, two alphas, three metrics, compile-bound
def test_cli_runs_the_cifar10_protocol_on_the_harness(tmp_path):
  data_dir = _cifar_files(tmp_path / "cifar")
  out = tmp_path / "out"
  argv = ["reproduce", "fgdro-table7", "--data-dir", data_dir, "--quick", "--out", str(out)]
  with pytest.MonkeyPatch.context() as mp:  # one row beside the reference
    from fedjax_dro.reproduce import fgdro

    real = fgdro.table7_strategies
    mp.setattr(fgdro, "table7_strategies", lambda small, steps, batch, only: real(
      small, steps, batch, ["FedAvg-M"]))  # fmt: skip
    assert cli.main(argv) == 0
  saved = _check_cifar_comparisons(out, data_dir, ["FedAvg-M", "FGDRO-KL"])
  table = (out / "fgdro_table7.md").read_text()
  assert "STAND-IN" not in table and "## Dirichlet(0.3)" in table and "## Dirichlet(10)" in table
  assert (out / "fgdro_table7_dir10_worst_class_accuracy.png").read_bytes()[:4] == b"\x89PNG"
  assert saved["rounds"] == 2 and saved["local_steps"] == 2


@pytest.mark.slow  # ~1 min
def test_digits_stand_in_is_labelled_and_kept_apart_from_the_papers_numbers(tmp_path):
  out = tmp_path / "fgdro"
  res = reproduce.fgdro_table7(str(out), quick=True, algorithms=["FGDRO-KL"], verbose=False)
  table = (out / "fgdro_table7.md").read_text()
  assert res["stand_in"] is True and "STAND-IN" in res["data"]
  title = [line for line in table.splitlines() if line.strip()][1]  # after the quick banner
  assert "STAND-IN" in title
  ours, paper = table.split("The paper's Table 7")
  assert "0.528" not in ours and "| FGDRO-KL-Adam | 0.528 | 0.706 | 0.511 | 0.729 |" in paper
  for record in res["results"].values():
    assert record["name"].endswith("_standin")
    metric = record["metric"]["name"]
    values = [r["value"] for r in record["per_seed"]["FGDRO-KL"]]
    entry = record["table"]["FGDRO-KL"][metric]
    assert entry["mean"] == pytest.approx(np.mean(values))
    assert entry["two_se"] == pytest.approx(2 * np.std(values, ddof=1) / np.sqrt(len(values)))
  # the three comparisons of a partition rest on the same training runs: one selection grid
  records = [
    res["results"][f"dir0.3_{m}"] for m in ("worst_class_accuracy", "mean_client_accuracy")
  ]
  points = [r["per_seed"]["FGDRO-KL"][0]["chosen"] for r in records]
  assert all(set(p) == {"client_lr", "beta1"} for p in points)


def test_class_held_out_set_scores_match_numpy():
  from fedjax_dro.reproduce.fgdro_protocol import ClassHeldOut

  _, extras = digits_dirichlet_with_extras(1, num_clients=12, alpha=0.5)
  model = models.cnn((8, 8), 10, features=(2, 2), dense=None, conv="patches")
  params = model.init(jax.random.PRNGKey(3))
  x, y = extras.test_x[:120], extras.test_y[:120]
  got = ClassHeldOut(x, y, extras.proportions).split_metrics(model, params)
  pred = np.asarray(jnp.argmax(model.apply(params, jnp.asarray(x)), -1))
  present = [c for c in range(10) if np.any(y == c)]
  acc = np.array([np.mean(pred[y == c] == c) if np.any(y == c) else 0.0 for c in range(10)])
  client = extras.proportions @ acc
  np.testing.assert_allclose(got["worst_client_accuracy"], client.min(), atol=1e-12)
  np.testing.assert_allclose(got["mean_client_accuracy"], client.mean(), atol=1e-12)
  np.testing.assert_allclose(got["worst_class_accuracy"], acc[present].min(), atol=1e-12)
  np.testing.assert_allclose(got["class_average_accuracy"], acc[present].mean(), atol=1e-12)


def test_every_row_has_the_same_number_of_configurations_on_the_papers_grids():
  from fedjax_dro.reproduce.fgdro import AXES, TABLE7_ROWS, table7_strategies

  paper = table7_strategies(False, 32, 32)
  small = table7_strategies(True, 8, 8)
  assert [s.label for s in paper] == [label for label, _ in TABLE7_ROWS]
  assert {"FedAvg-M", "LocalAdam"} < {s.label for s in paper} and len(paper) == 11
  assert {s.num_configurations for s in paper} == {16}
  assert {s.num_configurations for s in small} == {4}
  for full, cut in zip(paper, small):
    assert full.grids[0]["client_lr"] == [1e-4, 1e-3, 1e-2, 1e-1]
    assert cut.grids[0]["client_lr"] == [1e-2, 1e-1]  # the upper two of the paper's
    (name,) = set(cut.grids[0]) - {"client_lr"}  # the middle two of the second axis
    assert cut.grids[0][name] == full.grids[0][name][1:3] and len(full.grids[0][name]) == 4
  grids = {s.label: s.grids[0] for s in paper}
  assert grids["FedProx"]["mu"] and grids["FedAdam"]["server_lr"] == [1e-4, 1e-3, 1e-2, 1e-1]
  assert grids["FGDRO-KL"]["beta1"] == grids["FGDRO-KL-Adam"]["beta1"] == [0.01, 0.1, 0.2, 0.5]
  assert grids["FedAvg-M"]["beta3"] == grids["LocalAdam"]["beta3"] == [0.01, 0.1, 0.2, 0.5]
  assert set(AXES) == {label for label, _ in TABLE7_ROWS}
  model = models.cnn((8, 8), 10, features=(4, 8), dense=None, conv="patches")
  fedadam = {s.label: s for s in paper}["FedAdam"].make(model)
  assert fedadam.config.get("bias_correction") is False
  assert {s.label: s for s in paper}["FGDRO-KL"].make(model) is {s.label: s for s in paper}[
    "FGDRO-KL"
  ].make(model)  # one algorithm a model: the comparisons share compiled programs


def test_each_seed_draws_its_own_partition_and_held_out_halves():
  from fedjax_dro.reproduce.fgdro import table7_data

  a, b = table7_data(0.3, 0), table7_data(0.3, 1)
  assert a.train.num_clients == b.train.num_clients == 100
  assert not np.array_equal(np.asarray(a.train.y), np.asarray(b.train.y))
  assert not np.array_equal(a.validation.proportions, b.validation.proportions)
  for ds in (a, b):
    np.testing.assert_array_equal(ds.validation.proportions, ds.test.proportions)
    np.testing.assert_allclose(ds.test.proportions.sum(1), 1.0, atol=1e-6)
    counts = np.bincount(ds.test.y, minlength=10)
    assert counts.max() - counts.min() <= 1 + counts.max() // 10  # the halves stay balanced
  assert not np.array_equal(a.validation.y, b.validation.y) or not np.array_equal(
    a.validation.x, b.validation.x
  )


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


def test_edges_names_the_parameters_chosen_at_a_grid_edge():
  grid = {"client_lr": (0.1, 0.3, 1.0), "lam": (1.0, 5.0), "tau": (0.5,)}
  assert edges(grid, {"client_lr": 0.3, "lam": 5.0, "tau": 0.5}) == ["lam=5 (high edge)"]
  assert edges(grid, {"client_lr": 0.1, "lam": 3.0, "tau": 0.5}) == ["client_lr=0.1 (low edge)"]


def test_bad_inputs(tmp_path):
  with pytest.raises(ValueError, match="rounds"):
    reproduce.fgdro_table7(None, rounds=0)
  with pytest.raises(ValueError, match="seed"):
    reproduce.fgdro_table7(None, seed=-1)
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


def test_comparisons_of_several_metrics_train_each_grid_and_final_run_once(monkeypatch):
  """``compare(trained=...)``'s keeping under held-out-domain selection: the second metric's
  selection and final run score the kept global models again (no second sweep or run), and its
  scores are its own metric's (the test fails if a kept score, not a kept model, were reused)."""
  from fedjax_dro.compare import Metric, domains
  from fedjax_dro.engine import runner, sweeps

  calls = []

  def fake_sweep(alg, train, *, rounds, grid, seeds, hparams, eval_every):
    calls.append(("sweep", tuple(grid["lr"])))
    configs = [{"hparams": {"lr": v}} for v in grid["lr"]]
    return types.SimpleNamespace(
      configs=configs, diverged=[v > 5 for v in grid["lr"]], final_state=np.array(grid["lr"])
    )

  def fake_run(alg, train, *, rounds, seed, hparams, eval_every):
    calls.append(("run", hparams["lr"]))
    return types.SimpleNamespace(final_state=np.array(hparams["lr"] + seed))

  monkeypatch.setattr(sweeps, "sweep", fake_sweep)
  monkeypatch.setattr(runner, "run", fake_run)
  alg = types.SimpleNamespace(personalized=False, client_models=lambda s: s, model=None)
  held = types.SimpleNamespace(split_metrics=lambda m, p: {"up": float(p), "down": -float(p)})
  trained, grid = {}, {"lr": [1.0, 2.0, 9.0]}
  kw = dict(rounds=3, seed=0, hparams=None, trained=trained)
  up = domains.domain_points(alg, "train", held, grid, metric=Metric("up", "split"), **kw)
  down = domains.domain_points(alg, "train", held, grid, metric=Metric("down", "split"), **kw)
  assert [p["score"] for p in up][:2] == [1.0, 2.0] and np.isnan(up[2]["score"])  # diverged
  assert [p["score"] for p in down][:2] == [-1.0, -2.0]
  assert domains.domain_final(alg, "train", held, 3, 1, {"lr": 2.0}, trained)["down"] == -3.0
  assert domains.domain_final(alg, "train", held, 3, 1, {"lr": 2.0}, trained)["up"] == 3.0
  assert calls == [("sweep", (1.0, 2.0, 9.0)), ("run", 2.0)]
  other = domains.domain_points(alg, "other", held, grid, metric=Metric("up", "split"), **kw)
  assert len(calls) == 3 and [p["score"] for p in other][:2] == [1.0, 2.0]  # other data: trained
