"""reproduce privacy-fairness: matched epsilon across the strategies (dp-accounting's event is the
same), its table and plot, and a tiny end-to-end run through the CLI (slow)."""

import importlib
import json
import math
import os
import subprocess
import sys

import dp_accounting as dpa
import pytest
from dp_accounting import rdp

from fedjax_dro.models import builtin
from fedjax_dro.reproduce import EXPERIMENTS
from fedjax_dro.reproduce.privacy_fairness import (
  matched_epsilon,
  plot_privacy_fairness,
  privacy_markdown,
  strategies,
)

pf = importlib.import_module(
  "fedjax_dro.reproduce.privacy_fairness"
)  # the module, not the function
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _model():
  return builtin.softmax_regression(10, 5)


def test_every_strategy_spends_the_same_epsilon():
  """FedAvg at z; AFL and AgnosticFedAvg at sqrt(2) z on their updates and their losses: one
  Gaussian of multiplier z each round, the same dp-accounting event."""
  eps = matched_epsilon(1.5, 0.1, 50, 200, _model())
  acc = rdp.RdpAccountant()
  acc.compose(dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(1.5)), 50)
  assert eps == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
  assert math.isinf(matched_epsilon(0.0, 0.1, 50, 200, _model()))
  algs = {st.label: st.make(_model()) for st in strategies(1.5, 0.1)}
  assert algs["FedAvg"].hparams["dp_noise"].default == 1.5
  assert algs["DR-DSGD"].hparams["dp_noise"].default == 1.5
  for label in ("FGDRO-CVaR", "FGDRO-KL"):  # model-type releases only
    assert algs[label].hparams["dp_noise"].default == 1.5
  for label in ("AFL", "AgnosticFedAvg", "q-FFL", "SCAFF-PD"):
    hp = algs[label].hparams
    assert hp["dp_noise"].default == pytest.approx(1.5 * math.sqrt(2))
    assert hp["dp_loss_noise"].default == pytest.approx(1.5 * math.sqrt(2))
    assert algs[label].config["privacy"]["rate"] == 0.1
  # DRFA: two independently sampled releases a round at one multiplier z_d, composed by
  # dp-accounting directly to FedAvg's epsilon after the protocol's rounds
  zd = algs["DRFA"].hparams["dp_noise"].default
  assert algs["DRFA"].hparams["dp_loss_noise"].default == zd and 1.5 < zd < 1.5 * math.sqrt(2)
  acc = rdp.RdpAccountant()
  one = dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(zd))
  acc.compose(dpa.SelfComposedDpEvent(dpa.ComposedDpEvent([one, one]), 100))
  fedavg_eps = rdp.RdpAccountant().compose(
    dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(1.5)), 100
  )
  assert acc.get_epsilon(1e-5) == pytest.approx(fedavg_eps.get_epsilon(1e-5), rel=1e-9)
  assert "privacy-fairness" in EXPERIMENTS


def _fake_result():
  def record(values):
    return {
      "table": {
        label: {
          "accuracy": {"mean": w, "two_se": 0.01},
          "accuracy_mean": {"mean": m, "two_se": 0.02},
        }
        for label, (w, m) in values.items()
      }
    }

  return {
    "task": "t",
    "rate": 0.1,
    "rounds": 10,
    "clip": 1.0,
    "loss_bound": 2.0,
    "delta": 1e-5,
    "seeds": [0, 1],
    "levels": [
      {
        "z": 0.0,
        "epsilon": math.inf,
        "record": record({"FedAvg": (0.8, 0.9), "AFL": (0.85, 0.88)}),
      },
      {"z": 2.0, "epsilon": 2.5, "record": record({"FedAvg": (0.5, 0.7), "AFL": (0.3, 0.6)})},
    ],
  }


def test_markdown_and_plot(tmp_path):
  md = privacy_markdown(_fake_result())
  assert "| 0 | inf (clip only) | FedAvg | 0.800 +- 0.010 | 0.900 +- 0.020 |" in md
  assert "| 2 | 2.5 | AFL | 0.300 +- 0.010 | 0.600 +- 0.020 |" in md
  path = plot_privacy_fairness(_fake_result(), str(tmp_path / "p.png"))
  assert os.path.getsize(path) > 1000


def test_bad_arguments():
  with pytest.raises(ValueError, match="rounds must be a positive integer"):
    pf.privacy_fairness(rounds=0, verbose=False)
  with pytest.raises(ValueError, match="seed must be a non-negative integer"):
    pf.privacy_fairness(seed=-1, verbose=False)


def test_a_tiny_run_through_the_cli(tmp_path):
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  out = tmp_path / "pf"
  argv = ["reproduce", "privacy-fairness", "--quick", "--rounds", "2", "--out", str(out)]
  proc = subprocess.run(
    [sys.executable, "-m", "fedjax_dro", *argv],
    env=env,
    capture_output=True,
    text=True,
    timeout=1500,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.load(open(out / "privacy_fairness.json"))
  assert result["quick"] and result["rounds"] == 2
  assert [lv["z"] for lv in result["levels"]] == list(pf.QUICK["levels"])
  for level in result["levels"]:
    assert set(level["record"]["table"]) == {st.label for st in strategies(0.0, 0.25)}
    assert len(level["record"]["table"]) == 9
  assert (out / "privacy_fairness.png").stat().st_size > 1000
  assert "inf (clip only)" in (out / "privacy_fairness.md").read_text()
