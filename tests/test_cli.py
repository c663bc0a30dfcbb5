import json

from fedjax_dro import cli


def test_run_default_prints_table_and_writes_files(tmp_path, capsys):
  out = tmp_path / "run"
  assert cli.main(["run", "--rounds", "20", "--no-progress", "--out", str(out)]) == 0
  text = capsys.readouterr().out
  assert "fedavg on synthetic-ridge" in text and "| r2 " in text and "worst-20%" in text
  lines = [json.loads(l) for l in open(out / "metrics.jsonl")]
  assert sum(l["type"] == "round" for l in lines) == 20
  summary = json.load(open(out / "summary.json"))
  assert summary["config"]["algorithm"] == "fedavg" and "compile_time_s" in summary
  assert summary["final"]["r2"]["mean"] > 0.5


def test_run_other_algorithm_dataset_and_options(capsys):
  assert (
    cli.main(
      [
        "run",
        "--algorithm",
        "scaffold",
        "--dataset",
        "synthetic-classification",
        "--rounds",
        "10",
        "--clients-per-round",
        "5",
        "--local-steps",
        "3",
        "--batch-size",
        "8",
        "--hparam",
        "client_lr=0.05",
        "--backend",
        "map",
        "--no-progress",
      ]
    )
    == 0
  )
  assert "| accuracy" in capsys.readouterr().out


def test_sweep_and_list(tmp_path, capsys):
  assert (
    cli.main(
      [
        "sweep",
        "--grid",
        "client_lr=0.01,0.05",
        "--seeds",
        "0,1",
        "--rounds",
        "10",
        "--out",
        str(tmp_path),
      ]
    )
    == 0
  )
  out = capsys.readouterr().out
  assert "best (mean r2)" in out
  assert len(json.load(open(tmp_path / "sweep.json"))["configs"]) == 4
  assert cli.main(["list"]) == 0
  listing = capsys.readouterr().out
  for name in [
    "fedavg",
    "fedsgd",
    "fedprox",
    "scaffold",
    "fedadam",
    "local",
    "synthetic-ridge",
    "synthetic-shift",
  ]:
    assert name in listing
