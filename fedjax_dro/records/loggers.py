"""Experiment tracking: a run's metrics sent to TensorBoard or MLflow as they are computed.

``fd.run(..., loggers=[TensorBoardLogger("tb/run1")])`` (CLI: ``--log-to tensorboard,mlflow
--log-dir DIR``) hands every logger, after each chunk of rounds:

* the per-round training metrics (``train/<metric>``, step = the round, from 1), the values of
  ``metrics.jsonl``'s ``round`` records;
* the evaluation summary (``eval/<metric>/<stat>``: ``mean``, ``weighted_mean``, ``worst20``,
  ``best20``, ``worst`` and the fairness quantiles ``q10`` ... ``q90`` of the per-client values,
  :func:`~fedjax_dro.core.metrics.summarize`), step = the round evaluated;
* a histogram of the per-client values of each evaluation metric (``eval/<metric>``; clients
  whose value is undefined, NaN, are left out).

A logger is any object with ``log_scalars(step, scalars)``, ``log_histogram(step, name, values)``
and ``close()`` (:class:`Logger`); an optional ``flush()`` is called after each evaluation. Two
come with the package, each behind an optional extra and offline (local files only):
:class:`TensorBoardLogger` (``pip install "fedjax_dro[tensorboard]"``: tensorboardX, event files
that ``tensorboard --logdir`` reads) and :class:`MLflowLogger` (``pip install
"fedjax_dro[mlflow]"``: mlflow-skinny, MLflow's file store, which ``mlflow ui
--backend-store-uri DIR`` reads). :func:`~fedjax_dro.engine.runner.run` does not close the
loggers it is given (the caller owns them; both are context managers); with several processes
only process 0 logs.
"""

from __future__ import annotations

import math
import os
import re
import time
from typing import (
  Any,
  Callable,
  Dict,
  Iterable,
  List,
  Mapping,
  Optional,
  Protocol,
  Sequence,
  Tuple,
  runtime_checkable,
)

import numpy as np

from fedjax_dro.records.files import FileWriteError, check_writable_dir

TRACKERS = ("tensorboard", "mlflow")
# The optional extra (pyproject.toml) and the module each tracker needs.
EXTRAS = {"tensorboard": ("tensorboard", "tensorboardX"), "mlflow": ("mlflow", "mlflow")}


@runtime_checkable
class Logger(Protocol):
  """What :func:`fedjax_dro.run` calls to track a run (an optional ``flush()`` is called too)."""

  def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    """Records the ``{name: value}`` scalars at ``step`` (a round)."""

  def log_histogram(self, step: int, name: str, values) -> None:
    """Records the distribution of ``values`` (one per client) as ``name`` at ``step``."""

  def close(self) -> None:
    """Writes out what is buffered and releases the files."""


def _import(tracker: str):
  """The module ``tracker`` needs, or a ModuleNotFoundError naming the extra to install."""
  extra, module = EXTRAS[tracker]
  try:
    return __import__(module)
  except ImportError:
    raise ModuleNotFoundError(
      f'{tracker} logging needs the {module!r} package: pip install "fedjax_dro[{extra}]"',
      name=module,
    ) from None


class _ContextManager:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


class TensorBoardLogger(_ContextManager):
  """TensorBoard event files in ``log_dir`` (tensorboardX; no TensorFlow needed).

  Scalars are stored as float32 (TensorBoard's format). ``tensorboard --logdir`` on the parent
  of several runs' directories shows them side by side.

  Args:
    log_dir: the directory of this run's event files (created if missing).
    flush_secs: seconds between automatic writes to disk (each evaluation also flushes).
  """

  def __init__(self, log_dir: str, flush_secs: int = 30):
    if not isinstance(log_dir, (str, os.PathLike)):
      raise TypeError(f"log_dir must be a path, got {type(log_dir).__name__}")
    tensorboardX = _import("tensorboard")
    self.log_dir = os.fspath(log_dir)
    self._writer = tensorboardX.SummaryWriter(logdir=self.log_dir, flush_secs=int(flush_secs))
    self._guard = _guard_event_file(self._writer)
    self._raised = False

  def _check(self) -> None:
    """Raises, once, the first write error of the event file (one line naming it); its
    background writer thread records errors instead of printing tracebacks."""
    error = self._guard.error if self._guard is not None else None
    if error is not None and not self._raised:
      self._raised = True
      raise FileWriteError(self._guard.path, error)

  def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    self._check()
    for name, value in scalars.items():
      self._writer.add_scalar(name, float(value), int(step))

  def log_histogram(self, step: int, name: str, values) -> None:
    self._check()
    values = _finite(values)
    if values.size:
      self._writer.add_histogram(name, values, int(step))

  def flush(self) -> None:
    self._writer.flush()
    self._check()

  def close(self) -> None:
    self._writer.close()
    self._check()


class _GuardedRecords:
  """The event file's record writer with its write errors recorded, not raised: tensorboardX
  writes from a background thread (whose exceptions would print tracebacks, and again at
  exit); the logger raises the recorded error on the main thread, naming the file. After an
  error nothing more is written."""

  def __init__(self, records):
    self.records, self.path, self.error = records, getattr(records, "path", "?"), None
    self._write, self._flush, self._close = records.write, records.flush, records.close
    records.write, records.flush, records.close = self.write, self.flush, self.close

  def _guarded(self, fn, *args):
    if self.error is not None:
      return None
    try:
      return fn(*args)
    except OSError as e:
      self.error = e
      return None

  def write(self, data):
    return self._guarded(self._write, data)

  def flush(self):
    return self._guarded(self._flush)

  def close(self):
    try:
      self._close()
    except OSError as e:  # the buffered tail cannot be written: recorded like any write
      if self.error is None:
        self.error = e


def _guard_event_file(writer):
  """The :class:`_GuardedRecords` of a tensorboardX ``SummaryWriter``'s event file (None if
  this tensorboardX lays its writers out otherwise: its errors then propagate as they are)."""
  try:
    records = writer._get_file_writer().event_writer._ev_writer._py_recordio_writer
  except AttributeError:
    return None
  return _GuardedRecords(records)


class MLflowLogger(_ContextManager):
  """An MLflow run in a local tracking store (MLflow's file store; offline).

  Metrics keep their names (``train/loss``, ``eval/accuracy/q10``) and steps. MLflow has no
  histograms: each evaluation's per-client values are saved as a JSON artifact
  ``per_client/<metric>/step_<round>.json`` (``{"step": ..., "values": [...]}``) of the run.
  MLflow 3 keeps the file store in maintenance mode and asks for ``MLFLOW_ALLOW_FILE_STORE=true``;
  this logger sets that variable when it is unset (a ``false`` you set is respected, and MLflow
  then refuses the file store). ``tracking_dir`` may also be a tracking URI
  (``sqlite:///runs.db``, ``http://host:5000``), passed to MLflow as is.

  Args:
    tracking_dir: the tracking store's directory (``mlruns``; created if missing) or URI.
    experiment: the experiment's name (created when missing).
    run_name: the run's name (default: MLflow's).
    params: optional ``{name: value}`` recorded as the run's parameters (hyper-parameters...).
  """

  def __init__(
    self,
    tracking_dir: str,
    *,
    experiment: str = "fedjax-dro",
    run_name: Optional[str] = None,
    params: Optional[Mapping[str, Any]] = None,
  ):
    if not isinstance(tracking_dir, (str, os.PathLike)):
      raise TypeError(f"tracking_dir must be a path, got {type(tracking_dir).__name__}")
    if not isinstance(experiment, str) or not experiment:
      raise ValueError(f"experiment must be a non-empty string, got {experiment!r}")
    if run_name is not None and not isinstance(run_name, str):
      raise TypeError(f"run_name must be a string, got {type(run_name).__name__}")
    if params is not None and not isinstance(params, Mapping):
      raise TypeError(f"params must be a dict, got {type(params).__name__}")
    _import("mlflow")
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    target = os.fspath(tracking_dir)
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target) is None or os.path.isabs(target):
      os.makedirs(target, exist_ok=True)
      target = "file:" + os.path.abspath(target)
    self.tracking_uri = target
    self._metric = Metric
    self._client = MlflowClient(tracking_uri=target)
    found = self._client.get_experiment_by_name(experiment)
    self.experiment_id = (
      found.experiment_id if found is not None else self._client.create_experiment(experiment)
    )
    self.run_id = self._client.create_run(self.experiment_id, run_name=run_name).info.run_id
    if params:
      items = [Param(str(k), str(v)[:6000]) for k, v in params.items()]
      for i in range(0, len(items), 100):
        self._client.log_batch(self.run_id, params=items[i : i + 100])
    self._closed = False

  def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    stamp = int(time.time() * 1000)
    metrics = [self._metric(k, float(v), stamp, int(step)) for k, v in scalars.items()]
    for i in range(0, len(metrics), 1000):  # MLflow's batch limit
      self._client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

  def log_histogram(self, step: int, name: str, values) -> None:
    values = _finite(values)
    path = f"per_client/{name.removeprefix('eval/')}/step_{int(step):08d}.json"
    self._client.log_dict(self.run_id, {"step": int(step), "values": values.tolist()}, path)

  def close(self) -> None:
    if not self._closed:
      self._client.set_terminated(self.run_id)
      self._closed = True


# ----------------------------------------------------------------------------------------------
# What a run sends to its loggers
# ----------------------------------------------------------------------------------------------
def _finite(values) -> np.ndarray:
  v = np.asarray(values, np.float64).reshape(-1)
  return v[np.isfinite(v)]


def check_loggers(loggers) -> List[Any]:
  """``loggers`` as a list, each checked to have the :class:`Logger` methods (TypeError naming
  ``loggers[i]`` otherwise); None is an empty list."""
  if loggers is None:
    return []
  if isinstance(loggers, (str, bytes)) or not isinstance(loggers, Iterable):
    raise TypeError(
      f"loggers must be a list of loggers (e.g. [TensorBoardLogger('runs/a')]), got "
      f"{type(loggers).__name__}"
    )
  out = list(loggers)
  for i, lg in enumerate(out):
    missing = [
      m for m in ("log_scalars", "log_histogram", "close") if not callable(getattr(lg, m, None))
    ]
    if missing:
      raise TypeError(
        f"loggers[{i}] ({type(lg).__name__}) lacks {', '.join(missing)}: a logger has "
        f"log_scalars(step, scalars), log_histogram(step, name, values) and close()"
      )
  return out


def log_rounds(loggers: Sequence[Any], train_metrics: Mapping[str, np.ndarray], start: int) -> None:
  """Row ``r`` of every ``train_metrics[name]`` as ``train/<name>`` at step ``start + r + 1``."""
  if not loggers or not train_metrics:
    return
  num = len(next(iter(train_metrics.values())))
  for r in range(num):
    scalars = {f"train/{k}": float(v[r]) for k, v in train_metrics.items()}
    for lg in loggers:
      lg.log_scalars(start + r + 1, scalars)


def evaluation_scalars(summary: Mapping[str, Mapping[str, float]]) -> Dict[str, float]:
  """``{"eval/<metric>/<stat>": value}`` of an evaluation summary."""
  return {
    f"eval/{metric}/{stat}": float(value)
    for metric, stats in summary.items()
    for stat, value in stats.items()
  }


def log_evaluation(loggers: Sequence[Any], evaluation: Mapping[str, Any]) -> None:
  """An evaluation (``{"round", "summary", "per_client"}``, as in ``History.evaluations``): its
  summary statistics as scalars and each metric's per-client values as a histogram."""
  if not loggers:
    return
  step = int(evaluation["round"])
  scalars = evaluation_scalars(evaluation["summary"])
  if "privacy" in evaluation and math.isfinite(evaluation["privacy"]["epsilon"]):
    scalars["privacy/epsilon"] = float(evaluation["privacy"]["epsilon"])
  for lg in loggers:
    lg.log_scalars(step, scalars)
    for name, values in evaluation["per_client"].items():
      lg.log_histogram(step, f"eval/{name}", values)
    flush = getattr(lg, "flush", None)
    if callable(flush):
      flush()


def log_sweep(result, make_loggers: Callable[[int, Dict[str, Any]], Sequence[Any]]) -> None:
  """Every row of a :class:`~fedjax_dro.engine.sweeps.SweepResult` as its own tracked run:
  ``make_loggers(row, config)`` gives the row's loggers, which receive its per-round training
  metrics and its final evaluation (at the last round) and are then closed. Rows stopped by a
  non-finite round log their rounds up to it."""
  rounds = len(next(iter(result.train_metrics.values()))[0]) if result.train_metrics else 0
  for row, config in enumerate(result.configs):
    loggers = check_loggers(make_loggers(row, config))
    try:
      metrics = {k: v[row] for k, v in result.train_metrics.items()}
      last = int(result.diverged_round[row]) if result.diverged[row] else rounds
      log_rounds(loggers, {k: v[:last] for k, v in metrics.items()}, 0)
      per_client = {k: v[row] for k, v in result.final_per_client.items()}
      evaluation = {"round": last, "summary": result.final_summary[row], "per_client": per_client}
      log_evaluation(loggers, evaluation)
    finally:
      for lg in loggers:
        lg.close()


# ----------------------------------------------------------------------------------------------
# The CLI's --log-to / --log-dir
# ----------------------------------------------------------------------------------------------
def tracking_flags(
  log_to: Optional[str], log_dir: Optional[str], out: Optional[str] = None
) -> Tuple[List[str], Optional[str]]:
  """``(tracker names, log dir)`` of the CLI's ``--log-to`` / ``--log-dir`` (default: ``out``,
  else ``./fedjax-dro-logs``), checked before anything runs: every error is a ValueError naming
  the flag (a missing library names the extra to install)."""
  if log_to is None:
    if log_dir is not None:
      raise ValueError("--log-dir is given but --log-to is not: which trackers should write there?")
    return [], None
  names = _tracker_names(log_to)
  try:
    for name in names:
      _import(name)
  except ImportError as e:
    raise ValueError(f"--log-to: {e}") from None
  log_dir = log_dir or out or "fedjax-dro-logs"
  check_writable_dir(log_dir, "--log-dir")  # after the checks: a refused command creates nothing
  return names, log_dir


def parse_log_to(text: Optional[str]) -> List[str]:
  """The tracker names of ``--log-to tensorboard,mlflow`` (ValueError naming ``--log-to`` for an
  unknown or repeated one; ModuleNotFoundError naming the extra when its library is missing)."""
  names = _tracker_names(text)
  for name in names:
    _import(name)
  return names


def _tracker_names(text: Optional[str]) -> List[str]:
  if text is None:
    return []
  names = [s.strip().lower() for s in str(text).split(",")]
  for name in names:
    if name not in TRACKERS:
      raise ValueError(
        f"--log-to expects a comma-separated list of {', '.join(TRACKERS)}, got {name or text!r}"
      )
  if len(set(names)) != len(names):
    raise ValueError(f"--log-to names a tracker twice: {text!r}")
  return names


def make_loggers(
  names: Sequence[str], log_dir: str, run_name: str, params: Optional[Mapping[str, Any]] = None
) -> List[Any]:
  """Loggers for the tracker ``names``: TensorBoard event files in ``<log_dir>/tensorboard/
  <run_name>``, an MLflow run ``run_name`` in the file store ``<log_dir>/mlruns`` (experiment
  ``fedjax-dro``, with ``params`` as its parameters)."""
  out: List[Any] = []
  try:
    for name in names:
      if name == "tensorboard":
        out.append(TensorBoardLogger(os.path.join(log_dir, "tensorboard", run_name)))
      elif name == "mlflow":
        out.append(MLflowLogger(os.path.join(log_dir, "mlruns"), run_name=run_name, params=params))
      else:
        raise ValueError(f"unknown tracker {name!r}; expected one of {TRACKERS}")
  except BaseException:
    for lg in out:
      lg.close()
    raise
  return out


def log_sweep_to(
  result, names: Sequence[str], log_dir: str, base: str, params: Optional[Mapping[str, Any]] = None
) -> None:
  """:func:`log_sweep` with :func:`make_loggers`: each row is the run ``<base>/<its
  hyper-parameters and seed>`` (``fedavg-sweep/client_lr=0.1,seed=0``), with ``params``, its
  hyper-parameters (``hparam.NAME``) and its training seed (``seed``) as MLflow parameters."""

  def row_loggers(row, config):
    hp = {f"hparam.{k}": v for k, v in config["hparams"].items()}
    row_params = {**(params or {}), **hp, "seed": config["seed"]}
    return make_loggers(names, log_dir, f"{base}/{sweep_row_name(config)}", row_params)

  log_sweep(result, row_loggers)


def sweep_row_name(config: Mapping[str, Any]) -> str:
  """A sweep row's run name from its hyper-parameters and seed: ``client_lr=0.1,seed=0``."""
  parts = [
    f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in config["hparams"].items()
  ]
  text = ",".join(parts + [f"seed={config['seed']}"])
  return re.sub(r"[^A-Za-z0-9_.=,-]+", "_", text)


def run_name(*parts: Any) -> str:
  """A directory-safe run name from ``parts`` and the current time (``fedavg-synthetic-s0-
  20260101-120000``): repeated runs get their own TensorBoard directory."""
  text = "-".join(str(p) for p in parts if p not in (None, ""))
  text = re.sub(r"[^A-Za-z0-9_.=-]+", "_", text).strip("_") or "run"
  return f"{text}-{time.strftime('%Y%m%d-%H%M%S')}"
