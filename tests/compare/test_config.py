"""``fedjax-dro compare CONFIG.toml``: a tiny comparison end to end from the command line, and bad
configs refused with one error naming the key."""

import json
import os
import textwrap

import pytest

from fedjax_dro.cli import main
from fedjax_dro.compare.config import experiment_from_config, load_config

TINY = textwrap.dedent(
  """
  name = "tiny"
  description = "FedAvg against FedSGD at equal uploads"

  [data]
  dataset = "synthetic-ridge"
  options = { num_clients = 6, dim = 4 }

  [protocol]
  seeds = [0, 1]
  metric = "mse"
  stat = "weighted_mean"
  folds = 2
  max_widenings = 0
  reference = "FedAvg"
  budget = { kind = "uploads", match = "FedAvg", rounds = 4 }

  [[strategy]]
  label = "FedAvg"
  algorithm = "fedavg"
  settings = { local_steps = 2, clients_per_round = 2 }
  grid = { client_lr = [0.01, 0.03] }
  fixed = { server_lr = 1.0 }

  [[strategy]]
  label = "FedSGD"
  algorithm = "fedsgd"
  settings = { clients_per_round = 3 }
  grid = { lr = [0.01, 0.03] }
  """
)


def _write(tmp_path, text, name="c.toml"):
  path = tmp_path / name
  path.write_text(text)
  return str(path)


def test_compare_cli_writes_the_record(tmp_path, capsys):
  out = tmp_path / "out"
  assert main(["compare", _write(tmp_path, TINY), "--out", str(out)]) == 0
  record = json.loads((out / "tiny.json").read_text())
  assert record["kept_seeds"] == [0, 1] and record["reference"] == "FedAvg"
  rounds = {k: [r["rounds"] for r in rows] for k, rows in record["per_seed"].items()}
  assert rounds == {"FedAvg": [4, 4], "FedSGD": [2, 2]}  # 8 P floats: 2 P / 3 P per round
  for ext in ("md", "png"):
    assert os.path.getsize(out / f"tiny.{ext}") > 0
  assert "| FedSGD |" in capsys.readouterr().out


@pytest.mark.parametrize(
  "edit, key",
  [
    (lambda t: t.replace('name = "tiny"', 'name = "tiny"\ncolour = 1'), "config.colour"),
    (lambda t: t.replace("folds = 2", "folds = 2\nfold = 3"), "protocol.fold"),
    (lambda t: t.replace('kind = "uploads"', 'kind = "uploads", amout = 3'), "protocol.budget"),
    (lambda t: t.replace('dataset = "synthetic-ridge"', 'dataset = "ridge"'), "data.dataset"),
    (lambda t: t.replace("num_clients = 6", "clients = 6"), "data.options.clients"),
    (lambda t: t.replace('algorithm = "fedsgd"', 'algorithm = "fedsdg"'), "strategy[1].algorithm"),
    (lambda t: t.replace("local_steps = 2,", "local_step = 2,"), "strategy[0].settings"),
    (lambda t: t.replace("grid = { lr", "grid = { step"), "strategy[1].grid.step"),
    (lambda t: t.replace("fixed = { server_lr", "fixed = { server"), "strategy[0].fixed.server"),
    (lambda t: t.replace('label = "FedSGD"', 'label = "FedSGD"\nwiden = ["x"]'), "strategy[1]"),
    (lambda t: t.replace("folds = 2", "folds = 1"), "protocol: folds"),
    (lambda t: t.replace('reference = "FedAvg"', 'reference = "Karula"'), "reference 'Karula'"),
    (lambda t: t.replace("[[strategy]]", "[[strategies]]"), "config.strategies"),
    (lambda t: t + "\n[[[", "not valid TOML"),
  ],
)
def test_bad_configs_name_the_key(tmp_path, capsys, edit, key):
  path = _write(tmp_path, edit(TINY))
  with pytest.raises(ValueError) as e:
    experiment_from_config(load_config(path))
  assert key in str(e.value)
  assert main(["compare", path, "--out", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and key in err and "Traceback" not in err


def test_missing_config_file(tmp_path):
  with pytest.raises(ValueError, match="is not an existing file"):
    load_config(str(tmp_path / "none.toml"))


def test_the_guides_examples_declare_valid_experiments():
  """The Python and TOML examples of docs/comparing.md build (the runs themselves are the other
  tests' business)."""
  import pathlib
  import re

  import tomllib

  page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "comparing.md").read_text()
  code = re.findall(r"```python\n(.*?)```", page, re.S)[0]
  code = code.split("result = C.compare")[0]
  namespace = {}
  exec(compile(code, "comparing.md", "exec"), namespace)
  assert [s.label for s in namespace["experiment"].strategies] == ["FedAvg", "FedSGD", "IFCA"]
  toml = re.findall(r"```toml\n(.*?)```", page, re.S)[0]
  experiment = experiment_from_config(tomllib.loads(toml))
  assert experiment.protocol.budget.match == "FedAvg" and experiment.reference == "FedAvg"
