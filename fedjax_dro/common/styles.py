"""One look for every published figure: a distinct (colour, marker, line style) per table row,
the mean over seeds with a band, the reported metric named in words, the legend outside the data
and stand-ins labelled STAND-IN inside the image.

Used by :func:`fedjax_dro.compare.report.plot_comparison`, the reproductions' own plots and
:mod:`fedjax_dro.records.plots`. matplotlib is imported only by the functions that draw.
"""

from __future__ import annotations

import textwrap
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

# tab20's dark shades first (tab10-like), then its light shades: neighbouring rows differ in hue.
_TAB20 = (
  "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
  "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5",
  "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
)  # fmt: skip
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LINESTYLES = ("-", "--", "-.", ":")
STAND_IN = "STAND-IN"

_STAT_WORDS = {
  "mean": "mean over clients",
  "weighted_mean": "mean over clients, weighted by examples",
  "worst20": "mean of the worst 20% of clients",
  "best20": "mean of the best 20% of clients",
  "worst": "worst client",
  "split": "on the held-out split",
}
_NAME_WORDS = {"r2": "R²", "macro_f1": "macro F1", "mse": "mean squared error"}


def row_styles(labels: Sequence[str]) -> Dict[str, Dict[str, str]]:
  """``{label: {"color", "marker", "linestyle"}}``, assigned by position: row ``i`` takes colour
  ``i % 20`` (tab20), marker ``i % 7`` and line style ``i // 140 % 4``, so no two of the first
  560 rows share all three (and no two of the first 140 share a colour and a marker)."""
  out = {}
  for i, label in enumerate(dict.fromkeys(labels)):
    out[label] = {
      "color": _TAB20[i % len(_TAB20)],
      "marker": MARKERS[i % len(MARKERS)],
      "linestyle": LINESTYLES[i // (len(_TAB20) * len(MARKERS)) % len(LINESTYLES)],
    }
  return out


def metric_words(name: str, stat: Optional[str] = None, *, test: bool = True) -> str:
  """A metric as the axis label says it: ``("accuracy", "worst20")`` ->
  ``"test accuracy (mean of the worst 20% of clients)"``."""
  words = _NAME_WORDS.get(name, name.replace("_", " "))
  if test:
    words = f"test {words}"
  if stat:
    words += f" ({_STAT_WORDS.get(stat, stat.replace('_', ' '))})"
  return words


def is_stand_in(record: Dict[str, Any]) -> bool:
  """Whether a result record is a stand-in: a ``name`` ending in ``_standin``, a true
  ``stand_in`` field, or "stand-in" (any case) in its ``description`` or ``title``."""
  if str(record.get("name", "")).endswith("_standin") or record.get("stand_in") is True:
    return True
  text = f"{record.get('description') or ''} {record.get('title') or ''}"
  return STAND_IN.lower() in text.lower()


def title_of(record: Dict[str, Any], width: int = 110) -> str:
  """A figure's title in words: the record's ``description`` (or ``title``), else its name,
  wrapped at ``width`` characters."""
  text = str(record.get("description") or record.get("title") or record.get("name") or "")
  return textwrap.fill(text, width)


def mark_stand_in(fig, note: str = "generated or substitute data, not the paper's experiment"):
  """Labels a figure STAND-IN inside the image: a faint diagonal watermark and a red line of
  text at the bottom left."""
  fig.text(
    0.5, 0.5, STAND_IN, fontsize=64, color="red", alpha=0.12, rotation=25,
    ha="center", va="center", zorder=0,
  )  # fmt: skip
  fig.text(0.005, 0.005, f"{STAND_IN}: {note}", fontsize=8, color="red", ha="left", va="bottom")


def legend_outside(fig, axes, *, fontsize: float = 8):
  """One legend for the figure, to the right of every panel (entries from all ``axes``, each
  label once); returns it. Save with ``bbox_inches="tight"`` so it is kept in the image."""
  handles: Dict[str, Any] = {}
  for ax in np.ravel(axes):
    for h, label in zip(*ax.get_legend_handles_labels()):
      handles.setdefault(label, h)
  if not handles:
    return None
  return fig.legend(
    list(handles.values()),
    list(handles),
    loc="upper left",
    bbox_to_anchor=(1.0, 0.95),
    fontsize=fontsize,
    frameon=False,
  )


def mean_band(
  curves: Sequence[Tuple[Sequence[float], Sequence[float]]],
) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """``(x, mean, low, high, count)`` over seeds' curves ``[(x, y), ...]``: aligned by index when
  every curve has the same x points; else each curve is interpolated linearly onto the union of
  the x points inside its own range, and a point averages the seeds that reach it (``count``).
  ``low`` / ``high`` are the minimum / maximum over those seeds. Non-finite values are skipped."""
  clean = []
  for x, y in curves:
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = np.isfinite(x) & np.isfinite(y)
    if keep.any():
      order = np.argsort(x[keep], kind="stable")
      clean.append((x[keep][order], y[keep][order]))
  if not clean:
    empty = np.zeros(0)
    return empty, empty, empty, empty, empty
  if all(c[0].shape == clean[0][0].shape and np.array_equal(c[0], clean[0][0]) for c in clean):
    grid = clean[0][0]
    table = np.stack([c[1] for c in clean])
  else:
    grid = np.unique(np.concatenate([c[0] for c in clean]))
    table = np.full((len(clean), grid.size), np.nan)
    for i, (x, y) in enumerate(clean):
      inside = (grid >= x[0]) & (grid <= x[-1])
      table[i, inside] = np.interp(grid[inside], x, y)
  count = np.sum(np.isfinite(table), axis=0)
  with np.errstate(all="ignore"):
    mean = np.nanmean(table, axis=0)
    low, high = np.nanmin(table, axis=0), np.nanmax(table, axis=0)
  return grid, mean, low, high, count


def draw_mean_band(ax, curves, label: str, style: Dict[str, str], *, lw: float = 1.4) -> List:
  """Draws the mean over seeds (one line, ``label``, ``style``) and the min..max band (when more
  than one seed reaches a point); returns the drawn line (``[]`` when there is nothing)."""
  x, mean, low, high, count = mean_band(curves)
  if x.size == 0:
    return []
  (line,) = ax.plot(x, mean, label=label, lw=lw, ms=4, **style)
  if np.any(count > 1):
    ax.fill_between(x, low, high, where=count > 1, color=style["color"], alpha=0.15, lw=0)
  return [line]
