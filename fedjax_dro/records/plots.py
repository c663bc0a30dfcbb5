"""Plots of saved runs and sweeps (``fedjax-dro plot DIR [DIR ...]``, also callable from Python).

* Run directories (``fedjax-dro run --out DIR``): runs of the same algorithm are treated as seeds.
  ``curves.png``: the mean and the worst-20% of the main metric (accuracy for classification,
  R^2 for regression, else the first metric) at every evaluation round, one style per algorithm,
  the line the mean over seeds and the band the range over seeds. ``clients.png``: the
  distribution of the per-client metric at the last evaluation (all seeds pooled; a histogram
  per algorithm, with each algorithm's worst-20% cut-off marked).
* Sweep directories (``fedjax-dro sweep --out DIR``): ``sweep_<metric>.png``, a heat map of the
  final ``<metric>_mean`` averaged over seeds over a 2-D grid (the first two grid parameters;
  a line over a 1-D grid), diverged configurations shown as missing.

Everything reads the CSV files of :mod:`fedjax_dro.records.history`; matplotlib runs headless (Agg).
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from fedjax_dro.common import styles
from fedjax_dro.records.history import read_run, read_sweep

MAIN_METRICS = ("accuracy", "r2", "loss", "mse")
HIGHER_IS_BETTER = {"accuracy": True, "r2": True, "loss": False, "mse": False}


def _pyplot():
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def _main_metric(run: Dict, metric: Optional[str]) -> str:
  cols = run["metrics"]
  if metric is not None:
    if f"{metric}_mean" not in cols:
      available = sorted({c.rsplit("_", 1)[0] for c in cols if c.endswith("_mean")})
      raise ValueError(f"metric {metric!r} is not in the runs; available: {available}")
    return metric
  for m in MAIN_METRICS:
    if f"{m}_mean" in cols:
      return m
  candidates = sorted(c[: -len("_mean")] for c in cols if c.endswith("_mean"))
  if not candidates:
    raise ValueError("the runs have no evaluation metrics to plot")
  return candidates[0]


def _save(fig, path: str) -> str:
  tmp = path + ".tmp.png"
  fig.savefig(tmp, dpi=120, bbox_inches="tight")
  os.replace(tmp, path)
  return path


def plot_runs(run_dirs: Sequence[str], out_dir: str, *, metric: Optional[str] = None) -> List[str]:
  """``curves.png`` and ``clients.png`` of the runs in ``run_dirs`` (see the module docstring)."""
  if isinstance(run_dirs, str) or not run_dirs:
    raise ValueError("run_dirs must be a non-empty list of run directories")
  runs = [read_run(d) for d in run_dirs]
  metric = _main_metric(runs[0], metric)
  groups: Dict[str, List[Dict]] = {}
  for d, run in zip(run_dirs, runs):
    label = run["summary"].get("algorithm") or os.path.basename(os.path.normpath(d))
    groups.setdefault(label, []).append(run)
  plt = _pyplot()
  os.makedirs(out_dir, exist_ok=True)
  row_style = styles.row_styles(list(groups))
  fig, axes = plt.subplots(1, 2, figsize=(11, 4), squeeze=False)
  for label, members in groups.items():
    for ax, stat in zip(axes[0], ("mean", "worst20")):
      curves = []
      for run in members:
        rounds, values = run["metrics"]["round"], run["metrics"].get(f"{metric}_{stat}")
        if values is None:
          raise ValueError(f"a run of {label} has no {metric}_{stat} column")
        keep = np.isfinite(values)
        curves.append((rounds[keep], values[keep]))
      common = sorted(set.intersection(*[set(r.tolist()) for r, _ in curves]))
      table = [(common, [v[list(r).index(x)] for x in common]) for r, v in curves]
      styles.draw_mean_band(ax, table, f"{label} (seeds: {len(members)})", row_style[label])
  for ax, stat in zip(axes[0], ("mean", "worst20")):
    ax.set_xlabel("round")
    ax.set_ylabel(styles.metric_words(metric, stat, test=False))
    ax.grid(alpha=0.3)
  styles.legend_outside(fig, axes)
  fig.suptitle(f"{metric}: mean over seeds, band = range over seeds")
  fig.tight_layout()
  paths = [_save(fig, os.path.join(out_dir, "curves.png"))]
  plt.close(fig)

  fig, ax = plt.subplots(figsize=(6, 4))
  higher = HIGHER_IS_BETTER.get(metric, True)
  for label, members in groups.items():
    color = row_style[label]["color"]
    values = []
    for run in members:
      clients = run["clients"]
      last = np.nanmax(clients["round"])
      values.append(clients[metric][clients["round"] == last])
    values = np.concatenate(values)
    ax.hist(values, bins=30, alpha=0.45, color=color, label=label)
    cut = np.quantile(values, 0.2 if higher else 0.8)
    ax.axvline(cut, color=color, ls="--", lw=1)
  ax.set_xlabel(f"per-client {metric} at the last evaluation")
  ax.set_ylabel("clients")
  ax.set_title("dashed: the worst-20% cut-off")
  styles.legend_outside(fig, [ax])
  fig.tight_layout()
  paths.append(_save(fig, os.path.join(out_dir, "clients.png")))
  plt.close(fig)
  return paths


def plot_sweep(
  sweep_dir: str, out_dir: Optional[str] = None, *, metric: Optional[str] = None, stat: str = "mean"
) -> List[str]:
  """``sweep_<metric>.png``: the final metric over the grid, averaged over seeds."""
  sweep = read_sweep(sweep_dir)
  table, grid = sweep["table"], sweep["grid"]
  fake_run = {"metrics": {k: v for k, v in table.items()}}
  metric = _main_metric(fake_run, metric)
  column = f"{metric}_{stat}"
  if column not in table:
    raise ValueError(f"the sweep has no column {column!r}")
  values = np.where(table["diverged"] > 0, np.nan, table[column])
  out_dir = out_dir or sweep_dir
  os.makedirs(out_dir, exist_ok=True)
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6, 4.5))
  if len(grid) >= 2:
    a, b = grid[0], grid[1]
    xs, ys = np.unique(table[a]), np.unique(table[b])
    heat = np.full((len(ys), len(xs)), np.nan)
    for i, yv in enumerate(ys):
      for j, xv in enumerate(xs):
        sel = (table[a] == xv) & (table[b] == yv)
        if np.any(sel) and np.any(np.isfinite(values[sel])):
          heat[i, j] = np.nanmean(values[sel])
    im = ax.imshow(heat, origin="lower", aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(xs)), [f"{v:g}" for v in xs])
    ax.set_yticks(range(len(ys)), [f"{v:g}" for v in ys])
    ax.set_xlabel(a)
    ax.set_ylabel(b)
    lo, hi = np.nanmin(heat), np.nanmax(heat)
    for i in range(len(ys)):
      for j in range(len(xs)):
        if np.isfinite(heat[i, j]):
          bright = hi > lo and (heat[i, j] - lo) / (hi - lo) > 0.6
          color = "k" if bright else "w"
          ax.text(j, i, f"{heat[i, j]:.3g}", ha="center", va="center", fontsize=7, color=color)
    fig.colorbar(im, ax=ax, label=column)
    if len(grid) > 2:
      ax.set_title(f"averaged over seeds and {', '.join(grid[2:])}", fontsize=9)
  elif len(grid) == 1:
    a = grid[0]
    xs = np.unique(table[a])
    ys = [
      np.nanmean(values[table[a] == x]) if np.any(np.isfinite(values[table[a] == x])) else np.nan
      for x in xs
    ]
    ax.plot(xs, ys, marker="o")
    ax.set_xscale("log" if np.all(xs > 0) and xs.max() / xs.min() > 20 else "linear")
    ax.set_xlabel(a)
    ax.set_ylabel(column)
    ax.grid(alpha=0.3)
  else:
    raise ValueError("the sweep has no grid parameters to plot (only seeds)")
  fig.suptitle(f"{sweep['algorithm']}: final {column}, mean over seeds")
  fig.tight_layout()
  path = _save(fig, os.path.join(out_dir, f"sweep_{metric}.png"))
  plt.close(fig)
  return [path]


def plot(
  dirs: Sequence[str], out_dir: Optional[str] = None, *, metric: Optional[str] = None
) -> List[str]:
  """Plots every directory: sweep directories one by one, run directories together."""
  if isinstance(dirs, str):
    dirs = [dirs]
  if not dirs:
    raise ValueError("give at least one directory to plot")
  for d in dirs:
    if not os.path.isdir(d):
      raise ValueError(f"{d!r} is not a directory")
  sweeps = [d for d in dirs if os.path.exists(os.path.join(d, "sweep.csv"))]
  runs = [d for d in dirs if d not in sweeps]
  paths = []
  for d in sweeps:
    paths += plot_sweep(d, out_dir, metric=metric)
  if runs:
    paths += plot_runs(runs, out_dir or runs[0], metric=metric)
  return paths
