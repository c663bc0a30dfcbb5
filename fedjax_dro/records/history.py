"""What runs and sweeps record, and how it reaches the disk and comes back.

:class:`History` is what :func:`fedjax_dro.run` returns. A run's ``out_dir`` holds:

* ``metrics.jsonl``: one JSON line per round (training metrics) and per evaluation, appended and
  flushed as the run goes (:class:`JsonlWriter`);
* ``summary.json``: the configuration and the final evaluation summary;
* ``metrics.csv``: one row per round: ``round``, the training metrics, and at evaluation rounds
  the summaries of every evaluation metric as ``<metric>_<stat>`` columns (``accuracy_mean``,
  ``accuracy_worst20``, ...; empty between evaluations);
* ``clients.csv``: one row per (evaluation round, client): ``round``, ``client`` and the
  per-client metrics.

A sweep's ``out_dir`` holds ``sweep.json`` and ``sweep.csv`` (one row per configuration: the
hyper-parameters, ``seed``, ``diverged`` and ``<metric>_<stat>`` of the final evaluation).

Every JSON file is strict JSON (:func:`json_text`): a non-finite float (a NaN metric, an infinite
loss) is written as ``null`` and the record's ``"nonfinite"`` entry lists the fields that held one.
All files are written atomically (:func:`~fedjax_dro.records.files.atomic_write`); a failed write
(a full disk) raises :class:`~fedjax_dro.records.files.FileWriteError` naming the file, and leaves
the files written before it as they were.
``pandas.read_csv`` reads them as they are; the readers here (:func:`read_run`,
:func:`read_sweep`, used by :mod:`fedjax_dro.records.plots`) need only the standard library and
NumPy.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
from typing import Any, Dict, List

import numpy as np

from fedjax_dro.records.files import append_lines, atomic_write


@dataclasses.dataclass
class History:
  """What a run recorded.

  Attributes:
    algorithm: name.
    config: algorithm settings, hyper-parameters, rounds, seed, dataset name.
    train_metrics: ``{name: [rounds_done]}`` per-round training metrics.
    evaluations: one dict per evaluation: ``round`` (rounds done), ``per_client`` ``{metric: [n]}``
      and ``summary`` ``{metric: {mean, weighted_mean, worst20, best20, worst, q10...}}``.
    final_state: the algorithm state after the last round.
    wall_time: seconds spent running rounds (compilation excluded).
    compile_time: seconds spent compiling the chunk program.
  """

  algorithm: str
  config: Dict[str, Any]
  train_metrics: Dict[str, np.ndarray]
  evaluations: List[Dict[str, Any]]
  final_state: Any = None
  wall_time: float = 0.0
  compile_time: float = 0.0

  @property
  def final(self) -> Dict[str, Dict[str, float]]:
    return self.evaluations[-1]["summary"] if self.evaluations else {}

  def summary(self) -> Dict[str, Any]:
    return {
      "algorithm": self.algorithm,
      "config": self.config,
      "final": self.final,
      "rounds_done": int(self.evaluations[-1]["round"]) if self.evaluations else 0,
      "wall_time_s": self.wall_time,
      "compile_time_s": self.compile_time,
      **({"privacy": self.evaluations[-1]["privacy"]} if self.privacy_recorded else {}),
    }

  @property
  def privacy_recorded(self) -> bool:
    """Whether the run was private (its evaluations carry epsilon)."""
    return bool(self.evaluations) and "privacy" in self.evaluations[-1]

  def jsonl_records(self):
    """The records of ``metrics.jsonl`` in the order :func:`fedjax_dro.run` appends them: after
    every evaluation, the rounds since the previous one (training metrics), then the evaluation.
    """
    num_rounds = len(next(iter(self.train_metrics.values()))) if self.train_metrics else 0
    done = 0
    for ev in self.evaluations:
      stop = min(int(ev["round"]), num_rounds)
      yield from round_records({k: v[done:stop] for k, v in self.train_metrics.items()}, done)
      done = stop
      yield evaluation_record(ev)
    yield from round_records({k: v[done:] for k, v in self.train_metrics.items()}, done)

  def save(self, out_dir: str, metrics_jsonl: bool = True) -> None:
    """Writes ``metrics.jsonl``, ``summary.json``, ``metrics.csv`` and ``clients.csv``
    (:func:`history_to_csv`) atomically into ``out_dir``.

    Args:
      out_dir: the directory (created if needed).
      metrics_jsonl: also (re)write ``metrics.jsonl``; ``False`` where :func:`fedjax_dro.run`
        has appended it already (its lines are these records).
    """
    os.makedirs(out_dir, exist_ok=True)
    if metrics_jsonl:
      atomic_write(
        os.path.join(out_dir, "metrics.jsonl"),
        "".join(jsonl_line(r) for r in self.jsonl_records()),
      )
    atomic_write(os.path.join(out_dir, "summary.json"), json_text(self.summary(), indent=2))
    history_to_csv(self, out_dir)


def round_records(train_metrics, start: int):
  """One ``{"type": "round", "round": start + r + 1, ...}`` record per row of ``train_metrics``."""
  num = len(next(iter(train_metrics.values()), [])) if train_metrics else 0
  for r in range(num):
    yield {
      "type": "round",
      "round": start + r + 1,
      **{k: float(v[r]) for k, v in train_metrics.items()},
    }


def jsonl_line(record) -> str:
  return json_text(record) + "\n"


def evaluation_record(ev):
  rec = {
    "type": "eval",
    "round": int(ev["round"]),
    "summary": ev["summary"],
    "per_client": {k: np.asarray(v).tolist() for k, v in ev["per_client"].items()},
  }
  if "privacy" in ev:  # a private run: epsilon at delta after these rounds
    rec["privacy"] = ev["privacy"]
  return rec


def json_default(obj):
  if isinstance(obj, (np.generic,)):
    return obj.item()
  if isinstance(obj, np.ndarray):
    return obj.tolist()
  return str(obj)


def finite_for_json(obj, where: str = ""):
  """``(copy of obj, fields)``: NumPy scalars and arrays as Python values, and every non-finite
  float (NaN, +-inf) as None; ``fields`` names, in order and once each, the dotted paths of the
  dict entries that held one (a list counts as its entry: ``per_client.r2``)."""
  fields: List[str] = []

  def clean(value, path):
    if not isinstance(value, (np.ndarray, np.generic)) and hasattr(value, "__array__"):
      value = np.asarray(value)  # a jax.Array (or another array type) as NumPy
    if isinstance(value, np.ndarray):
      value = value.tolist()
    elif isinstance(value, np.generic):
      value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
      if path not in fields:
        fields.append(path)
      return None
    if isinstance(value, dict):
      return {k: clean(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
      return [clean(v, path) for v in value]
    return value

  return clean(obj, where), fields


def json_text(obj, indent=None) -> str:
  """Strict JSON of ``obj`` (what every JSON file the package writes is written with: results,
  sweeps, cross-validation, reproductions).

  Non-finite floats are written as ``null`` (bare ``NaN`` / ``Infinity`` tokens are not JSON and
  strict parsers reject them) and flagged: a dict gets a ``"nonfinite"`` entry listing the dotted
  paths of the fields that held one (:func:`finite_for_json`), e.g. ``["summary.r2.mean"]``.
  Other objects are converted by :func:`json_default`.
  """
  clean, fields = finite_for_json(obj)
  if fields and isinstance(clean, dict):
    clean = {**clean, "nonfinite": fields}
  return json.dumps(clean, indent=indent, default=json_default, allow_nan=False)


class JsonlWriter:
  """``metrics.jsonl`` that never loses a finished evaluation.

  A fresh run starts the file. A resumed run keeps what is on disk when it starts with the
  checkpoint's records (evaluations a killed run finished after its last checkpoint stay in the
  file, only a partially written last line is dropped); the resumed run then recomputes those
  rounds identically and skips every line already present, so the file ends with no duplicates
  or gaps. Anything else on disk (another run's file) is replaced.
  """

  def __init__(self, path: str, prefix):
    self.path = path
    existing, torn = [], False
    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO would block the read
      raise ValueError(f"{path} exists and is not a regular file: it cannot be metrics.jsonl")
    if prefix and os.path.exists(path):
      with open(path) as f:
        existing = f.read().splitlines(keepends=True)
      if existing and not existing[-1].endswith("\n"):
        existing, torn = existing[:-1], True  # a line cut by a kill
    if existing[: len(prefix)] == prefix:
      self.pending = existing[len(prefix) :]  # finished after the checkpoint: kept on disk
      if torn or not prefix:  # a fresh run starts the file; a resume rewrites only a torn one
        atomic_write(path, "".join(existing))
    else:
      self.pending = []
      atomic_write(path, "".join(prefix))

  def write(self, lines) -> None:
    fresh = []
    for line in lines:
      if self.pending and self.pending[0] == line:
        self.pending.pop(0)  # recomputed identically: already on disk
        continue
      if self.pending:  # cannot happen for a deterministic run; keep the file consistent
        with open(self.path) as f:
          kept = f.read().splitlines(keepends=True)
        atomic_write(self.path, "".join(kept[: len(kept) - len(self.pending)]))
        self.pending = []
      fresh.append(line)
    if fresh:
      append_lines(self.path, fresh)


STATS = ("mean", "weighted_mean", "worst20", "best20", "worst")


def _csv_text(header: List[str], rows: List[List[Any]]) -> str:
  buf = io.StringIO()
  writer = csv.writer(buf, lineterminator="\n")
  writer.writerow(header)
  for row in rows:
    writer.writerow(["" if v is None else v for v in row])
  return buf.getvalue()


def _num(v) -> Any:
  v = float(v)
  return repr(v) if np.isfinite(v) else ("nan" if np.isnan(v) else ("inf" if v > 0 else "-inf"))


def history_to_csv(history, out_dir: str) -> List[str]:
  """Writes ``metrics.csv`` and ``clients.csv`` of ``history`` into ``out_dir``; their paths."""
  os.makedirs(out_dir, exist_ok=True)
  train = {k: np.asarray(v) for k, v in (history.train_metrics or {}).items()}
  num_rounds = max([len(v) for v in train.values()] + [0])
  evals = {int(ev["round"]): ev for ev in history.evaluations}
  num_rounds = max([num_rounds] + list(evals))
  metrics = sorted({m for ev in history.evaluations for m in ev["summary"]})
  summary_cols = [f"{m}_{s}" for m in metrics for s in STATS]
  header = ["round"] + sorted(train) + summary_cols
  rows = []
  for r in range(1, num_rounds + 1):
    row: List[Any] = [r]
    row += [_num(train[k][r - 1]) if r - 1 < len(train[k]) else None for k in sorted(train)]
    ev = evals.get(r)
    for m in metrics:
      for s in STATS:
        value = None if ev is None else ev["summary"].get(m, {}).get(s)
        row.append(None if value is None else _num(value))
    rows.append(row)
  metrics_path = os.path.join(out_dir, "metrics.csv")
  atomic_write(metrics_path, _csv_text(header, rows))

  client_metrics = sorted({m for ev in history.evaluations for m in ev["per_client"]})
  rows = []
  for ev in history.evaluations:
    per_client = {k: np.asarray(v).reshape(-1) for k, v in ev["per_client"].items()}
    n = max(len(v) for v in per_client.values()) if per_client else 0
    for i in range(n):
      rows.append(
        [int(ev["round"]), i]
        + [_num(per_client[m][i]) if m in per_client else None for m in client_metrics]
      )
  clients_path = os.path.join(out_dir, "clients.csv")
  atomic_write(clients_path, _csv_text(["round", "client"] + client_metrics, rows))
  return [metrics_path, clients_path]


def sweep_to_csv(result, out_dir: str) -> List[str]:
  """Writes ``sweep.json`` and ``sweep.csv`` of a :class:`~fedjax_dro.SweepResult`."""
  os.makedirs(out_dir, exist_ok=True)
  names = sorted({k for c in result.configs for k in c["hparams"]})
  metrics = sorted({m for s in result.final_summary for m in s})
  header = names + ["seed", "diverged"] + [f"{m}_{s}" for m in metrics for s in STATS]
  rows = []
  for c, s, d in zip(result.configs, result.final_summary, result.diverged):
    row: List[Any] = [_num(c["hparams"][k]) if k in c["hparams"] else None for k in names]
    row += [int(c["seed"]), int(bool(d))]
    row += [_num(s[m][st]) if m in s and st in s[m] else None for m in metrics for st in STATS]
    rows.append(row)
  csv_path = os.path.join(out_dir, "sweep.csv")
  atomic_write(csv_path, _csv_text(header, rows))
  json_path = os.path.join(out_dir, "sweep.json")
  atomic_write(
    json_path,
    json_text(
      {
        "algorithm": result.algorithm,
        "grid": names,
        "configs": result.configs,
        "final": result.final_summary,
        "diverged": np.asarray(result.diverged).tolist(),
        "wall_time_s": result.wall_time,
        "compile_time_s": result.compile_time,
        **({"metadata": result.metadata} if getattr(result, "metadata", None) else {}),
        **({"privacy": result.privacy} if getattr(result, "privacy", None) else {}),
      },
      indent=2,
    ),
  )
  return [json_path, csv_path]


def read_csv(path: str) -> Dict[str, np.ndarray]:
  """A CSV written here as ``{column: float array}`` (empty cells are NaN)."""
  with open(path, newline="") as f:
    reader = csv.reader(f)
    try:
      header = next(reader)
    except StopIteration:
      raise ValueError(f"{path} is empty") from None
    rows = list(reader)
  out = {}
  for j, name in enumerate(header):
    out[name] = np.array([float(r[j]) if j < len(r) and r[j] != "" else np.nan for r in rows])
  return out


def read_run(run_dir: str) -> Dict[str, Any]:
  """``{"summary": ..., "metrics": {col: [rounds]}, "clients": {col: [rows]}}`` of a run dir."""
  paths = {
    k: os.path.join(run_dir, f)
    for k, f in (
      ("summary", "summary.json"),
      ("metrics", "metrics.csv"),
      ("clients", "clients.csv"),
    )
  }
  for key in ("metrics", "clients"):
    if not os.path.exists(paths[key]):
      raise ValueError(
        f"{run_dir!r} has no {os.path.basename(paths[key])}: not a run directory written by "
        f"fedjax-dro run --out (or fd.run(..., out_dir=...))"
      )
  summary = {}
  if os.path.exists(paths["summary"]):
    with open(paths["summary"]) as f:
      summary = json.load(f)
  return {
    "summary": summary,
    "metrics": read_csv(paths["metrics"]),
    "clients": read_csv(paths["clients"]),
  }


def read_sweep(sweep_dir: str) -> Dict[str, Any]:
  """``{"grid": [names], "table": {col: [configs]}, "algorithm": str}`` of a sweep dir."""
  json_path, csv_path = (os.path.join(sweep_dir, f) for f in ("sweep.json", "sweep.csv"))
  if not (os.path.exists(json_path) and os.path.exists(csv_path)):
    raise ValueError(
      f"{sweep_dir!r} has no sweep.json / sweep.csv: not a directory written by "
      f"fedjax-dro sweep --out (or SweepResult.save)"
    )
  with open(json_path) as f:
    meta = json.load(f)
  return {
    "grid": meta.get("grid", []),
    "algorithm": meta.get("algorithm", ""),
    "table": read_csv(csv_path),
  }
