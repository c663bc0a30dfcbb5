"""``fedjax-dro reproduce scaffpd-synthetic``: a quick run (one rho, tiny grids) writes the JSON and
the PNG, x* is a saddle point of exactly the objective the simulator optimizes, SCAFF-PD closes
in on it while DRFA does not; CLI plumbing and bad inputs."""

import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro import algorithms as A, cli, reproduce
from fedjax_dro.algorithms.wrappers import with_distances
from fedjax_dro.common.model import client_loss_and_grad
from fedjax_dro.reproduce.scaffpd import shift_problem
from tests.helpers import linreg


def test_quick_reproduction_writes_json_and_png(tmp_path):
  out = str(tmp_path / "repro")
  rounds = 30
  res = reproduce.scaffpd_synthetic(out, rounds=rounds, quick=True, rhos=(0.05,), verbose=False)
  with open(os.path.join(out, "scaffpd_synthetic.json")) as f:
    saved = json.load(f)
  with open(os.path.join(out, "scaffpd_synthetic.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert saved["setting"]["rounds"] == rounds and saved["setting"]["l2"] > 0
  assert saved["quick"] is True
  with open(os.path.join(out, "scaffpd_synthetic.md")) as f:
    assert f.read().startswith("**Quick smoke run**")
  (panel,) = saved["panels"]
  assert panel["rho"] == 0.05 and panel["rho_ours"] == 0.025
  assert panel["saddle_residual"] < 1e-10
  algs = panel["algorithms"]
  assert {"SCAFF-PD", "DRFA-Prox", "FedAvg"} <= set(algs)
  for a in algs.values():
    assert len(a["curve"]) == rounds + 1 and a["curve"][0] == pytest.approx(
      panel["initial_distance"]
    )
    assert a["grid"] and all(np.isfinite(g["score"]) for g in a["grid"])
  scaff, drfa = algs["SCAFF-PD"]["final_distance"], algs["DRFA-Prox"]["final_distance"]
  assert scaff < 1e-5 * panel["initial_distance"] and scaff < 1e-3 * drfa, (scaff, drfa)
  # the linear rate shows already: log-distance decreases about linearly
  logd = np.log10(np.asarray(algs["SCAFF-PD"]["curve"]))
  assert np.all(np.diff(logd[::5]) < 0)

  # x* is a saddle point of the very objective the algorithms optimize: the lambda*-weighted
  # gradient of the simulator's client objectives vanishes there
  ds, model, _ = shift_problem(0)
  x_star = {"w": jnp.asarray(panel["x_star"])}
  tr = ds.train
  grads = jax.vmap(lambda x, y, n: client_loss_and_grad(model, x_star, x, y, n, None, None)[1])(
    tr.x, tr.y, tr.num_examples
  )
  g = jnp.tensordot(jnp.asarray(panel["lambda_star"]), grads["w"], 1)
  assert float(jnp.max(jnp.abs(g))) < 1e-10
  assert res["json_path"].endswith("scaffpd_synthetic.json")
  # the markdown table: one row per rho, one column per algorithm, values from the result
  table = pathlib.Path(res["md_path"]).read_text()
  rows = [line for line in table.splitlines() if line.startswith("| 0.")]
  assert len(rows) == len(res["panels"])
  assert table.count(" | ") >= len(algs) * len(rows)
  assert f"{scaff:.2g}" in rows[0] and "| SCAFF-PD |" in table


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
