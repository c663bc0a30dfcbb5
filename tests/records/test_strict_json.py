"""Every JSON file of fedjax_dro.records is strict JSON: non-finite floats are null and flagged."""

import json
import math
import os
import types

import numpy as np
import pytest

from fedjax_dro.records.history import (
  History,
  JsonlWriter,
  evaluation_record,
  json_text,
  jsonl_line,
  sweep_to_csv,
)


def _strict(text):
  """json.loads that raises on the NaN / Infinity tokens Python's json would accept."""

  def refuse(token):
    raise ValueError(f"non-standard JSON token {token}")

  return json.loads(text, parse_constant=refuse)


def test_the_strict_parser_refuses_bare_nan():
  with pytest.raises(ValueError, match="NaN"):
    _strict(json.dumps({"a": float("nan")}))


def test_json_text_writes_null_and_lists_the_fields():
  record = {
    "a": 1.5,
    "b": {"c": np.float32("nan"), "d": [1.0, np.inf, -np.inf]},
    "e": np.array([0.5, np.nan]),
    "f": "text",
  }
  out = _strict(json_text(record))
  assert out["a"] == 1.5 and out["f"] == "text"
  assert out["b"] == {"c": None, "d": [1.0, None, None]}
  assert out["e"] == [0.5, None]
  assert out["nonfinite"] == ["b.c", "b.d", "e"]
  # all-finite records are unchanged (no flag): the files of earlier runs read the same
  finite = {"a": 1.0, "b": [np.float64(2.0)], "c": np.int64(3)}
  assert json_text(finite) == json.dumps({"a": 1.0, "b": [2.0], "c": 3})


def _history(nan):
  per_client = {"r2": np.array([0.5, nan, 0.25]), "loss": np.array([1.0, 2.0, 3.0])}
  summary = {"r2": {"mean": nan, "worst": 0.25}, "loss": {"mean": 2.0}}
  ev = {"round": 2, "per_client": per_client, "summary": summary}
  return History("fedavg", {"rounds": 2}, {"loss": np.array([1.0, nan])}, [ev])


@pytest.mark.parametrize("nan", [np.nan, np.inf])
def test_history_files_are_strict_json(tmp_path, nan):
  _history(nan).save(str(tmp_path))
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  records = [_strict(line) for line in lines]
  assert [r["type"] for r in records] == ["round", "round", "eval"]
  assert records[1]["loss"] is None and records[1]["nonfinite"] == ["loss"]
  assert "nonfinite" not in records[0]
  assert records[2]["per_client"]["r2"] == [0.5, None, 0.25]
  assert records[2]["nonfinite"] == ["summary.r2.mean", "per_client.r2"]
  summary = _strict((tmp_path / "summary.json").read_text())
  assert summary["final"]["r2"] == {"mean": None, "worst": 0.25}
  assert summary["nonfinite"] == ["final.r2.mean"]


def test_jsonl_writer_resumes_on_its_own_lines(tmp_path):
  path = os.path.join(tmp_path, "metrics.jsonl")
  ev = _history(np.nan).evaluations[0]
  line = jsonl_line(evaluation_record(ev))
  writer = JsonlWriter(path, [line])
  writer.write([line])
  with open(path) as f:
    assert [_strict(x) for x in f.read().splitlines()] == [_strict(line)] * 2


def test_sweep_json_is_strict(tmp_path):
  result = types.SimpleNamespace(
    algorithm="fedavg",
    configs=[
      {"hparams": {"client_lr": 0.1}, "seed": 0},
      {"hparams": {"client_lr": 1e3}, "seed": 0},
    ],
    final_summary=[{"r2": {"mean": 0.5}}, {"r2": {"mean": -math.inf}}],
    diverged=np.array([False, True]),
    wall_time=1.0,
    compile_time=float("nan"),
  )
  sweep_to_csv(result, str(tmp_path))
  out = _strict((tmp_path / "sweep.json").read_text())
  assert out["final"] == [{"r2": {"mean": 0.5}}, {"r2": {"mean": None}}]
  assert out["compile_time_s"] is None
  assert out["nonfinite"] == ["final.r2.mean", "compile_time_s"]


def test_json_text_converts_jax_arrays_as_numbers():
  import jax.numpy as jnp

  record = {"x": jnp.asarray([1.0, jnp.nan]), "s": jnp.float32(2.5), "k": jnp.int32(3)}
  parsed = _strict(json_text(record))
  assert parsed == {"x": [1.0, None], "s": 2.5, "k": 3, "nonfinite": ["x"]}


def test_a_reproduction_writes_strict_json(tmp_path):
  from fedjax_dro import reproduce

  reproduce.scaffpd_synthetic(
    str(tmp_path), rounds=3, quick=True, rhos=(0.05,), num_seeds=1, plot=False, verbose=False
  )
  with open(tmp_path / "scaffpd_synthetic.json") as f:
    parsed = _strict(f.read())
  assert parsed["experiment"] == "scaffpd-synthetic"
