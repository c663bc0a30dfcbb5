"""FGDRO Figure 1 on the Camelyon17 stand-in (slow): every interval row spends the same local
iterations (rounds x I constant), the rows are selected on the held-out hospital, the figure is
written and labelled STAND-IN in its JSON and table."""

import json
import os

import pytest

from fedjax_dro import cli


@pytest.mark.slow
def test_figure1_quick_on_the_standin(tmp_path):
  out = str(tmp_path / "f1")
  assert cli.main(["reproduce", "fgdro-figure1", "--quick", "--out", out, "--no-progress"]) == 0
  result = json.load(open(os.path.join(out, "fgdro_figure1.json")))
  assert result["stand_in"] is True and os.path.exists(os.path.join(out, "fgdro_figure1.png"))
  table = result["results"]["interval"]["table"]
  spent = {label: row["rounds"] * int(label.split("I=")[1]) for label, row in table.items()}
  assert len(set(spent.values())) == 1, spent  # equal local iterations for every interval
  assert set(result["results"]["local_adam"]["table"]) == {"LocalAdam", "FedAdam"}
  assert "STAND-IN" in open(os.path.join(out, "fgdro_figure1.md")).read()
