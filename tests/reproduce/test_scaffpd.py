"""``fedjax-dro reproduce scaffpd-synthetic``: SCAFF-PD Fig. 2 on the comparison harness. The probe
split's mean squared error is the distance ``||x - x*||^2`` (and the runner's estimation error
against the dataset's ``true_params``); x* is a saddle point of exactly the objective the
simulator optimizes; a quick run writes every record, the combined table and the figure from the
harness's rows; CLI plumbing and bad inputs."""

import json
import math
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro import algorithms as A, cli, reproduce
from fedjax_dro.algorithms.wrappers import with_distances
from fedjax_dro.common.model import client_loss_and_grad
from fedjax_dro.core.metrics import evaluate_clients
from fedjax_dro.core.precision import float64
from fedjax_dro.reproduce import scaffpd as S
from tests.helpers import linreg


def test_probe_mse_is_the_distance_to_x_star():
  rng = np.random.default_rng(3)
  x_star = rng.normal(size=S.DIM)
  with float64():
    ds = S.fig2_data(0, {"x_star": x_star})
    model = S.shift_problem(0)[1]
    for _ in range(3):
      x = {"w": jnp.asarray(rng.normal(size=S.DIM))}
      want = float(np.sum((np.asarray(x["w"]) - x_star) ** 2))
      for split in (ds.test, ds.validation):
        mse = np.asarray(evaluate_clients(model, x, split, False)["mse"])
        np.testing.assert_allclose(mse, want, rtol=1e-12)
      models = {"w": jnp.broadcast_to(x["w"], (S.NUM_CLIENTS, S.DIM))}
      assert S.log10_distance(models, ds) == pytest.approx(math.log10(want), rel=1e-12)
    # the runner's estimation error reads the same x* from the dataset's true_params
    from fedjax_dro.engine.runner import run

    hist = run(A.fedavg(model, local_steps=2), ds, rounds=1, hparams={"client_lr": 0.01})
    final = hist.final
    assert final["mse"]["mean"] == pytest.approx(final["estimation_error"]["mean"], rel=1e-10)
  assert S.log10_distance({"w": np.tile(x_star, (S.NUM_CLIENTS, 1))}, ds) == math.log10(S.FLOOR)


def test_x_star_is_a_saddle_point_of_the_simulated_objective():
  """The lambda*-weighted gradient of the simulator's client objectives vanishes at x*."""
  oracle = S.saddle_point(0, 0.05)
  assert oracle["residual"] < 1e-10
  lam = oracle["lambda_star"]
  assert lam.min() >= 0 and lam.sum() == pytest.approx(1.0) and np.ptp(lam) > 1e-3
  with float64():
    ds, model, _ = S.shift_problem(0)
    x_star = {"w": jnp.asarray(oracle["x_star"])}
    tr = ds.train
    grads = jax.vmap(lambda x, y, n: client_loss_and_grad(model, x_star, x, y, n, None, None)[1])(
      tr.x, tr.y, tr.num_examples
    )
    g = jnp.tensordot(jnp.asarray(lam), grads["w"], 1)
  assert float(jnp.max(jnp.abs(g))) < 1e-10


def test_every_algorithm_has_the_same_number_of_configurations():
  rows = S.strategies(0.05)
  assert [s.num_configurations for s in rows] == [S.CONFIGURATIONS] * len(rows)
  assert {s.label for s in rows} == {"SCAFF-PD", "DRFA-Prox", "AFL", "FedAvg", "SCAFFOLD"}
  quick = S.strategies(0.05, quick=True)
  assert [s.label for s in quick] == list(S.QUICK_ROWS)
  assert [s.num_configurations for s in quick] == [1] * len(quick)
  dro = [s for s in S.strategies(0.05) if s.label in ("SCAFF-PD", "DRFA-Prox", "AFL")]
  assert all(s.fixed["rho"] == 0.025 for s in dro)  # the paper's rho / 2 on our losses


def test_quick_reproduction_writes_the_records_table_and_figure(tmp_path):
  out = str(tmp_path / "repro")
  rounds = 10
  res = reproduce.scaffpd_synthetic(out, rounds=rounds, quick=True, rhos=(0.05,), verbose=False)
  with open(os.path.join(out, "scaffpd_synthetic.json")) as f:
    saved = json.load(f)
  for stem in ("scaffpd_synthetic", "scaffpd_fig2_rho0p05"):
    with open(os.path.join(out, stem + ".png"), "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert saved["quick"] is True and saved["setting"]["rounds"] == rounds
  assert saved["setting"]["seeds"] == [0, 1]
  rec = saved["results"]["0.05"]
  assert rec["reference"] == "SCAFF-PD" and rec["kept_seeds"] == [0, 1]
  for o in saved["oracles"]["0.05"]:
    assert o["saddle_residual"] < 1e-10
    assert o["initial_distance"] == pytest.approx(float(np.sum(np.square(o["x_star"]))))
  for rows in rec["per_seed"].values():
    for r in rows:
      assert r["rounds"] == rounds and r["curve"][-1]["round"] == rounds
      assert r["curve"][-1]["value"] == pytest.approx(r["value"], rel=1e-12)
      log10 = r["extra"][S.LOG10]
      assert log10 == pytest.approx(math.log10(max(r["value"], S.FLOOR)), rel=1e-9)
  table = pathlib.Path(res["md_path"]).read_text()
  assert table.startswith("**Quick smoke run**")
  ref = rec["table"]["SCAFF-PD"][S.LOG10]
  line = next(x for x in table.splitlines() if x.startswith("| SCAFF-PD |"))
  assert f"{ref['mean']:.2f}" in line


def test_cli_reproduce_plumbing(monkeypatch, tmp_path):
  calls = []
  monkeypatch.setitem(
    reproduce.EXPERIMENTS, "scaffpd-synthetic", lambda **kw: calls.append(kw) or {}
  )
  assert (
    cli.main(["reproduce", "scaffpd-synthetic", "--out", str(tmp_path), "--rounds", "7", "--quick"])
    == 0
  )
  assert calls == [{"out_dir": str(tmp_path), "rounds": 7, "quick": True, "seed": 0}]
  with pytest.raises(SystemExit):
    cli.main(["reproduce", "no-such-figure"])
  # user inputs go only to the experiments that read them
  assert cli.main(["reproduce", "scaffpd-synthetic", "--features", "f.npz"]) == 2
  assert cli.main(["reproduce", "scaffpd-synthetic", "--data-dir", str(tmp_path)]) == 2
  assert len(calls) == 1


def test_bad_inputs():
  with pytest.raises(ValueError, match="unknown experiment"):
    reproduce.reproduce("fig-99")
  with pytest.raises(ValueError, match="rounds"):
    reproduce.scaffpd_synthetic(None, rounds=0)
  with pytest.raises(ValueError, match="num_seeds"):
    reproduce.scaffpd_synthetic(None, num_seeds=0)
  with pytest.raises(ValueError, match="rhos"):
    reproduce.scaffpd_synthetic(None, rhos=(-0.1,))
  with pytest.raises(ValueError, match="personalized"):
    with_distances(A.local(linreg(2)), [{"w": jnp.zeros(2), "b": jnp.zeros(())}])


def test_quick_results_are_labelled_quick(tmp_path):
  from fedjax_dro.reproduce.common import QUICK_BANNER, write_result

  for quick in (False, True):
    result = {"x": 1}
    write_result(str(tmp_path / str(quick)), "t", result, "| table |\n", quick=quick)
    with open(os.path.join(tmp_path, str(quick), "t.md")) as f:
      assert f.read().startswith(QUICK_BANNER) is quick
    with open(os.path.join(tmp_path, str(quick), "t.json")) as f:
      assert json.load(f).get("quick", False) is quick


def test_a_distance_spanning_decades_is_plotted_on_a_log_axis(tmp_path, monkeypatch):
  """The harness's figure of a Fig. 2 record draws its distances on a log axis; an accuracy
  record keeps a linear one."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from fedjax_dro.compare import plot_comparison

  results = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "results"
  for path, scale in (
    ("scaffpd_synthetic/scaffpd_fig2_rho0p05.json", "log"),
    ("scaffpd_table1/scaffpd_table1_alpha0p01.json", "linear"),
  ):
    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None, kept=kept: kept.append(fig))
    plot_comparison(json.loads((results / path).read_text()), str(tmp_path / "f.png"))
    monkeypatch.undo()
    assert [fig.axes[0].get_yscale() for fig in kept] == [scale]
    plt.close(kept[0])
