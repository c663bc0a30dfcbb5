"""Seconds per round of every row of FGDRO Table 7's CIFAR-10 protocol, on one device.

Guo and Yang, "Communication-Efficient Federated Group Distributionally Robust Optimization",
NeurIPS 2024, arXiv:2410.06369, Appendix G. The protocol (``fedjax_dro.reproduce.fgdro_protocol``):
100 clients of a Dirichlet(0.3) label partition of CIFAR-10 with classes 5-9 cut to 20%, a
two-conv CNN, 625 rounds of 32 local steps of batch 32. The images are generated (uniform noise of
CIFAR-10's sizes: :func:`~fedjax_dro.reproduce.fgdro_protocol.generated_cifar`), once; each row
(the middle of its grid) is compiled and ``--rounds`` rounds are timed with
:func:`~fedjax_dro.reproduce.fgdro_protocol.cifar_round_time`, the held-out metrics included. The
results are written after each row (a call cut off at a time limit keeps what it measured):
seconds per round, compile seconds, one 625-round run and the row's tuning and reporting runs
projected.

    python benchmarks/fgdro_cifar_rounds.py --rounds 3 --out results/fgdro_table7/cifar_rounds_gpu.json
"""

import argparse
import json
import os
import sys
import time

import jax

from fedjax_dro.reproduce.fgdro_protocol import (
  ALPHAS,
  cifar_round_time,
  configurations,
  generated_cifar,
  protocol,
)

REPORT_SEEDS = 3  # the reported runs of each row and partition (fgdro_table7's default seeds)


def labels_in_order():
  """The table's rows, FGDRO-KL and FedAvg first (the rows a cut-off call should keep)."""
  labels = [row["label"] for row in protocol("cifar10")["rows"]]
  first = [x for x in ("FGDRO-KL", "FedAvg") if x in labels]
  return first + [x for x in labels if x not in first]


def row_projection(row_time, label):
  """The row's whole protocol from its measured round: (tuning configurations + reported seeds)
  runs per partition, each of the protocol's rounds, plus one compilation per partition."""
  settings = protocol("cifar10")
  spec = {r["label"]: r for r in settings["rows"]}[label]
  runs = (len(configurations(spec)) + REPORT_SEEDS) * len(ALPHAS)
  return {
    "runs": runs,
    "protocol_s": runs * settings["rounds"] * row_time["seconds_per_round"]
    + len(ALPHAS) * row_time["compile_s"],
  }


def markdown(result):
  """The measurements as a markdown table, the device named."""
  meta = result["meta"]
  lines = [
    f"Every row of FGDRO Table 7's CIFAR-10 protocol on **{meta['device']}** ({meta['platform']}), "
    f"jax {meta['jax']}: generated images of CIFAR-10's sizes, Dirichlet({meta['alpha']:g}), 100 "
    f"clients x 32 local steps of batch 32 a round, each row at the middle of its grid, "
    f"{meta['rounds']} rounds timed after compilation (held-out metrics included).",
    "",
    "| row | s / round | compile s | one run of 625 rounds | the row's protocol (runs) |",
    "|---|---|---|---|---|",
  ]
  for r in result["rows"]:
    lines.append(
      f"| {r['label']} | {r['seconds_per_round']:.3f} | {r['compile_s']:.1f} | "
      f"{r['full_run_s_per_config'] / 60:.1f} min | {r['protocol_s'] / 3600:.1f} h "
      f"({r['runs']}) |"
    )
  if result["rows"]:
    total = sum(r["protocol_s"] for r in result["rows"])
    lines += [
      "",
      f"The {len(result['rows'])} rows measured: {total / 3600:.1f} h for their whole protocol on "
      f"this device (every tuning configuration and {REPORT_SEEDS} reported seeds, both "
      f"partitions).",
    ]
  for label, err in result.get("errors", {}).items():
    lines.append(f"- {label}: {err}")
  return "\n".join(lines) + "\n"


def write(result, out):
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    json.dump(result, f, indent=1)
  with open(os.path.splitext(out)[0] + ".md", "w") as f:
    f.write(markdown(result))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=int, default=3, help="rounds timed per row (default 3)")
  parser.add_argument("--labels", default=None, help="comma-separated rows (default: all)")
  parser.add_argument("--alpha", type=float, default=ALPHAS[0])
  parser.add_argument("--out", default="results/fgdro_table7/cifar_rounds.json")
  args = parser.parse_args(argv)
  if args.rounds < 1:
    parser.error(f"--rounds must be >= 1, got {args.rounds}")
  labels = labels_in_order()
  if args.labels:
    chosen = [x for x in args.labels.split(",") if x]
    unknown = sorted(set(chosen) - set(labels))
    if unknown or not chosen:
      parser.error(f"--labels must be rows of the table {labels}, got {unknown or chosen}")
    labels = chosen
  dev = jax.devices()[0]
  result = {
    "meta": {
      "device": dev.device_kind,
      "platform": dev.platform,
      "jax": jax.__version__,
      "alpha": args.alpha,
      "rounds": args.rounds,
      "command": "python benchmarks/fgdro_cifar_rounds.py " + " ".join(sys.argv[1:]),
    },
    "rows": [],
    "errors": {},
  }
  t0 = time.perf_counter()
  data = generated_cifar(args.alpha, 0)
  result["meta"]["data_s"] = time.perf_counter() - t0
  for label in labels:
    try:
      m = cifar_round_time(label, rounds=args.rounds, alpha=args.alpha, data=data)
    except Exception as e:  # an allocation failure is a result here
      result["errors"][label] = f"{type(e).__name__}: {str(e)[:300]}"
    else:
      m.update(row_projection(m, label))
      result["rows"].append(m)
      print(json.dumps({k: m[k] for k in ("label", "seconds_per_round", "compile_s")}), flush=True)
    write(result, args.out)
  print(markdown(result))


if __name__ == "__main__":
  main()
