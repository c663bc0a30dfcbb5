"""Helpers shared by the reproductions (``fedjax-dro reproduce NAME``)."""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Optional

QUICK_BANNER = (
  "**Quick smoke run** (`--quick`: tiny grids, few rounds, small data): it shows that the "
  "pipeline runs, not the experiment's numbers.\n\n"
)


def run_tables(
  experiment: str,
  experiments: Dict[str, Any],
  markdown: Callable[[Dict[str, Any]], str],
  out_dir: Optional[str],
  verbose: bool,
  *,
  selections: Optional[dict] = None,
  selections_by_key: Optional[Dict[str, dict]] = None,
  quick: bool = False,
  part=None,
  plot: Optional[Callable[[Dict[str, Any], str], str]] = None,
  trained: Optional[dict] = None,
  **meta,
) -> Optional[Dict[str, Any]]:
  """Runs every :class:`~fedjax_dro.compare.Experiment` of a paper's table on the harness (each
  record written to ``out_dir`` as ``<its name>.{json,md,png}``), then writes the paper's
  combined table ``markdown(result)`` and the result as ``<experiment>.{json,md}`` (the name
  with ``_`` for ``-``).

  Args:
    experiment: the CLI name (``karula-synthetic``).
    experiments: ``{key: Experiment}``; the result's ``results[key]`` is its record's JSON.
    markdown: the combined table of the result.
    out_dir: output folder (``None``: nothing written).
    verbose: print progress and tables.
    selections: shared between the experiments (:func:`fedjax_dro.compare.compare`): the same
      strategies and data under several budgets rest on one selection per seed.
    selections_by_key: instead, one such dict per key of ``experiments`` (experiments on
      different data, each shared with the same key's experiment of another table).
    quick: a ``--quick`` smoke run (its combined table says so).
    trained: shared between the experiments (:func:`fedjax_dro.compare.compare`): the same
      strategies trained on the same data objects, reported on different metrics, train once.
    part: ``(i, N)``: only part ``i`` of ``N`` of every table's runs
      (:func:`fedjax_dro.compare.compare`); returns ``None`` (nothing combined) unless every
      run is recorded in ``out_dir``.
    plot: ``plot(result, path)`` draws the combined figure ``<experiment>.png`` (None: none).
    meta: further entries of the result (the data's description, ...).
  """
  from fedjax_dro.compare import compare

  t0 = time.perf_counter()
  if selections is not None and selections_by_key is not None:
    raise ValueError("give selections or selections_by_key, not both")
  found = {
    key: compare(
      e,
      out_dir,
      verbose=verbose,
      selections=selections if selections_by_key is None else selections_by_key[key],
      part=part,
      trained=trained,
    )
    for key, e in experiments.items()
  }
  if any(r is None for r in found.values()):
    return None  # a part: the combined table waits for the merge
  results = {key: r.to_json() for key, r in found.items()}
  result = {"experiment": experiment, **meta, "results": results}
  result["wall_time_s"] = time.perf_counter() - t0
  md = (QUICK_BANNER if quick else "") + markdown(result)
  if verbose:
    print(md)
  write_result(out_dir, experiment.replace("-", "_"), result, md, plot, quick=quick)
  return result


def paired_difference(entry: Optional[Dict[str, Any]], digits: int = 3) -> str:
  """A strategy's difference to the reference, paired over seeds, as a table cell
  ``+0.012 +- 0.034 (2 of 3)`` (the mean difference, 2 SE, the seeds where the strategy is better
  of those paired): an entry of a comparison record's ``paired[metric]``; ``"(reference)"`` for
  the reference itself (``None``)."""
  if entry is None:
    return "(reference)"
  d, f = entry, digits
  spread = d.get("difference_2se")
  two_se = "" if spread is None or spread != spread else f" +- {spread:.{f}f}"  # one seed: none
  return f"{d['difference']:+.{f}f}{two_se} ({d['wins']} of {d['seeds']})"


def write_result(
  out_dir: Optional[str],
  stem: str,
  result: Dict[str, Any],
  markdown: str,
  plot: Optional[Callable[[Dict[str, Any], str], str]] = None,
  log: Callable[[str], None] = lambda line: None,
  quick: bool = False,
) -> None:
  """Writes ``<stem>.json`` (``result``), ``<stem>.md`` (``markdown``) and, with ``plot``,
  ``<stem>.png`` (``plot(result, path)``) to ``out_dir``, atomically; their paths go into
  ``result`` (``json_path``, ``md_path``, ``png_path``). Nothing when ``out_dir`` is ``None``.

  Args:
    out_dir: the output folder (created).
    stem: the file stem.
    result: the experiment's result (JSON-able).
    markdown: its table.
    plot: ``plot(result, path) -> path``, or ``None`` for no figure.
    log: where the line naming the files goes.
    quick: a ``--quick`` smoke run: ``result["quick"]`` is set and the markdown starts with a
      line saying so (unless it already does).
  """
  if quick:
    result["quick"] = True
    if not markdown.startswith(QUICK_BANNER):
      markdown = QUICK_BANNER + markdown
  if out_dir is None:
    return
  from fedjax_dro.records.files import atomic_write
  from fedjax_dro.records.history import json_text

  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, stem)
  result["json_path"], result["md_path"] = path + ".json", path + ".md"
  atomic_write(path + ".json", json_text(result, indent=1))
  atomic_write(path + ".md", markdown)
  if plot is not None:
    result["png_path"] = plot(result, path + ".png")
  log(f"[{stem}] wrote {path}.json, .md" + (", .png" if plot is not None else ""))


def edges_line(record: Dict[str, Any]) -> str:
  """The sentence under a comparison's table listing the choices left on a grid edge after
  widening (``record["edges"]``), or saying there are none."""
  edges = [
    f"{e['strategy']} seed {e['seed']} {e['axis']}={e['value']:.3g} ({e['edge']})"
    for e in record["edges"]
  ]
  return "Choices on a grid edge after widening: " + ("; ".join(edges) or "none") + "."


def run_seconds(*records) -> float:
  """The seconds every run of the comparison records ``records`` took (each one's recorded
  ``seconds``, summed; a dict of records, a record or ``None`` each): a table merged from parts
  or resumed from its records cost this, whatever the final call's wall time."""
  total = 0.0
  for rec in records:
    if rec is None:
      continue
    many = rec.values() if "per_seed" not in rec else [rec]
    for r in many:
      total += sum(float(row["seconds"]) for rows in r["per_seed"].values() for row in rows)
  return total
