"""``fedjax-dro reproduce fgdro-figure1``: FGDRO's Figure 1 ablations on Camelyon17, on the harness.

Guo and Yang, "Communication-Efficient Federated Group Distributionally Robust Optimization",
NeurIPS 2024, arXiv:2410.06369, Sec. 7, Figure 1: (a) the communication interval ``I`` varied on
Camelyon17 for FGDRO-CVaR and FGDRO-KL-Adam ("both ... can tolerate skipping a large number of
communications without degrading the performance"); (b) LocalAdam (Appendix D: ERM with Adam
steps in the local updates) against FedAdam (SGD locally, adaptive steps on the server).

Each is a comparison on the harness with Table 3's protocol (:mod:`fedjax_dro.reproduce.
fgdro_wilds`: held-out-domain selection on hospital 1, report on hospital 2, the paper's step
sizes, 3 seeds). (a): one row per (algorithm, ``I``), ``I`` in :data:`INTERVALS` (the paper's
values are not stated; its Table 3 uses 32), every row given the same 20K local iterations
(``Budget("gradients")``: ``20000 / I`` rounds); (b): the two rows at ``I = 32``, the dataset not
stated for (b) either, Camelyon17 taken as in (a). Without ``--data-dir`` the reader's stand-in
and tiny models (STAND-IN).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

import numpy as np

INTERVALS = (8, 32, 128)
ITERATIONS = 20000  # local iterations of every run


def _row(label, name, steps, batch, clients, grid):
  from fedjax_dro.reproduce.fgdro_wilds import fgdro_strategy

  # FGDRO-KL-Adam's moving-average weights tuned as one (beta2 and beta3 tied to beta1)
  ties = (
    {"beta2": ("beta1", 1.0, 1), "beta3": ("beta1", 1.0, 1)} if name == "fgdro_kl_adam" else None
  )
  return fgdro_strategy(label, name, steps, batch, clients, grid, ties)


def fgdro_figure1(
  out_dir: Optional[str] = None,
  *,
  rounds: Optional[int] = None,
  quick: bool = False,
  seed: int = 0,
  data_dir: Optional[str] = None,
  part=None,
  weights_dir: Optional[str] = None,
  verbose: bool = True,
) -> Optional[Dict[str, Any]]:
  """Runs Figure 1 (a) and (b) (see the module docstring); writes ``fgdro_figure1.{json,md,png}``
  and both comparisons to ``out_dir``.

  Args:
    out_dir: the output folder (``None``: nothing written).
    rounds: rounds at ``I = 32`` (default ``20000 / 32``; 4 with ``quick``); every ``I`` gets the
      same local iterations.
    quick: a smoke run on the stand-in: two step sizes, one seed, ``I`` in (1, 2, 4).
    seed: the first seed (``seed, seed + 1, seed + 2``).
    data_dir: the folder holding the prepared ``camelyon17`` directory (``None``: the stand-in).
    part: ``(i, N)``: only every N-th run (``--part``; ``fedjax-dro merge`` joins the parts).
    weights_dir: a folder holding ``densenet121.safetensors`` (torchvision's ImageNet weights):
      DenseNet-121 starts from it, as in WILDS (``None``: random initialisation).
    verbose: print progress and the tables.
  """
  from fedjax_dro import compare as C
  from fedjax_dro.data import FederatedDataset, load_prepared
  from fedjax_dro.reproduce.common import run_tables
  from fedjax_dro.reproduce.fgdro_wilds import PAPER_BETAS, PAPER_LRS, stand_in_dirs, wilds_model

  stand_in = data_dir is None
  path = (
    stand_in_dirs(out_dir, ("camelyon17",))["camelyon17"]
    if stand_in
    else os.path.join(data_dir, "camelyon17")
  )
  splits = {s: load_prepared(path, s) for s in ("train", "val", "test")}
  train = splits["train"]
  model = wilds_model("camelyon17", train.store, quick, weights_dir)
  intervals, batch = ((1, 2, 4), 2) if quick else (INTERVALS, 32)
  reference_steps = 2 if quick else 32
  rounds = rounds or (4 if quick else ITERATIONS // reference_steps)
  lrs = list(PAPER_LRS[2:] if quick else PAPER_LRS)
  betas = list(PAPER_BETAS[1:3] if quick else PAPER_BETAS)
  n = train.num_clients
  seeds = (seed,) if quick else (seed, seed + 1, seed + 2)

  def protocol(match):
    return C.Protocol(
      seeds=seeds,
      metric=C.Metric("accuracy", "split"),
      reference=match,
      budget=C.Budget("gradients", match=match, rounds=rounds),
      selection="domains",
      max_widenings=0 if quick else 2,
    )

  def data(_seed):
    return FederatedDataset(
      train=splits["train"], validation=splits["val"], test=splits["test"], name="camelyon17"
    )

  suffix = "_standin" if stand_in else ""
  interval_rows = []
  for name, label, second in (
    ("fgdro_cvar", "FGDRO-CVaR", {"alpha": betas}),
    ("fgdro_kl_adam", "FGDRO-KL-Adam", {"beta1": betas}),
  ):
    for steps in intervals:
      grid = {"client_lr": lrs, **second}
      interval_rows.append(_row(f"{label} I={steps}", name, steps, batch, n, grid))
  reference = f"FGDRO-CVaR I={reference_steps if reference_steps in intervals else intervals[0]}"
  experiments = {
    "interval": C.Experiment(
      name="fgdro_figure1a" + suffix,
      data=data,
      model=model,
      strategies=interval_rows,
      protocol=protocol(reference),
      description="FGDRO Figure 1(a): the communication interval I on Camelyon17"
      + (" (STAND-IN)" if stand_in else ""),
    ),
    "local_adam": C.Experiment(
      name="fgdro_figure1b" + suffix,
      data=data,
      model=model,
      strategies=[
        _row(
          "LocalAdam", "local_adam", reference_steps, batch, n, {"client_lr": lrs, "beta3": betas}
        ),
        _row(
          "FedAdam",
          "fedadam",
          reference_steps,
          batch,
          n,
          {"client_lr": lrs, "server_lr": lrs[: len(betas)]},
        ),
      ],
      protocol=protocol("LocalAdam"),
      description="FGDRO Figure 1(b): LocalAdam against FedAdam on Camelyon17"
      + (" (STAND-IN)" if stand_in else ""),
    ),
  }
  result = run_tables(
    "fgdro-figure1",
    experiments,
    lambda r: _markdown(r, stand_in),
    out_dir,
    verbose,
    quick=quick,
    part=part,
    stand_in=stand_in,
    intervals=list(intervals),
    local_iterations=rounds * reference_steps,
    pretrained=weights_dir is not None,
  )
  if result is not None and out_dir is not None:
    result["png_path"] = plot_fgdro_figure1(
      result, os.path.join(out_dir, "fgdro_figure1.png"), stand_in
    )
  return result


def _markdown(result: Dict[str, Any], stand_in: bool) -> str:
  from fedjax_dro.reproduce.common import paired_difference

  title = "# FGDRO Figure 1: ablations on Camelyon17, on the comparison harness"
  lines = [title + (" (STAND-IN: generated data, tiny models)" if stand_in else ""), ""]
  for key, heading in (("interval", "(a) the interval I"), ("local_adam", "(b) local Adam steps")):
    record = result["results"][key]
    metric = record["metric"]["name"]
    paired = record["paired"].get(metric, {})
    lines += [
      f"## {heading}",
      "",
      f"| row | test {metric} | minus {record['reference']} (paired) | rounds | configs |",
      "|---|---|---|---|---|",
    ]
    for label, row in record["table"].items():
      cell = row.get(metric) or {}
      mean, two_se = cell.get("mean"), cell.get("two_se")
      shown = (
        "-"
        if mean is None
        else f"{mean:.3f}"
        + (f" +- {two_se:.3f}" if two_se is not None and np.isfinite(two_se) else "")
      )
      lines.append(
        f"| {label} | {shown} | {paired_difference(paired.get(label))} | {row['rounds']:g} | "
        f"{row['configurations']:g} |"
      )
    lines.append("")
  lines.append(
    f"Every row: {result['local_iterations']} local iterations (rounds = iterations / I), "
    "selected per seed on hospital 1 by accuracy, reported on hospital 2."
  )
  return "\n".join(lines) + "\n"


def plot_fgdro_figure1(result: Dict[str, Any], path: str, stand_in: Optional[bool] = None) -> str:
  """Panel (a): each row's test metric against the interval I (mean +- 2 SE over seeds); panel
  (b): LocalAdam against FedAdam; marked STAND-IN for a stand-in (``stand_in``, by default the
  result's own ``stand_in``)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from fedjax_dro.common import styles

  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  record = result["results"]["interval"]
  metric = record["metric"]["name"]
  rows = ("FGDRO-CVaR", "FGDRO-KL-Adam")
  bars = list(result["results"]["local_adam"]["table"])
  row_style = styles.row_styles(list(rows) + bars)
  for label in rows:
    xs, ys, es = [], [], []
    for steps in result["intervals"]:
      cell = record["table"].get(f"{label} I={steps}", {}).get(metric) or {}
      if cell.get("mean") is None:
        continue
      xs.append(steps)
      ys.append(cell["mean"])
      es.append(cell.get("two_se") if np.isfinite(cell.get("two_se") or np.nan) else 0.0)
    axes[0].errorbar(xs, ys, yerr=es, label=label, capsize=3, **row_style[label])
  axes[0].set_xscale("log", base=2)
  axes[0].set_xlabel("communication interval I (local steps a round)")
  axes[0].set_xticks(list(result["intervals"]), [str(i) for i in result["intervals"]])
  axes[0].minorticks_off()
  axes[0].set_ylabel(f"test {metric}, held-out hospitals")
  axes[0].set_title("(a) the interval, equal local iterations (mean +- 2 SE)", fontsize=10)
  record = result["results"]["local_adam"]
  means = [(record["table"][k].get(metric) or {}).get("mean") or 0.0 for k in bars]
  axes[1].bar(bars, means, color=[row_style[k]["color"] for k in bars])
  axes[1].set_ylabel(f"test {metric}, held-out hospitals")
  axes[1].set_title("(b) Adam locally or on the server (mean over seeds)", fontsize=10)
  styles.legend_outside(fig, axes[:1])
  fig.suptitle("FGDRO Figure 1: the communication interval, and Adam locally or on the server")
  if result.get("stand_in") if stand_in is None else stand_in:
    styles.mark_stand_in(fig, "generated data, tiny models (not the paper's experiment)")
  fig.tight_layout(rect=(0, 0.03, 1, 0.95))
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return path
