"""Repository layout rules: code outside a package module uses only public names of
``fedjax_dro``; every Python module of the repository (package, benchmarks, tests, docs hooks)
stays under 600 lines unless its docstring says why; users never see development paths."""

import ast
import importlib
import json
import pathlib
import re
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fedjax_dro"
MAX_LINES = 600


def _private_uses(source: str):
  """``[(line, what)]`` for every private (``_name``) name of fedjax_dro imported or accessed."""
  tree = ast.parse(source)
  modules = set()  # local names bound to fedjax_dro modules
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.startswith("fedjax_dro"):
          if any(part.startswith("_") for part in alias.name.split(".")):
            found.append((node.lineno, alias.name))
          modules.add(alias.asname or alias.name.split(".")[0])
    elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fedjax_dro"):
      if any(part.startswith("_") for part in node.module.split(".")):
        found.append((node.lineno, node.module))
      for alias in node.names:
        if alias.name.startswith("_") and alias.name != "__version__":
          found.append((node.lineno, f"{node.module}.{alias.name}"))
        elif isinstance(
          getattr(importlib.import_module(node.module), alias.name, None), types.ModuleType
        ):
          modules.add(alias.asname or alias.name)
  for node in ast.walk(tree):
    if (
      isinstance(node, ast.Attribute)
      and node.attr.startswith("_")
      and not node.attr.startswith("__")
    ):
      base = node.value
      while isinstance(base, ast.Attribute):
        base = base.value
      if isinstance(base, ast.Name) and base.id in modules:
        found.append((node.lineno, f"{base.id}...{node.attr}"))
  return found


def _notebook_source(path):
  cells = json.loads(path.read_text())["cells"]
  return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def _outside_files():
  """Benchmarks, notebooks, the CLI and the reproductions: they must use the public API."""
  files = sorted((ROOT / "benchmarks").rglob("*.py")) + sorted((ROOT / "notebooks").glob("*.ipynb"))
  files += [PACKAGE / "cli.py"] + sorted((PACKAGE / "reproduce").glob("*.py"))
  return files


@pytest.mark.parametrize("path", _outside_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_public_names_outside_package_modules(path):
  source = _notebook_source(path) if path.suffix == ".ipynb" else path.read_text()
  assert _private_uses(source) == []


def test_private_name_detector_can_fail():
  src = (
    "from fedjax_dro.engine.runner import _compile_run\n"
    "from fedjax_dro.solvers import pairwise\n"
    "pairwise._project_2d(1)\n"
    "import fedjax_dro.engine.programs as p\np._all_finite(0)\n"
  )
  assert len(_private_uses(src)) == 3


def _python_modules():
  """Every Python module of the repository a reader or a user meets (build outputs and
  environments excluded)."""
  for folder in ("fedjax_dro", "benchmarks", "tests", "docs", "notebooks", ".ci"):
    yield from sorted((ROOT / folder).rglob("*.py"))


def _over_600_lines_without_reason(paths):
  long = []
  for path in paths:
    text = path.read_text()
    lines = text.count("\n")
    if lines > MAX_LINES and "600 lines" not in (ast.get_docstring(ast.parse(text)) or ""):
      long.append(f"{path.name} ({lines} lines)")
  return long


def test_modules_under_600_lines_or_say_why():
  assert sum(1 for _ in _python_modules()) > 100
  assert _over_600_lines_without_reason(_python_modules()) == []


def test_the_600_line_check_can_fail(tmp_path):
  body = "x = 1\n" * (MAX_LINES + 1)
  (tmp_path / "long.py").write_text('"""A long module."""\n' + body)
  (tmp_path / "said.py").write_text('"""Over 600 lines: one table."""\n' + body)
  (tmp_path / "short.py").write_text('"""Short."""\nx = 1\n')
  found = _over_600_lines_without_reason(sorted(tmp_path.glob("*.py")))
  assert found == [f"long.py ({MAX_LINES + 2} lines)"]


def test_users_see_no_development_paths():
  """The package, README, CONTRIBUTING, docs, notebooks and benchmarks cite papers by title, never the
  development tree's ``shared/`` files."""
  files = sorted(PACKAGE.rglob("*.py")) + [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
  files += sorted((ROOT / "docs").rglob("*"))
  files += sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "benchmarks").rglob("*"))
  cited = [
    str(p.relative_to(ROOT))
    for p in files
    if p.is_file() and p.suffix in (".py", ".md", ".ipynb") and "shared/" in p.read_text()
  ]
  assert cited == []


def test_every_algorithm_module_cites_its_paper_with_an_arxiv_id():
  uncited = []
  for path in sorted((PACKAGE / "algorithms").glob("*.py")):
    if path.name in ("__init__.py", "base.py", "wrappers.py"):  # not algorithms
      continue
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    if not re.search(r"arXiv:\d{4}\.\d{4,5}", doc):
      uncited.append(path.name)
  assert uncited == []


FRAME_TRICKS = re.compile(r"sys\._getframe|inspect\.currentframe|\.f_back\b|\.f_globals\b")


def test_no_frame_inspection_in_the_package():
  """Settings come from declared parameters, never from the interpreter's frames."""
  offenders = [
    str(p.relative_to(PACKAGE))
    for p in PACKAGE.rglob("*.py")
    if FRAME_TRICKS.search(p.read_text(encoding="utf-8"))
  ]
  assert offenders == []
  assert FRAME_TRICKS.search("default = f(sys._getframe(1))")  # the detector can fail


def test_every_listed_slow_test_exists():
  """Each node ID of ``tests/slow_tests.txt`` names a test function in an existing file (so the
  list cannot silently stop marking what it names)."""
  from tests.conftest import slow_node_ids

  ids = slow_node_ids()
  assert len(ids) >= 10
  for node in ids:
    path, _, name = node.partition("::")
    function = name.split("[")[0]
    source = (ROOT / path).read_text()
    assert re.search(rf"^def {re.escape(function)}\(", source, re.M), node
