"""benchmarks/fgdro_cifar_rounds.py: every row timed in order, written after each row, the
projection of a row's protocol worked by hand, bad flags (the timing itself runs on a device)."""

import json

import pytest

from tests.helpers import load_benchmark


def test_rows_in_order_written_after_each_and_projected(tmp_path, monkeypatch):
  mod = load_benchmark("fgdro_cifar_rounds")
  from fedjax_dro.reproduce.fgdro_protocol import configurations, protocol

  calls = []

  def fake(label, *, rounds, alpha, data):
    assert data == "DATA"  # generated once, shared by every row
    calls.append(label)
    if label == "FedAvg":
      raise RuntimeError("RESOURCE_EXHAUSTED: out of memory")
    return {
      "label": label,
      "seconds_per_round": 0.5,
      "compile_s": 10.0,
      "full_run_s_per_config": 0.5 * 625,
    }

  monkeypatch.setattr(mod, "cifar_round_time", fake)
  monkeypatch.setattr(mod, "generated_cifar", lambda alpha, seed: "DATA")
  out = tmp_path / "r.json"
  mod.main(["--rounds", "2", "--labels", "FGDRO-KL,FedAvg", "--out", str(out)])
  assert calls == ["FGDRO-KL", "FedAvg"]
  result = json.loads(out.read_text())
  (row,) = result["rows"]
  spec = {r["label"]: r for r in protocol("cifar10")["rows"]}["FGDRO-KL"]
  runs = (len(configurations(spec)) + 3) * 2  # both partitions
  assert row["runs"] == runs
  assert row["protocol_s"] == pytest.approx(runs * 625 * 0.5 + 2 * 10.0)
  assert "RESOURCE_EXHAUSTED" in result["errors"]["FedAvg"]
  md = (tmp_path / "r.md").read_text()
  assert "| FGDRO-KL | 0.500 | 10.0 | 5.2 min |" in md and "FedAvg: RuntimeError" in md
  assert mod.labels_in_order()[:2] == ["FGDRO-KL", "FedAvg"]
  assert sorted(mod.labels_in_order()) == sorted(r["label"] for r in protocol("cifar10")["rows"])


def test_bad_flags(capsys):
  mod = load_benchmark("fgdro_cifar_rounds")
  with pytest.raises(SystemExit):
    mod.main(["--rounds", "0"])
  assert "--rounds must be >= 1" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    mod.main(["--labels", "FedNope"])
  assert "--labels must be rows of the table" in capsys.readouterr().err
