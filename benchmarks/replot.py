"""Draws the published figures of ``benchmarks/results/`` again from their JSON records, without
running anything: a comparison record ``<dir>/<name>.json`` (one with ``per_seed`` and
``strategies``) through :func:`fedjax_dro.compare.plot_comparison`, and the reproductions' own
figures (FGDRO Figure 1, SCAFF-PD Fig. 2 and Fig. 3, privacy and fairness) through
their plot functions. Only PNG files that already exist are rewritten.

    python benchmarks/replot.py [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Callable, List, Tuple

from fedjax_dro.compare import plot_comparison
from fedjax_dro.reproduce.fgdro_figure1 import plot_fgdro_figure1
from fedjax_dro.reproduce.privacy_fairness import plot_privacy_fairness
from fedjax_dro.reproduce.scaffpd import plot_scaffpd_synthetic
from fedjax_dro.reproduce.scaffpd_table1 import plot_scaffpd_fig3

RESULTS = pathlib.Path(__file__).resolve().parent / "results"

# Records whose figure is drawn by a reproduction's own function (path under results/).
OWN_PLOTS = {
  "fgdro_figure1/fgdro_figure1.json": plot_fgdro_figure1,
  "privacy_fairness/privacy_fairness.json": plot_privacy_fairness,
  "scaffpd_synthetic/scaffpd_synthetic.json": plot_scaffpd_synthetic,
  "scaffpd_table1/scaffpd_table1.json": plot_scaffpd_fig3,
}


def is_comparison(record) -> bool:
  """Whether a JSON record is a comparison harness record."""
  return isinstance(record, dict) and "per_seed" in record and "strategies" in record


def published_figures(results: pathlib.Path = RESULTS) -> List[Tuple[pathlib.Path, dict, Callable]]:
  """``[(json path, record, plot(record, png_path))]`` of every figure drawable from its record."""
  out = []
  for path in sorted(results.glob("*/*.json")):
    rel = path.relative_to(results).as_posix()
    record = json.loads(path.read_text())
    if rel in OWN_PLOTS:
      out.append((path, record, OWN_PLOTS[rel]))
    elif is_comparison(record):
      out.append((path, record, plot_comparison))
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--dry-run", action="store_true", help="list the figures, write nothing")
  args = parser.parse_args(argv)
  for path, record, plot in published_figures():
    png = path.with_suffix(".png")
    if not png.exists():
      print(f"skip {png.relative_to(RESULTS)} (no published PNG)")
      continue
    if not args.dry_run:
      plot(record, str(png))
    print(f"{'would draw' if args.dry_run else 'drew'} {png.relative_to(RESULTS)}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
