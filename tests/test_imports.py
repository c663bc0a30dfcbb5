"""The package's import graph: no cycles, and no module reaching into another module's private
names.

Read statically from the source (``ast``), so function-level imports count as much as top-level
ones: a cycle hidden inside a function is still a cycle between two modules. A private name is one
with a single leading underscore (``_split_data``); ``from m import _x`` and ``m._x`` on an
imported module ``m`` both count. A module may of course use its own private names.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Dict, List, Set, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "fedjax_dro"


def _modules(root: pathlib.Path, package: str) -> Dict[str, Tuple[pathlib.Path, str]]:
  """``{dotted module name: (file, source)}`` of every module under ``root/package``."""
  modules = {}
  for path in sorted((root / package).rglob("*.py")):
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
      parts = parts[:-1]
    modules[".".join(parts)] = (path, path.read_text())
  return modules


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
  """The absolute module a ``from ... import`` in ``module`` names."""
  if not node.level:
    return node.module or ""
  base = module.split(".") if is_package else module.split(".")[:-1]
  base = base[: len(base) - (node.level - 1)]
  return ".".join(base + ([node.module] if node.module else []))


def import_graph(modules, package: str = PACKAGE):
  """``(edges, private_uses)``: ``edges[m]`` the package modules ``m`` imports (a name imported
  from a package counts as an import of that package, a submodule imported by name as an import of
  the submodule); ``private_uses`` a list of ``(importer, imported module, private name)``."""
  edges: Dict[str, Set[str]] = {}
  private: List[Tuple[str, str, str]] = []

  def is_private(name):
    return name.startswith("_") and not name.startswith("__")

  for name, (path, source) in modules.items():
    tree = ast.parse(source, filename=str(path))
    is_package = path.name == "__init__.py"
    aliases = {}  # local name -> package module it is bound to
    targets = edges.setdefault(name, set())
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom):
        target = _absolute(name, is_package, node)
        if not (target == package or target.startswith(package + ".")):
          continue
        for alias in node.names:
          submodule = f"{target}.{alias.name}"
          if submodule in modules:
            targets.add(submodule)
            aliases[alias.asname or alias.name] = submodule
          else:
            targets.add(target)
            if is_private(alias.name) and target != name:
              private.append((name, target, alias.name))
      elif isinstance(node, ast.Import):
        for alias in node.names:
          if alias.name == package or alias.name.startswith(package + "."):
            targets.add(alias.name)
            if alias.asname:
              aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
      if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in aliases
        and is_private(node.attr)
        and aliases[node.value.id] != name
      ):
        private.append((name, aliases[node.value.id], node.attr))
    targets.discard(name)
  return edges, private


def find_cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
  """The cycles a depth-first search meets (each as ``[a, b, ..., a]``); empty for a DAG."""
  done: Set[str] = set()
  stack: List[str] = []
  on_stack: Set[str] = set()
  cycles = []

  def visit(node):
    stack.append(node)
    on_stack.add(node)
    for nxt in sorted(edges.get(node, ())):
      if nxt in on_stack:
        cycles.append(stack[stack.index(nxt) :] + [nxt])
      elif nxt not in done:
        done.add(nxt)
        visit(nxt)
    stack.pop()
    on_stack.discard(node)

  for node in sorted(edges):
    if node not in done:
      done.add(node)
      visit(node)
  return cycles


def test_the_package_imports_without_cycles():
  edges, _ = import_graph(_modules(ROOT, PACKAGE))
  assert find_cycles(edges) == []


def test_no_module_imports_another_modules_private_name():
  _, private = import_graph(_modules(ROOT, PACKAGE))
  assert private == [], "\n".join(f"{a} uses {b}.{c}" for a, b, c in private)


def test_the_detectors_can_fail(tmp_path):
  pkg = tmp_path / "pkg"
  (pkg / "sub").mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (pkg / "sub" / "__init__.py").write_text("from pkg.sub.b import public\n")
  (pkg / "a.py").write_text(
    "from pkg import b\n\ndef f():\n  from pkg.sub import c\n  return b._hidden, c\n"
  )
  (pkg / "b.py").write_text("from pkg.a import f\n_hidden = 1\n")
  (pkg / "sub" / "b.py").write_text("from ..a import f as _f\npublic = 1\n")
  (pkg / "sub" / "c.py").write_text("from .b import _private_thing\n")
  edges, private = import_graph(_modules(tmp_path, "pkg"), "pkg")
  assert ["pkg.a", "pkg.b", "pkg.a"] in find_cycles(edges)
  assert ("pkg.a", "pkg.b", "_hidden") in private
  assert ("pkg.sub.c", "pkg.sub.b", "_private_thing") in private
  assert not any(use[0] == "pkg.sub.b" for use in private)  # `as _f` binds, it does not reach in
  assert find_cycles({"x": {"y"}, "y": {"z"}}) == []


# Modules of fedjax_dro.algorithms that are infrastructure, not algorithms: any algorithm may import
# them. What two algorithms share lives in fedjax_dro.core or fedjax_dro.solvers.
ALGORITHM_INFRASTRUCTURE = ("base", "wrappers")


def algorithm_cross_imports(modules, package: str = PACKAGE) -> List[Tuple[str, str]]:
  """``(algorithm module, imported module)`` for every import, at any depth of its source, of one
  module of ``package.algorithms`` by another (the package itself, which imports every algorithm,
  counts; :data:`ALGORITHM_INFRASTRUCTURE` does not)."""
  prefix = f"{package}.algorithms"
  allowed = {f"{prefix}.{name}" for name in ALGORITHM_INFRASTRUCTURE}
  edges, _ = import_graph(modules, package)
  found = []
  for name in sorted(modules):
    if not name.startswith(prefix + ".") or name in allowed:
      continue
    for target in sorted(edges.get(name, ())):
      if (target == prefix or target.startswith(prefix + ".")) and target not in allowed:
        found.append((name, target))
  return found


def test_no_algorithm_imports_another_algorithm():
  found = algorithm_cross_imports(_modules(ROOT, PACKAGE))
  assert found == [], "\n".join(f"{a} imports {b}" for a, b in found)


def test_the_algorithm_import_detector_can_fail(tmp_path):
  algs = tmp_path / "pkg" / "algorithms"
  algs.mkdir(parents=True)
  (tmp_path / "pkg" / "__init__.py").write_text("")
  (tmp_path / "pkg" / "core.py").write_text("")
  (algs / "__init__.py").write_text("from pkg.algorithms.a import a\n")
  (algs / "base.py").write_text("")
  (algs / "wrappers.py").write_text("from pkg.algorithms.base import x\n")
  (algs / "a.py").write_text("from pkg.algorithms.base import x\nfrom pkg import core\n")
  (algs / "b.py").write_text("def f():\n  from pkg.algorithms.a import a\n  return a\n")
  (algs / "c.py").write_text("from . import a\n")
  (algs / "d.py").write_text("import pkg.algorithms.b as b\n")
  (algs / "e.py").write_text("from pkg.algorithms import a\n")
  (algs / "f.py").write_text("from pkg import algorithms\n")
  found = algorithm_cross_imports(_modules(tmp_path, "pkg"), "pkg")
  assert found == [
    ("pkg.algorithms.b", "pkg.algorithms.a"),
    ("pkg.algorithms.c", "pkg.algorithms.a"),
    ("pkg.algorithms.d", "pkg.algorithms.b"),
    ("pkg.algorithms.e", "pkg.algorithms.a"),
    ("pkg.algorithms.f", "pkg.algorithms"),
  ]


def subpackage_graph(edges: Dict[str, Set[str]], package: str = PACKAGE) -> Dict[str, Set[str]]:
  """The import graph collapsed to the top-level subpackages and modules of ``package``
  (``fedjax_dro.core.local -> fedjax_dro.models.builtin`` counts as ``core -> models``)."""

  def top(name):
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""

  out: Dict[str, Set[str]] = {}
  for source, targets in edges.items():
    for target in targets:
      if top(source) and top(target) and top(source) != top(target):
        out.setdefault(top(source), set()).add(top(target))
  return out


def test_the_subpackages_import_one_way():
  """No cycle between subpackages; ``common`` (the Model protocol, the dense-layer declaration,
  the tuning value, argument checks) sits below everything and imports nothing of the package;
  ``core`` and ``models`` meet only there."""
  edges, _ = import_graph(_modules(ROOT, PACKAGE))
  graph = subpackage_graph(edges)
  assert find_cycles(graph) == []
  assert graph.get("common", set()) == set()
  assert "models" not in graph.get("core", set()) and "core" not in graph.get("models", set())


def test_the_subpackage_detector_can_fail(tmp_path):
  pkg = tmp_path / "pkg"
  for sub in ("core", "models"):
    (pkg / sub).mkdir(parents=True)
    (pkg / sub / "__init__.py").write_text("")
  (pkg / "__init__.py").write_text("")
  (pkg / "core" / "local.py").write_text("from pkg.models.base import Model\n")
  (pkg / "models" / "base.py").write_text("def f():\n  from pkg.core import checks\n")
  (pkg / "core" / "checks.py").write_text("")
  edges, _ = import_graph(_modules(tmp_path, "pkg"), "pkg")
  graph = subpackage_graph(edges, "pkg")
  assert graph == {"core": {"models"}, "models": {"core"}}
  assert find_cycles(graph) == [["core", "models", "core"]]
