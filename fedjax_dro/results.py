"""What runs record and how it reaches the disk: :class:`History`, JSON lines, atomic writes."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Any, Dict, List, Union

import numpy as np


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
    }

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

  def save(self, out_dir: str) -> None:
    """Writes ``metrics.jsonl``, ``summary.json``, ``metrics.csv`` and ``clients.csv``
    (:mod:`fedjax_dro.export`) atomically into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    atomic_write(
      os.path.join(out_dir, "metrics.jsonl"), "".join(jsonl_line(r) for r in self.jsonl_records())
    )
    atomic_write(
      os.path.join(out_dir, "summary.json"),
      json.dumps(self.summary(), indent=2, default=json_default),
    )
    from fedjax_dro.export import history_to_csv

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
  return json.dumps(record, default=json_default) + "\n"


def append_lines(path: str, lines) -> None:
  """Appends ``lines`` to ``path`` and forces them to disk (flush + fsync) before returning."""
  with open(path, "a") as f:
    f.write("".join(lines))
    f.flush()
    os.fsync(f.fileno())


def evaluation_record(ev):
  return {
    "type": "eval",
    "round": int(ev["round"]),
    "summary": ev["summary"],
    "per_client": {k: np.asarray(v).tolist() for k, v in ev["per_client"].items()},
  }


def json_default(obj):
  if isinstance(obj, (np.generic,)):
    return obj.item()
  if isinstance(obj, np.ndarray):
    return obj.tolist()
  return str(obj)


def atomic_write(path: str, text: Union[str, bytes]) -> None:
  """Writes ``text`` to a temporary file beside ``path`` and renames it into place."""
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
  try:
    with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
      f.write(text)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give results the usual permissions
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
