"""mkdocs hook: files that live outside ``docs/`` enter the site unchanged.

* ``notebooks/*.ipynb`` become ``notebooks/<name>.ipynb`` pages (rendered by mkdocs-jupyter without
  executing them; the tests execute the notebooks);
* the figures of ``benchmarks/results/`` become ``results/<path>.png``, so the measurement pages
  show the figures the benchmark and reproduction scripts wrote, not copies.

The hook runs before mkdocs-jupyter's ``on_files`` (priority 100), so the notebooks it adds are
rendered like notebooks placed in ``docs/``.
"""

import pathlib

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = pathlib.Path(__file__).resolve().parents[2]


def outside_files():
  """``[(source folder, path in the site)]`` of every file this hook adds."""
  found = [(ROOT, f"notebooks/{p.name}") for p in sorted((ROOT / "notebooks").glob("*.ipynb"))]
  results = ROOT / "benchmarks" / "results"
  found += [
    (ROOT / "benchmarks", p.relative_to(ROOT / "benchmarks").as_posix())
    for p in sorted(results.rglob("*.png"))
  ]
  return found


@event_priority(100)
def on_files(files: Files, config) -> Files:
  for src_dir, src_uri in outside_files():
    files.append(
      File(
        src_uri,
        src_dir=str(src_dir),
        dest_dir=config["site_dir"],
        use_directory_urls=config["use_directory_urls"],
      )
    )
  return files
