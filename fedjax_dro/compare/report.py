"""The record of a comparison: per-seed rows, the table (mean +- 2 SE), paired differences (with
the paired t-test's p-value and 95% interval, the sign test, Holm-adjusted p-values above three
comparisons), the budget each strategy spent, the edges its choices sit on, failures; JSON,
markdown and plots."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Dict, List, Optional

import numpy as np

from fedjax_dro.compare.stats import holm, mean_2se, paired_difference, verdict
from fedjax_dro.core.costs import COST_FIELDS

HOLM_ABOVE = 3  # a metric with more comparisons than this gets Holm-adjusted p-values
LOG_AXIS_SPAN = 1e3  # a positive metric spanning more than this factor is plotted on a log axis

COST_LABELS = {
  "uploading_clients": "uploads (messages)",
  "upload_floats": "uploaded floats",
  "gradient_evaluations": "client gradients",
  "sequential_steps": "sequential steps",
}


@dataclasses.dataclass
class ComparisonResult:
  """What :func:`fedjax_dro.compare.compare` returns.

  Attributes:
    name, description: the experiment's.
    protocol: the protocol in words (:meth:`Protocol.describe`).
    metric: ``{"name", "stat", "higher_is_better"}`` of the reported metric.
    strategies: per strategy ``{"label", "paper", "note", "grid_configurations"}``.
    reference: the strategy of the paired differences.
    per_seed: ``{label: [row]}``, a row per seed: ``seed``, ``failed`` (and ``failure``),
      ``value`` (the test metric), ``extra``, ``chosen``, ``selection_score``, ``rounds``,
      ``spent`` / ``per_round`` / ``setup`` (:mod:`fedjax_dro.core.costs` counts), ``tuning``,
      ``configurations``, ``widened``, ``edges``, ``curve``, ``seconds``.
    table: ``{label: {...}}``: ``mean`` and ``two_se`` of the metric over the seeds the failure
      policy keeps, the same for every extra metric, the mean budget spent, ``failures``.
    paired: ``{metric: {label: paired_difference}}`` against ``reference`` (mean, 2 SE, t,
      ``p_value``, ``ci95_low`` / ``ci95_high``, wins / losses / ties, ``sign_p``); when a
      metric has more than three comparisons (``HOLM_ABOVE``), each also has ``holm_p``, its
      p-value Holm-adjusted over that metric's comparisons.
    kept_seeds: the seeds every row's statistics use.
    edges: ``[{"strategy", "seed", "axis", "edge", "value"}]``: choices left on a grid edge.
    failures: ``[{"strategy", "seed", "failure"}]``.
    wall_time: seconds.
  """

  name: str
  description: str
  protocol: Dict[str, Any]
  metric: Dict[str, Any]
  extra_metrics: List[Dict[str, Any]]
  strategies: List[Dict[str, Any]]
  reference: str
  per_seed: Dict[str, List[Dict[str, Any]]]
  table: Dict[str, Dict[str, Any]]
  paired: Dict[str, Dict[str, Dict[str, float]]]
  kept_seeds: List[int]
  edges: List[Dict[str, Any]]
  failures: List[Dict[str, Any]]
  wall_time: float

  def to_json(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)

  def to_markdown(self) -> str:
    return comparison_markdown(self.to_json())

  def save(self, out_dir: str) -> List[str]:
    """Writes ``NAME.json``, ``NAME.md`` and ``NAME.png`` (atomically); returns their paths."""
    from fedjax_dro.records.files import atomic_write
    from fedjax_dro.records.history import json_text

    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, self.name)
    atomic_write(stem + ".json", json_text(self.to_json(), indent=1))
    atomic_write(stem + ".md", self.to_markdown())
    plot_comparison(self.to_json(), stem + ".png")
    return [stem + ".json", stem + ".md", stem + ".png"]


def summarize_rows(experiment, rows, *, wall_time: float) -> ComparisonResult:
  """The :class:`ComparisonResult` of the per-seed ``rows`` under the experiment's failure
  policy (the same for every row)."""
  protocol = experiment.protocol
  metric = protocol.metric
  labels = [s.label for s in experiment.strategies]
  seeds = list(protocol.seeds)
  failed = {s: any(r["seed"] == s and r["failed"] for k in labels for r in rows[k]) for s in seeds}
  if protocol.on_failure == "drop_seed":
    kept = [s for s in seeds if not failed[s]]
  else:
    kept = seeds
  columns = [(metric.name, metric.higher_is_better, lambda r: r["value"])] + [
    (e.name, e.higher_is_better, (lambda r, n=e.name: r["extra"].get(n, math.nan)))
    for e in experiment.extra_metrics
  ]

  def values(label, get):
    out = []
    for r in rows[label]:
      if r["seed"] not in kept:
        continue
      out.append(protocol.failure_score if r["failed"] else get(r))
    return out

  table, paired = {}, {name: {} for name, _, _ in columns}
  ref = experiment.reference
  for label in labels:
    entry: Dict[str, Any] = {}
    for name, higher, get in columns:
      v = values(label, get)
      m, two_se = mean_2se(v)
      entry[name] = {"mean": m, "two_se": two_se}
      if label != ref and v:
        paired[name][label] = paired_difference(v, values(ref, get), higher_is_better=higher)
    ok = [r for r in rows[label] if not r["failed"] and r["seed"] in kept]
    entry["spent"] = {
      f: float(np.mean([r["spent"][f] for r in ok])) if ok else math.nan for f in COST_FIELDS
    }
    entry["rounds"] = float(np.mean([r["rounds"] for r in ok])) if ok else math.nan
    entry["configurations"] = float(np.mean([r["configurations"] for r in ok])) if ok else math.nan
    entry["failures"] = sum(r["failed"] for r in rows[label])
    entry["seeds"] = len(values(label, lambda r: r["value"]))
    table[label] = entry
  for family in paired.values():
    if len(family) > HOLM_ABOVE:
      adjusted = holm([d["p_value"] for d in family.values()])
      for d, h in zip(family.values(), adjusted):
        d["holm_p"] = h
  edges = [
    {"strategy": k, "seed": r["seed"], **e}
    for k in labels
    for r in rows[k]
    for e in r.get("edges", [])
  ]
  failures = [
    {"strategy": k, "seed": r["seed"], "failure": r["failure"]}
    for k in labels
    for r in rows[k]
    if r["failed"]
  ]
  return ComparisonResult(
    name=experiment.name,
    description=experiment.description,
    protocol=protocol.describe(),
    metric={"name": metric.name, "stat": metric.stat, "higher_is_better": metric.higher_is_better},
    extra_metrics=[
      {"name": e.name, "higher_is_better": e.higher_is_better} for e in experiment.extra_metrics
    ],
    strategies=[
      {
        "label": s.label,
        "paper": s.paper,
        "note": s.note,
        "grid_configurations": s.num_configurations,
      }
      for s in experiment.strategies
    ],
    reference=ref,
    per_seed=rows,
    table=table,
    paired=paired,
    kept_seeds=kept,
    edges=edges,
    failures=failures,
    wall_time=float(wall_time),
  )


def _pm(m, s, digits=4) -> str:
  if not math.isfinite(m):
    return "-"
  return f"{m:.{digits}g}" + ("" if not math.isfinite(s) else f" +- {s:.2g}")


def _p(v) -> str:
  return "-" if v is None or not math.isfinite(v) else f"{v:.2g}"


def _ci(d) -> str:
  low, high = d.get("ci95_low"), d.get("ci95_high")
  if low is None or not (math.isfinite(low) and math.isfinite(high)):
    return "-"
  return f"[{low:.3g}, {high:.3g}]"


def comparison_markdown(result: Dict[str, Any]) -> str:
  """The markdown of a :class:`ComparisonResult` (as its JSON dict): the protocol, the table
  with the budget columns and paired differences, the per-seed choices, edges and failures.

  Args:
    result: ``ComparisonResult.to_json()`` (or the JSON file's contents).
  """
  metric = result["metric"]
  name = f"{metric['name']} ({metric['stat']})"
  ref = result["reference"]
  extras = [e["name"] for e in result["extra_metrics"]]
  p = result["protocol"]
  lines = [
    f"**{result['name']}**" + (f": {result['description']}" if result["description"] else ""),
    "",
  ]
  lines += [f"- {k.replace('_', ' ')}: {v}" for k, v in p.items() if v is not None]
  lines += [f"- statistics over seeds {result['kept_seeds']}", ""]
  head = ["strategy", f"test {name} (+-2SE)"] + [f"{e} (+-2SE)" for e in extras]
  paired = result["paired"][metric["name"]]
  with_holm = any("holm_p" in d for d in paired.values())
  head += [f"minus {ref} (paired +-2SE)", "p", "95% CI"] + (["Holm p"] if with_holm else [])
  head += ["better in (sign p)", "rounds"]
  head += [COST_LABELS[f] for f in COST_FIELDS if f != "uploading_clients"]
  head += ["configs", "failures"]
  lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  notes = []
  for s in result["strategies"]:
    label = s["label"]
    t = result["table"][label]
    cells = [label + ("" if s["paper"] else " (not in the paper)")]
    cells.append(_pm(t[metric["name"]]["mean"], t[metric["name"]]["two_se"]))
    cells += [_pm(t[e]["mean"], t[e]["two_se"]) for e in extras]
    d = paired.get(label)
    if d is None:
      cells += ["(reference)", "-", "-"] + (["-"] if with_holm else []) + ["-"]
    else:
      cells += [_pm(d["difference"], d["difference_2se"]), _p(d.get("p_value")), _ci(d)]
      cells += [_p(d.get("holm_p"))] if with_holm else []
      sign = "" if d.get("sign_p") is None else f" ({_p(d['sign_p'])})"
      cells.append(f"{d['wins']} of {d['seeds']}{sign}")
    cells.append("-" if not math.isfinite(t["rounds"]) else f"{t['rounds']:.4g}")
    cells += [
      "-" if not math.isfinite(t["spent"][f]) else f"{t['spent'][f]:.4g}"
      for f in COST_FIELDS
      if f != "uploading_clients"
    ]
    cells += [
      f"{t['configurations']:.3g}" if math.isfinite(t["configurations"]) else "-",
      str(t["failures"]),
    ]
    lines.append("| " + " | ".join(cells) + " |")
    if s["note"]:
      notes.append(f"- {label}: {s['note']}")
  said = [
    f"{s['label']} {verdict(paired[s['label']], higher_is_better=metric['higher_is_better'])}"
    for s in result["strategies"]
    if s["label"] in paired
  ]
  if said:
    lines += [
      "",
      f"Against {ref} (paired t-test over seeds, two-sided"
      + (", Holm-adjusted over the table's comparisons" if with_holm else "")
      + "; 'within noise': p >= 0.05): "
      + "; ".join(said)
      + ".",
    ]
  if notes:
    lines += ["", "Grids:"] + notes
  lines += ["", "Per-seed choices (test metric; rounds):", ""]
  lines += [
    "| strategy | seed | chosen | held-out score | test | rounds |",
    "|---|---|---|---|---|---|",
  ]
  for s in result["strategies"]:
    for r in result["per_seed"][s["label"]]:
      if r["failed"]:
        lines.append(f"| {s['label']} | {r['seed']} | failed: {r['failure'][:80]} | - | - | - |")
        continue
      chosen = (
        ", ".join(
          f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["chosen"].items()
        )
        or "-"
      )
      score = "-" if r["selection_score"] is None else f"{r['selection_score']:.4g}"
      lines.append(
        f"| {s['label']} | {r['seed']} | {chosen} | {score} | {r['value']:.4g} | {r['rounds']} |"
      )
  lines += [
    "",
    "Choices on a grid edge after widening: "
    + (
      "none."
      if not result["edges"]
      else "; ".join(
        f"{e['strategy']} seed {e['seed']} {e['axis']}={e['value']:.3g} ({e['edge']}"
        + (", across sub-grids)" if e.get("across") else ")")
        for e in result["edges"]
      )
      + "."
    ),
  ]
  capped = capped_runs(result)
  if capped is not None:
    lines.append(
      "Runs stopped by the budget's cap (no plateau within it, or an equal spend that would pay "
      "for more rounds): " + ("none." if not capped else "; ".join(capped) + ".")
    )
  lines += [
    "Failures: "
    + (
      "none."
      if not result["failures"]
      else "; ".join(
        f"{f['strategy']} seed {f['seed']} ({f['failure'][:80]})" for f in result["failures"]
      )
      + "."
    )
  ]
  return "\n".join(lines) + "\n"


def plot_comparison(result: Dict[str, Any], path: str) -> str:
  """The reported metric against rounds and against uploaded floats: per strategy one line, the
  mean over the seeds' final runs, with a band from their minimum to their maximum (one colour,
  marker and line style per strategy, :func:`fedjax_dro.common.styles.row_styles`); a seed
  without a curve contributes its final value at its final round. A positive metric whose values
  span more than :data:`LOG_AXIS_SPAN` (a distance to an optimum) is drawn on a log axis. Titled
  with the record's description, marked STAND-IN for a stand-in; returns ``path``.

  Args:
    result: ``ComparisonResult.to_json()``.
    path: the PNG to write.
  """
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import matplotlib.ticker

  from fedjax_dro.common import styles

  metric = result["metric"]
  labels = [s["label"] for s in result["strategies"]]
  row_style = styles.row_styles(labels)
  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  seeds, drawn = set(), []
  for label in labels:
    curves: Dict[str, list] = {"round": [], "uploads": []}
    for r in result["per_seed"].get(label, []):
      if r.get("failed"):
        continue
      points = r.get("curve") or []
      if not points and r.get("value") is not None and r.get("rounds"):
        uploads = (r.get("spent") or {}).get("upload_floats", 0.0)
        points = [{"round": r["rounds"], "uploads": uploads, "value": r["value"]}]
      if points:
        seeds.add(r.get("seed"))
      for key in curves:
        kept = [p for p in points if p[key] > 0]  # a strategy that uploads nothing has no x here
        if kept:
          curves[key].append(([p[key] for p in kept], [p["value"] for p in kept]))
          drawn += [p["value"] for p in kept]
    for ax, key in zip(axes, ("round", "uploads")):
      styles.draw_mean_band(ax, curves[key], label, row_style[label])
  finite = [v for v in drawn if v is not None and math.isfinite(v)]
  if finite and min(finite) > 0 and max(finite) > LOG_AXIS_SPAN * min(finite):
    axes[0].set_yscale("log")  # shared by both panels
  axes[0].set_xlabel("communication rounds")
  axes[1].set_xlabel("uploaded floats (all clients)")
  axes[1].set_xscale("log")
  axes[1].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
  axes[0].set_ylabel(styles.metric_words(metric["name"], metric["stat"]))
  for ax in axes:
    ax.grid(alpha=0.3)
  styles.legend_outside(fig, axes)
  fig.suptitle(styles.title_of(result), fontsize=10)
  fig.text(
    0.5, 0.90, f"line: mean over {len(seeds)} seed(s); band: minimum to maximum over seeds",
    ha="center", fontsize=8, color="0.3",
  )  # fmt: skip
  if styles.is_stand_in(result):
    styles.mark_stand_in(fig)
  fig.tight_layout(rect=(0, 0.03, 1, 0.9))
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return path


def capped_runs(record: Dict[str, Any]) -> Optional[List[str]]:
  """The runs of a comparison record that its budget's cap stopped, ``"LABEL seed S (R
  rounds)"`` each, in the table's order; ``None`` for a record whose rows do not say (older
  records)."""
  if not any("at_cap" in r for rows in record["per_seed"].values() for r in rows):
    return None
  return [
    f"{s['label']} seed {r['seed']} ({r['rounds']} rounds)"
    for s in record["strategies"]
    for r in record["per_seed"][s["label"]]
    if r.get("at_cap")
  ]
