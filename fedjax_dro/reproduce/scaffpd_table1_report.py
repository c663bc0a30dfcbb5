"""The tables and the Fig. 3 figure of ``fedjax-dro reproduce scaffpd-table1``
(:mod:`fedjax_dro.reproduce.scaffpd_table1`) from its JSON result."""

from __future__ import annotations

import math
from typing import Any, Dict, List

from fedjax_dro.compare.report import capped_runs
from fedjax_dro.reproduce.common import edges_line
from fedjax_dro.reproduce.scaffpd_table1_data import WEIGHTING


def _pct(entry, two_se=True) -> str:
  m, s = entry["mean"], entry["two_se"]
  if not math.isfinite(m):
    return "-"
  return f"{100 * m:.2f}" + (f" +- {100 * s:.2f}" if two_se and math.isfinite(s) else "")


def _paired_cells(d, higher_is_better: bool = True) -> List[str]:
  """A paired difference's cells: mean +- 2 SE (points), p (Holm-adjusted when recorded), the
  verdict in words and the win count; the reference's cells."""
  from fedjax_dro.compare.stats import verdict

  if d is None:
    return ["(reference)", "-", "-", "-"]
  p = d.get("holm_p", d.get("p_value", math.nan))
  return [
    _pct({"mean": d["difference"], "two_se": d["difference_2se"]}),
    f"{p:.2g}" if math.isfinite(p) else "-",
    verdict(d, higher_is_better=higher_is_better).split(" (")[0],
    f"{d['wins']} of {d['seeds']}",
  ]


def markdown_table(result: Dict[str, Any]) -> str:
  """Table 1's layout, one block per alpha and budget (to a validation plateau; at equal
  uploads): worst-20% and average test accuracy (%, mean +- 2 SE over seeds), the paired
  worst-20% difference against SCAFF-PD with its p-value (paired t-test, Holm-adjusted over
  the block), verdict and win count, the rounds, uploads and configurations each row spent,
  failures, and the paper's CIFAR-100 numbers beside; the Fig. 3 rows."""
  ds, st = result["dataset"], result["setting"]
  units = result["smoothness"]
  title = (
    f"**STAND-IN data** ({ds['note']})" if ds["stand_in"] else f"features file `{ds['source']}`"
  )
  spent = result.get("run_seconds")
  lines = [
    f"SCAFF-PD Table 1 reproduction on {title}: {ds['num_classes']} classes, d = {ds['dim']}, "
    f"N = {st['num_clients']}, seeds {st['seeds']}"
    + (" (**quick smoke run**)" if st["quick"] else "")
    + (f"; the runs took {spent:.0f} s in all" if spent else "")
    + f" (this call: {result['wall_time_s']:.0f} s wall, {result['cpu_time_s']:.0f} CPU s). "
    "Accuracy in %, mean +- 2 SE over seeds; every row selected per seed on validation "
    f"worst-20% accuracy among 9 configurations (+ widenings) trained {st['budget']['cap']} "
    "rounds, then trained to a validation plateau (at most "
    f"{st['budget']['cap']} rounds) and, in the second block of each alpha, for the rounds "
    f"whose uploads match FedAvg's {st['budget']['cap']} rounds. Step sizes from "
    f"1 / L_minibatch = {units['inverse_minibatch']:.3g} to 1 / L_full = "
    f"{units['inverse_full_batch']:.3g} (L_full = {units['L_full_batch']:.4g}, "
    f"L_minibatch({units['minibatch_size']}) = {units['L_minibatch']:.4g}). p: paired t-test "
    "over seeds, Holm-adjusted over a block's comparisons; 'within noise': p >= 0.05.",
    "",
  ]
  paper = result["paper_table1"]["CIFAR-100"]
  blocks = [("to a validation plateau", a, rec) for a, rec in result["results"].items()]
  blocks += [
    ("at equal uploads", a, rec) for a, rec in (result.get("results_uploads") or {}).items()
  ]
  blocks.sort(key=lambda b: float(b[1]))
  for how, alpha, rec in blocks:
    ref = rec["reference"]
    lines += [
      f"Dir({alpha}), {how}:",
      "",
      f"| algorithm | weighting | worst-20% | average | worst-20% minus {ref} (paired) | p | "
      f"against {ref} | better in | rounds | uploaded floats | configs | failures | paper "
      "CIFAR-100 worst-20% / avg |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in rec["strategies"]:
      label, t = s["label"], rec["table"][s["label"]]
      p = paper.get(label, {}).get(alpha)
      floats = t.get("spent", {}).get("upload_floats", math.nan)
      cells = [
        label,
        WEIGHTING.get(label, "-"),
        _pct(t["accuracy"]),
        _pct(t["average accuracy"]),
        *_paired_cells(rec["paired"]["accuracy"].get(label)),
        f"{t['rounds']:.0f}" if math.isfinite(t["rounds"]) else "-",
        f"{floats:.3g}" if math.isfinite(floats) else "-",
        f"{t['configurations']:.3g}" if math.isfinite(t["configurations"]) else "-",
        str(t["failures"]),
        "-" if p is None else f"{p[1]:.2f} / {p[0]:.2f}",
      ]
      lines.append("| " + " | ".join(cells) + " |")
    capped = capped_runs(rec)
    lines += ["", edges_line(rec)]
    if capped is not None:
      lines.append(
        "Runs stopped by the cap (no plateau within it, or uploads that would pay for more "
        f"rounds): {len(capped)} of {sum(map(len, rec['per_seed'].values()))}"
        + (" (" + "; ".join(capped) + ")." if capped else ".")
      )
    lines.append("")
  fig3 = result.get("fig3")
  if fig3:
    lines += [
      f"Fig. 3 (Dir({result['setting']['fig3_alpha']:g})): test worst-20% accuracy (%) by rho, "
      "mean +- 2 SE over seeds:",
      "",
      "| row | worst-20% | minus SCAFF-PD (rho = 0.1, paired) | p | against SCAFF-PD | better in "
      "| rounds |",
      "|---|---|---|---|---|---|---|",
    ]
    for s in fig3["strategies"]:
      t = fig3["table"][s["label"]]
      cells = _paired_cells(fig3["paired"]["accuracy"].get(s["label"]))
      lines.append(
        f"| {s['label']} | {_pct(t['accuracy'])} | " + " | ".join(cells) + f" | {t['rounds']:.0f} |"
      )
  return "\n".join(lines) + "\n"


def plot_scaffpd_fig3(result: Dict[str, Any], path: str) -> str:
  """Fig. 3 (b): SCAFF-PD's test worst-20% accuracy during the final runs for each rho, with
  SCAFFOLD, the mean over seeds with their range (:func:`fedjax_dro.compare.plot_comparison`
  of the Fig. 3 comparison)."""
  from fedjax_dro.compare import plot_comparison

  return plot_comparison(result["fig3"], path)
