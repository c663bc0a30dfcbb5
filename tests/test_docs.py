"""The documentation site covers the package: every public name (``fedjax_dro.__all__`` and the
``__all__`` of every subpackage) has an entry in the API reference, every page and notebook is in
the navigation, every table the pages include from ``benchmarks/results/`` exists, and, where
mkdocs is installed (``pip install ".[docs]"``), the site builds in strict mode."""

import importlib
import os
import pathlib
import pkgutil
import re
import subprocess
import sys
import types

import pytest

import fedjax_dro

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MKDOCS_YML = (ROOT / "mkdocs.yml").read_text()


def _public_packages():
  """``fedjax_dro``, every subpackage (found by walking the package, at any depth) and the
  public modules ``fedjax_dro.__all__`` names (``model_selection``)."""
  packages = [fedjax_dro]
  for info in pkgutil.walk_packages(fedjax_dro.__path__, "fedjax_dro."):
    if info.ispkg and not any(part.startswith("_") for part in info.name.split(".")):
      packages.append(importlib.import_module(info.name))
  for name in fedjax_dro.__all__:
    value = getattr(fedjax_dro, name)
    if isinstance(value, types.ModuleType) and value not in packages:
      packages.append(value)
  return packages


def _public_names():
  """``[(package path, name)]`` of every name in a package's ``__all__``."""
  return [(p.__name__, n) for p in _public_packages() for n in getattr(p, "__all__", ())]


def _api_references():
  """The ``::: path`` identifiers of the API pages, in order."""
  refs = []
  for page in sorted((DOCS / "api").glob("*.md")):
    refs += re.findall(r"^::: ([\w.]+)\s*$", page.read_text(), flags=re.M)
  return refs


def _resolve(path):
  """The object ``path`` names: attributes from ``fedjax_dro`` down (so a re-exported function
  wins over the submodule of the same name, as in ``fedjax_dro.algorithms.fedavg``), importing
  a submodule where there is no attribute of that name."""
  parts = path.split(".")
  assert parts[0] == "fedjax_dro", path
  obj = fedjax_dro
  for i, part in enumerate(parts[1:], start=2):
    if hasattr(obj, part):
      obj = getattr(obj, part)
    else:
      obj = importlib.import_module(".".join(parts[:i]))
  return obj


def _is_shared_object(obj):
  """Objects identified by identity (documented once, exported by several packages); plain
  values (strings, numbers, tuples, dicts) must be documented under their own path."""
  return isinstance(obj, (types.ModuleType, type, types.FunctionType)) or callable(obj)


def _missing(public, refs, resolve=_resolve):
  """The ``package.name`` of every public name without an API entry: neither its own path nor
  (for a module, class or function) the same object under another documented path."""
  documented = {id(resolve(r)) for r in refs if _is_shared_object(resolve(r))}
  missing = []
  for package, name in public:
    path = f"{package}.{name}"
    if path in refs:
      continue
    obj = resolve(path)
    if not (_is_shared_object(obj) and id(obj) in documented):
      missing.append(path)
  return missing


def test_every_public_name_is_in_the_api_reference():
  public = _public_names()
  packages = {p for p, _ in public}
  assert {"fedjax_dro", "fedjax_dro.algorithms", "fedjax_dro.data", "fedjax_dro.models"} <= packages
  assert len(public) >= 150, len(public)
  assert _missing(public, _api_references()) == []


MAX_PUBLIC_NAMES = 180


def _exact_mismatch(public, refs, resolve=_resolve):
  """``(undocumented, documented but not public, listed twice)``: the API pages must document
  exactly the public names, each at its public path (``package.name``), each once; a public
  name that is a module is documented by its page's header (``::: package``)."""
  paths = [f"{package}.{name}" for package, name in public]
  twice = sorted({p for p in paths if paths.count(p) > 1})
  wanted = set(paths)
  modules = {p for p in wanted if isinstance(resolve(p), types.ModuleType)}
  headers = {r for r in refs if isinstance(resolve(r), types.ModuleType)}
  documented = set(refs) - headers
  undocumented = sorted((wanted - modules - documented) | (modules - headers))
  extra = sorted(documented - wanted)
  return undocumented, extra, twice


def test_the_api_pages_document_exactly_the_public_names():
  public = _public_names()
  assert len(public) <= MAX_PUBLIC_NAMES, len(public)
  assert _exact_mismatch(public, _api_references()) == ([], [], [])


def test_the_exactness_check_can_fail():
  values = {"fedjax_dro.pkg": types, "fedjax_dro.pkg.f": len, "fedjax_dro.pkg.g": abs}
  public = [("fedjax_dro", "pkg"), ("fedjax_dro.pkg", "f"), ("fedjax_dro.pkg", "g")]
  refs = ["fedjax_dro.pkg", "fedjax_dro.pkg.f", "fedjax_dro.pkg.h"]
  values["fedjax_dro.pkg.h"] = max
  assert _exact_mismatch(public, refs, values.__getitem__) == (
    ["fedjax_dro.pkg.g"],
    ["fedjax_dro.pkg.h"],
    [],
  )
  twice = public + [("fedjax_dro.other", "f")]
  values["fedjax_dro.other.f"] = len
  assert _exact_mismatch(twice[:3], refs[:2], values.__getitem__)[0] == ["fedjax_dro.pkg.g"]


def test_every_api_reference_names_an_existing_object():
  refs = _api_references()
  assert len(refs) == len(set(refs)), [r for r in refs if refs.count(r) > 1]
  for ref in refs:
    _resolve(ref)  # raises for a name that does not exist


def test_the_coverage_check_can_fail():
  """The detector on fake lists: a missing name is reported, a re-export documented at its home
  is not, and a plain value must be documented under its own path."""
  values = {
    "fedjax_dro.pkg.f": len,
    "fedjax_dro.home.f": len,
    "fedjax_dro.pkg.g": abs,
    "fedjax_dro.pkg.VERSION": "0.1",
    "fedjax_dro.home.VERSION": "0.1",
  }
  public = [("fedjax_dro.pkg", "f"), ("fedjax_dro.pkg", "g"), ("fedjax_dro.pkg", "VERSION")]
  refs = ["fedjax_dro.home.f", "fedjax_dro.home.VERSION"]
  assert _missing(public, refs, values.__getitem__) == [
    "fedjax_dro.pkg.g",
    "fedjax_dro.pkg.VERSION",
  ]
  assert (
    _missing(public, refs + ["fedjax_dro.pkg.g", "fedjax_dro.pkg.VERSION"], values.__getitem__)
    == []
  )


def _nav_entries():
  nav = MKDOCS_YML[MKDOCS_YML.index("\nnav:") :]
  return re.findall(r"^\s+- (?:[^\n]*: )?(\S+\.(?:md|ipynb))\s*$", nav, flags=re.M)


def test_navigation_lists_every_page_and_notebook():
  entries = _nav_entries()
  pages = sorted(
    str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts
  )
  notebooks = sorted(f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("*.ipynb"))
  assert len(notebooks) >= 4
  assert sorted(e for e in entries if e.endswith(".md")) == pages
  assert sorted(e for e in entries if e.endswith(".ipynb")) == notebooks
  assert "bad_inputs.md" in entries


def test_included_results_and_figures_exist():
  """Every ``--8<--`` include and every figure of ``benchmarks/results/`` a page shows exists
  (the strict build checks the same; this runs without mkdocs)."""
  included, figures = [], []
  for page in DOCS.rglob("*.md"):
    text = page.read_text()
    # a path, or a path with a line range: "benchmarks/results/speed.md:2:"
    included += re.findall(r'^--8<-- "([^":]+)(?::\d*)*"\s*$', text, flags=re.M)
    figures += re.findall(r"\]\((?:\.\./)*results/([^)]+\.png)\)", text)
  assert any(i.startswith("benchmarks/results/") for i in included)
  assert [i for i in included if not (ROOT / i).is_file()] == []
  assert figures and [f for f in figures if not (ROOT / "benchmarks/results" / f).is_file()] == []


def test_site_builds_in_strict_mode(tmp_path):
  pytest.importorskip("mkdocs")
  for plugin in ("material", "mkdocstrings_handlers.python", "mkdocs_jupyter"):
    pytest.importorskip(plugin)
  out = subprocess.run(
    [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
    cwd=ROOT,
    capture_output=True,
    text=True,
    env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
  )
  assert out.returncode == 0, out.stderr[-4000:]
  assert (tmp_path / "site" / "api" / "index.html").is_file()


def test_math_is_rendered_to_mathml_at_build_time():
  """The site's math needs no script or CDN: the build hook turns arithmatex's output into
  MathML, and every formula written in the docs converts."""
  pytest.importorskip("latex2mathml")
  spec = importlib.util.spec_from_file_location("math_mathml", DOCS / "hooks" / "math_mathml.py")
  hook = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(hook)
  page = (
    '<p>the weights <span class="arithmatex">\\(\\lambda_i &lt; 1\\)</span> of</p>'
    '<div class="arithmatex">\\[\\min_x \\max_{\\lambda} \\sum_i \\lambda_i f_i(x)\\]</div>'
  )
  out = hook.render(page)
  assert "arithmatex" not in out and out.count("<math") == 2
  assert 'display="block"' in out and "&lt;" in out or "&#x0003C;" in out
  formulas = []
  for path in DOCS.rglob("*.md"):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code is not math
    text = re.sub(r"`[^`\n]*`", "", text)
    formulas += [(path.name, m) for m in re.findall(r"\\\[(.+?)\\\]", text, flags=re.S)]
    formulas += [(path.name, m) for m in re.findall(r"\\\((.+?)\\\)", text, flags=re.S)]
  assert formulas, "no math found in the docs"
  for where, latex in formulas:
    assert "<math" in hook.to_mathml(latex, False, where)
  with open(ROOT / "mkdocs.yml") as f:
    config = f.read()
  assert "docs/hooks/math_mathml.py" in config and "https://cdn" not in config
