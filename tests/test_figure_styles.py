"""The published figures a reader can read: every published record that a plot function draws
from its JSON alone is drawn again here (into ``tmp_path``) and its matplotlib figure inspected:
no two rows share a (colour, marker, line style), one line per row per panel (the mean over
seeds, not a line per seed), the legend outside the data area, STAND-IN written inside a
stand-in's image. The checker is shown to catch a duplicated style, a line per seed, a legend on
the data and a missing STAND-IN."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402

from fedjax_dro.common import styles  # noqa: E402
from tests.helpers import load_benchmark  # noqa: E402

# (json path, record, plot function) of every published figure drawable from its record
REPLOT = load_benchmark("replot")
RECORDS = REPLOT.published_figures()


def _draw(record, plot, path, monkeypatch):
  """Draws ``record`` with ``plot`` into ``path``; returns the figure (``plt.close`` is held
  back while drawing)."""
  kept = []
  monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
  plot(record, str(path))
  monkeypatch.undo()
  figs = [f for f in kept if f is not None]
  assert len(figs) == 1 and path.stat().st_size > 1000
  return figs[0]


def _row_lines(fig):
  """``[(axes index, label, (colour, marker, linestyle))]`` of the labelled lines (rows): plain
  lines and the data lines of error bars (whose label is on their container)."""
  out = []
  for i, ax in enumerate(fig.axes):
    labelled = [(line.get_label(), line) for line in ax.get_lines()]
    labelled += [
      (c.get_label(), c.lines[0])
      for c in ax.containers
      if isinstance(c, ErrorbarContainer) and c.lines[0] is not None
    ]
    for label, line in labelled:
      if label.startswith("_"):
        continue
      style = (mcolors.to_hex(line.get_color()), str(line.get_marker()), line.get_linestyle())
      out.append((i, label, style))
  return out


def style_problems(fig, rows=None, stand_in=False):
  """What makes a figure hard to read, in words (``[]`` when nothing):
  * two rows with the same (colour, marker, linestyle), or one row drawn in two styles;
  * more than one line of a row in one panel (a line per seed);
  * a row of ``rows`` with no line at all;
  * a legend on an axes' data area (a figure legend, or an axes legend outside its axes, is fine);
  * a stand-in without the text STAND-IN in the image."""
  problems = []
  lines = _row_lines(fig)
  style_of = {}
  for _, label, style in lines:
    if style_of.setdefault(label, style) != style:
      problems.append(f"{label} drawn in two styles")
  seen = {}
  for label, style in style_of.items():
    if style in seen:
      problems.append(f"{label} and {seen[style]} share the style {style}")
    seen.setdefault(style, label)
  per_panel = {}
  for i, label, _ in lines:
    per_panel[(i, label)] = per_panel.get((i, label), 0) + 1
  problems += [f"{n} lines of {label} in panel {i}" for (i, label), n in per_panel.items() if n > 1]
  if rows is not None:
    problems += [f"no line of {label}" for label in rows if label not in style_of]
  fig.canvas.draw()
  renderer = fig.canvas.get_renderer()
  for ax in fig.axes:
    legend = ax.get_legend()
    if legend is not None and legend.get_window_extent(renderer).overlaps(ax.bbox):
      problems.append("a legend on the data area")
  if lines and not fig.legends and not any(ax.get_legend() for ax in fig.axes):
    problems.append("no legend")
  texts = [t.get_text() for t in fig.texts]
  texts += [ax.get_title() for ax in fig.axes]
  if fig._suptitle is not None:
    texts.append(fig._suptitle.get_text())
  if stand_in and not any(styles.STAND_IN in t for t in texts):
    problems.append("a stand-in without STAND-IN")
  return problems


def test_the_published_records_are_found():
  comparisons = [p for p, r, _ in RECORDS if REPLOT.is_comparison(r)]
  # four own figures (FGDRO Figure 1, privacy, SCAFF-PD Fig. 2 and 3); Table 7 is comparisons now
  assert len(comparisons) >= 21 and len(RECORDS) >= len(comparisons) + 4
  assert all(p.with_suffix(".png").exists() for p, _, _ in RECORDS)
  assert any(styles.is_stand_in(r) for _, r, _ in RECORDS)


@pytest.mark.parametrize("path,record,plot", RECORDS, ids=[str(r[0].stem) for r in RECORDS])
def test_published_figure_is_readable(path, record, plot, tmp_path, monkeypatch):
  fig = _draw(record, plot, tmp_path / (path.stem + ".png"), monkeypatch)
  try:
    rows = None
    if REPLOT.is_comparison(record):
      rows = [
        s["label"]
        for s in record["strategies"]
        if any(not r.get("failed") for r in record["per_seed"].get(s["label"], []))
      ]
    stand_in = styles.is_stand_in(record) or (
      "fig3" in record and styles.is_stand_in(record["fig3"])
    )
    assert style_problems(fig, rows, stand_in) == []
    assert len({label for _, label, _ in _row_lines(fig)}) >= 2
    if REPLOT.is_comparison(record):
      assert styles.metric_words(record["metric"]["name"]) in fig.axes[0].get_ylabel()
      assert fig._suptitle.get_text().replace("\n", " ") == styles.title_of(record, 10**6)
  finally:
    plt.close(fig)


def test_stand_ins_are_recognised():
  assert styles.is_stand_in({"name": "fgdro_table3_poverty_standin"})
  assert styles.is_stand_in({"name": "x", "description": "FGDRO Table 3 (STAND-IN)"})
  assert styles.is_stand_in({"name": "x", "description": "Karula Sec. 5.3, stand-in: 40 writers"})
  assert styles.is_stand_in({"title": "t", "stand_in": True})
  assert not styles.is_stand_in({"name": "karula_heart_hospitals", "description": "UCI heart"})


def test_forty_rows_get_forty_styles():
  labels = [f"row {i}" for i in range(40)]
  got = styles.row_styles(labels)
  assert list(got) == labels
  assert len({tuple(s.values()) for s in got.values()}) == 40
  assert len({(s["color"], s["marker"]) for s in got.values()}) == 40
  assert len({tuple(s.values()) for s in styles.row_styles(range(560)).values()}) == 560


def test_mean_band_aligns_or_interpolates():
  x, mean, low, high, count = styles.mean_band([([1, 2, 3], [1, 2, 3]), ([1, 2, 3], [3, 4, 5])])
  assert x.tolist() == [1, 2, 3] and mean.tolist() == [2, 3, 4]
  assert low.tolist() == [1, 2, 3] and high.tolist() == [3, 4, 5] and count.tolist() == [2, 2, 2]
  x, mean, low, high, count = styles.mean_band([([0, 2], [0, 2]), ([0, 1, 3], [2, 2, 2])])
  assert x.tolist() == [0, 1, 2, 3] and count.tolist() == [2, 2, 2, 1]
  assert mean.tolist() == [1, 1.5, 2, 2]
  assert styles.mean_band([([1.0], [float("nan")])])[0].size == 0


def _figure(per_seed_lines=False, same_style=False, legend_inside=False, stand_in=False):
  fig, ax = plt.subplots()
  row_style = styles.row_styles(["a", "b"])
  if same_style:
    row_style["b"] = row_style["a"]
  for label in ("a", "b"):
    for seed in range(3 if per_seed_lines else 1):
      ax.plot([0, 1], [seed, seed + 1], label=label, **row_style[label])
  if legend_inside:
    ax.legend(loc="center")
  else:
    styles.legend_outside(fig, [ax])
  if stand_in:
    styles.mark_stand_in(fig)
  return fig


@pytest.mark.parametrize(
  "kwargs,problem",
  [
    ({}, None),
    ({"same_style": True}, "share the style"),
    ({"per_seed_lines": True}, "3 lines of a in panel 0"),
    ({"legend_inside": True}, "a legend on the data area"),
  ],
)
def test_the_checker_can_fail(kwargs, problem):
  fig = _figure(**kwargs)
  try:
    found = style_problems(fig, rows=["a", "b"], stand_in=False)
    if problem is None:
      assert found == []
    else:
      assert any(problem in p for p in found), found
  finally:
    plt.close(fig)


def test_the_stand_in_check_can_fail():
  for marked in (False, True):
    fig = _figure(stand_in=marked)
    try:
      found = style_problems(fig, rows=["a", "b", "c"], stand_in=True)
      assert ("a stand-in without STAND-IN" in found) is (not marked)
      assert "no line of c" in found
    finally:
      plt.close(fig)


def _seed(seed, xs=None, values=None, failed=False, rounds=4, value=0.5):
  curve = [{"round": x, "uploads": 10.0 * x, "value": v} for x, v in zip(xs or [], values or [])]
  return {
    "seed": seed,
    "failed": failed,
    "curve": curve,
    "rounds": rounds,
    "value": value,
    "spent": {"upload_floats": 10.0 * rounds},
  }


def test_plot_comparison_averages_seeds_and_keeps_rows_without_curves(tmp_path, monkeypatch):
  """Seeds on different x points give one mean line with a band; a failed seed is left out; a
  row whose seeds have no curve is drawn at its final value; a STAND-IN name is marked."""
  record = {
    "name": "tiny_standin",
    "description": "A tiny comparison",
    "metric": {"name": "accuracy", "stat": "worst20", "higher_is_better": True},
    "strategies": [{"label": "A"}, {"label": "B"}, {"label": "C"}],
    "per_seed": {
      "A": [
        _seed(0, [1, 2, 4], [0.1, 0.2, 0.4]),
        _seed(1, [1, 3], [0.3, 0.5]),
        _seed(2, [1, 2], [9.0, 9.0], failed=True),
      ],
      "B": [_seed(0), _seed(1, value=0.7)],
      "C": [_seed(0, failed=True)],
    },
  }
  fig = _draw(record, REPLOT.plot_comparison, tmp_path / "tiny.png", monkeypatch)
  try:
    assert style_problems(fig, rows=["A", "B"], stand_in=True) == []
    line = next(ln for ln in fig.axes[0].get_lines() if ln.get_label() == "A")
    assert line.get_xdata().tolist() == [1, 2, 3, 4]
    assert line.get_ydata().tolist() == pytest.approx([0.2, 0.3, 0.4, 0.4])  # 9.0 left out
    assert len(fig.axes[0].collections) == 2  # the bands of A and of B (B's: one x point)
    line = next(ln for ln in fig.axes[0].get_lines() if ln.get_label() == "B")
    assert line.get_xdata().tolist() == [4] and line.get_ydata().tolist() == [0.6]
    assert "C" not in {label for _, label, _ in _row_lines(fig)}
    assert "worst 20% of clients" in fig.axes[0].get_ylabel()
    assert fig._suptitle.get_text() == "A tiny comparison"
  finally:
    plt.close(fig)
