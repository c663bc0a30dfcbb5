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

from fedjax_dro.records.checkpoint import CheckpointError
from fedjax_dro.records.history import history_to_csv, read_run, read_sweep, sweep_to_csv
from fedjax_dro.records.loggers import Logger, MLflowLogger, TensorBoardLogger
from fedjax_dro.records.plots import plot, plot_runs, plot_sweep

__all__ = [
  "read_run",
  "read_sweep",
  "history_to_csv",
  "sweep_to_csv",
  "plot",
  "plot_runs",
  "plot_sweep",
  "Logger",
  "TensorBoardLogger",
  "MLflowLogger",
  "CheckpointError",
]
