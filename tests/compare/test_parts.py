"""A table split into parts (``--part i/N``) for independent machines: each part computes only
its share of the runs (counted) and writes no table; the parts' records merged (``merge_runs``,
``fedjax-dro merge``) give the table of one run of the whole; parts of different configurations
are refused, and so is a bad ``i/N``. The reproduction of FGDRO Table 3 on its stand-in splits
and merges from the command line (slow)."""

import json
import os

import pytest

from fedjax_dro import cli, compare as C
from fedjax_dro.compare import harness
from fedjax_dro.compare.resume import check_part, merge_runs
from tests.compare.test_compare import _experiment
from tests.compare.test_resume import _Counted, _untimed


def test_parts_merged_equal_the_whole_table(tmp_path, monkeypatch):
  experiment = _experiment()
  total = len(experiment.protocol.seeds) * len(experiment.strategies)
  whole = C.compare(experiment, str(tmp_path / "whole"), verbose=False).to_json()
  parts, computed = [], 0
  for i in (1, 2, 3):
    out = str(tmp_path / f"part{i}")
    counter = _Counted()
    monkeypatch.setattr(harness, "_run", counter)
    assert C.compare(experiment, out, verbose=False, part=(i, 3)) is None
    assert not os.path.exists(os.path.join(out, f"{experiment.name}.json"))
    assert counter.calls == len(range(i - 1, total, 3))  # only its share
    computed += counter.calls
    parts.append(out)
  assert computed == total
  merged = str(tmp_path / "merged")
  assert merge_runs(merged, parts) == total
  counter = _Counted()
  monkeypatch.setattr(harness, "_run", counter)
  table = C.compare(experiment, merged, verbose=False).to_json()
  assert counter.calls == 0  # every run read back
  assert _untimed(table) == _untimed(whole)


def test_parts_of_different_configurations_and_bad_parts_are_refused(tmp_path):
  (tmp_path / "a" / "runs" / "x").mkdir(parents=True)
  (tmp_path / "b" / "runs" / "x").mkdir(parents=True)
  (tmp_path / "a" / "runs" / "x" / "r.json").write_text('{"key": 1}')
  (tmp_path / "b" / "runs" / "x" / "r.json").write_text('{"key": 2}')
  with pytest.raises(ValueError, match="r.json differs"):
    merge_runs(str(tmp_path / "m"), [str(tmp_path / "a"), str(tmp_path / "b")])
  with pytest.raises(ValueError, match="no runs/ folder"):
    merge_runs(str(tmp_path / "m"), [str(tmp_path / "m" / "none")])
  for bad in ("3/2", "0/2", "x/2", (1, 0), "1-2"):
    with pytest.raises(ValueError, match="part"):
      check_part(bad, str(tmp_path))
  with pytest.raises(ValueError, match="out_dir"):
    check_part((1, 2), None)
  assert check_part("2/4", str(tmp_path)) == (2, 4)


@pytest.mark.slow
def test_fgdro_table3_parts_merged_from_the_command_line_equal_the_whole(tmp_path):
  common = ["--quick", "--no-progress"]
  rep = ["reproduce", "fgdro-table3"]
  assert cli.main(rep + ["--out", str(tmp_path / "whole")] + common) == 0
  parts = []
  for i in (1, 2):
    out = str(tmp_path / f"part{i}")
    assert cli.main(rep + ["--out", out, "--part", f"{i}/2"] + common) == 0
    assert not os.path.exists(os.path.join(out, "fgdro_table3.json"))
    parts.append(out)
  assert cli.main(["merge", "--out", str(tmp_path / "merged")] + parts) == 0
  whole = json.load(open(tmp_path / "whole" / "fgdro_table3.json"))
  merged = json.load(open(tmp_path / "merged" / "fgdro_table3.json"))
  for record in (whole, merged):
    for key in ("json_path", "md_path", "wall_time_s"):
      record.pop(key, None)
  assert _untimed(merged) == _untimed(whole)
