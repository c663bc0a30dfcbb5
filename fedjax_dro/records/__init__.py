"""What runs leave behind: their :class:`History` and its files, checkpoints, and plots.

* :mod:`fedjax_dro.records.history`: :class:`History` (what :func:`fedjax_dro.run` returns), the
  JSON lines, CSV and JSON files of runs and sweeps, and the readers of those files;
* :mod:`fedjax_dro.records.checkpoint`: checkpoints of :func:`fedjax_dro.run` (arrays and JSON
  only, atomic, checksummed, locked);
* :mod:`fedjax_dro.records.plots`: plots of saved runs and sweeps (``fedjax-dro plot``);
* :mod:`fedjax_dro.records.files`: atomic writes and the writable-directory check;
* :mod:`fedjax_dro.records.loggers`: experiment tracking (TensorBoard, MLflow) as a run goes.

Nothing here runs rounds: :mod:`fedjax_dro.engine` imports this package, never the reverse.
"""

from fedjax_dro.records import checkpoint, files, history, loggers, plots
from fedjax_dro.records.checkpoint import (
  CheckpointError,
  CheckpointLock,
  CheckpointManifestError,
  load_checkpoint,
  save_checkpoint,
)
from fedjax_dro.records.files import (
  FileWriteError,
  append_lines,
  atomic_write,
  check_writable_dir,
)
from fedjax_dro.records.history import (
  History,
  JsonlWriter,
  history_to_csv,
  json_text,
  read_csv,
  read_run,
  read_sweep,
  sweep_to_csv,
)
from fedjax_dro.records.loggers import Logger, MLflowLogger, TensorBoardLogger
from fedjax_dro.records.plots import plot, plot_runs, plot_sweep

__all__ = [
  "checkpoint",
  "files",
  "history",
  "loggers",
  "plots",
  "CheckpointError",
  "CheckpointLock",
  "CheckpointManifestError",
  "FileWriteError",
  "load_checkpoint",
  "save_checkpoint",
  "append_lines",
  "atomic_write",
  "check_writable_dir",
  "History",
  "JsonlWriter",
  "history_to_csv",
  "json_text",
  "read_csv",
  "read_run",
  "read_sweep",
  "sweep_to_csv",
  "plot",
  "plot_runs",
  "plot_sweep",
  "Logger",
  "TensorBoardLogger",
  "MLflowLogger",
]
