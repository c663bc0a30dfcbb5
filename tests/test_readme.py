"""The README and the documentation pages stay true to the code: the README's Python API example
runs as printed and returns what its comments say (the getting-started page shows the same
example), the names the examples import exist, every command shown (`fedjax-dro ...`,
`python benchmarks/...`) parses with the parser of the program it names, with registered
algorithm, dataset, option and hyper-parameter names, and the algorithm table lists the
registry."""

import argparse
import importlib
import importlib.util
import pathlib
import re
import shlex

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

README = (ROOT / "README.md").read_text()
# The hand-written documentation pages; docs/bad_inputs.md lists commands that must fail.
DOC_PAGES = {
  str(p.relative_to(ROOT)): p.read_text()
  for p in sorted((ROOT / "docs").rglob("*.md"))
  if p.name != "bad_inputs.md"
}
SOURCES = {"README.md": README, **DOC_PAGES}


def _fenced(language, text=README):
  """``[(heading, code)]`` of the fenced blocks in ``language`` of ``text``, with the nearest
  ``#``-heading above each block."""
  blocks = []
  for m in re.finditer(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M):
    headings = re.findall(r"^#+ (.+)$", text[: m.start()], flags=re.M)
    blocks.append((headings[-1] if headings else "", m.group(1)))
  return blocks


def _commands(program_pattern, texts=None):
  """Every command of ``texts`` (the README and the documentation pages by default) starting
  with ``program_pattern``: the lines of their bash blocks (with ``\\`` continuations joined,
  comments dropped) and their inline code spans."""
  lines = []
  for text in SOURCES.values() if texts is None else texts:
    for _, code in _fenced("bash", text):
      lines += code.replace("\\\n", " ").splitlines()
    lines += re.findall(r"`([^`\n]*(?:\n[^`\n]+)*)`", text)  # inline spans may wrap a line
  found = []
  for line in lines:
    for part in re.split(r"&&|;", line):
      words = shlex.split(part, comments=True)
      while words and re.fullmatch(r"[A-Z_0-9]+=\S*", words[0]):  # an environment prefix
        words = words[1:]
      if words and re.fullmatch(program_pattern, " ".join(words[:2])):
        found.append(words)
  return found


class _Parsed(Exception):
  def __init__(self, namespace):
    super().__init__("parsed")
    self.namespace = namespace


def _parse_only(main, argv, monkeypatch):
  """The namespace ``main(argv)`` parses its arguments into, stopping right after parsing; an
  argument the program's parser refuses fails the test with argparse's message."""
  original = argparse.ArgumentParser.parse_args

  def parse_and_stop(self, args=None, namespace=None):
    raise _Parsed(original(self, args, namespace))

  def refuse(self, message):
    raise AssertionError(f"{argv}: {message}")

  monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
  monkeypatch.setattr(argparse.ArgumentParser, "error", refuse)
  with pytest.raises(_Parsed) as parsed:
    main(argv)
  return parsed.value.namespace


def _api_example(text):
  (code,) = [code for heading, code in _fenced("python", text) if heading == "Python API"]
  return code


def test_python_api_example_runs_as_printed(tmp_path, monkeypatch):
  code = _api_example(README)
  monkeypatch.chdir(tmp_path)
  scope = {}
  exec(compile(code, "README.md (Python API)", "exec"), scope)
  # the comment on `hist.final["r2"]` lists keys of the summary
  (comment,) = re.findall(r'hist\.final\["r2"\]\s*#\s*(\{.*\})', code)
  promised = set(re.findall(r"'(\w+)'", comment))
  assert len(promised) >= 5 and promised <= set(scope["hist"].final["r2"])
  per_client = scope["hist"].evaluations[-1]["per_client"]["r2"]
  assert len(per_client) == scope["ds"].train.num_clients  # "[n] per-client values"
  assert scope["res"].best("r2")["client_lr"] in (0.005, 0.01, 0.02)


def test_getting_started_shows_the_tested_example():
  """The documentation's first example is the README's, so the run above tests both."""
  page = DOC_PAGES["docs/getting-started.md"]
  (code,) = [c for h, c in _fenced("python", page) if h == "A first simulation in Python"]
  assert code == _api_example(README)


def test_names_imported_by_the_examples_exist():
  imports = []
  for text in SOURCES.values():
    for _, code in _fenced("python", text):
      imports += re.findall(r"^from (fedjax_dro[\w.]*) import ([\w, ]+)$", code, flags=re.M)
  assert len(imports) >= 3
  for module, names in imports:
    mod = importlib.import_module(module)
    for name in (n.split(" as ")[0].strip() for n in names.split(",")):
      assert hasattr(mod, name), f"the docs import {name} from {module}, which has no such name"


def test_every_cli_command_parses_with_registered_names(monkeypatch):
  from fedjax_dro import cli
  from fedjax_dro.algorithms import default_hparams

  # `reproduce NAME` is a placeholder; `--help` exits (tests/test_docs_commands.py runs it)
  commands = [c for c in _commands(r"fedjax-dro.*") if "NAME" not in c and "--help" not in c]
  assert len(commands) >= 15, commands
  assert len([c for c in _commands(r"fedjax-dro.*", [README]) if "NAME" not in c]) >= 10
  subcommands = set()
  for words in commands:
    args = _parse_only(cli.main, words[1:], monkeypatch)
    subcommands.add(args.command)
    if args.command not in ("run", "sweep"):
      continue
    alg, ds = cli._build(args)  # as cmd_run / cmd_sweep build; --dp-* adds dp_clip, dp_noise...
    names = set(default_hparams(alg))
    given = [item.split("=")[0] for item in args.hparam + getattr(args, "grid", [])]
    given += [item.split("=")[0] for item in getattr(args, "cv_grid", [])]
    assert set(given) <= names, f"{' '.join(words)}: {set(given) - names} not in {names}"
  assert {"run", "sweep", "reproduce", "list", "plot"} <= subcommands


def test_every_benchmark_command_parses(monkeypatch):
  commands = _commands(r"python benchmarks/\w+\.py.*")
  assert len(commands) >= 8, commands
  for words in commands:
    path = ROOT / words[1]
    assert path.exists(), f"the docs run {words[1]}, which does not exist"
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = _parse_only(module.main, words[2:], monkeypatch)
    if path.stem == "speed":  # the lists speed.py checks after parsing
      assert set(args.sections.split(",")) <= set(module.SECTIONS), words
      assert set(args.models.split(",")) <= set(module.MODELS), words


def test_the_command_finder_sees_what_a_reader_sees():
  """The finder itself: a wrapped inline span, a continued bash line, an environment prefix."""
  found = [" ".join(c) for c in _commands(r"(fedjax-dro|python benchmarks/).*")]
  assert (
    "fedjax-dro run --algorithm scaffold --dataset digits-dirichlet --rounds 20 "
    "--compile-cache DIR" in found
  )
  assert any(
    c.startswith("fedjax-dro run --algorithm scaffold --dataset synthetic-classification")
    and c.endswith("--out runs/scaffold")
    for c in found
  )
  assert any(c.startswith("python benchmarks/speed.py --sections workloads") for c in found)
  text = "run `XLA_FLAGS=--x python benchmarks/scale.py\n--parts devices` here"
  assert [" ".join(c) for c in _commands(r"python benchmarks/.*", [text])] == [
    "python benchmarks/scale.py --parts devices"
  ]


def test_algorithm_table_lists_the_registry():
  """The README's algorithm table and the algorithm pages name every registered algorithm, and
  each family page holds its family's algorithms."""
  from fedjax_dro.algorithms import list_algorithms

  registry = list_algorithms()
  for text in (README, DOC_PAGES["docs/index.md"]):
    assert f"{len(registry)} algorithms" in text
  table = re.search(r"^## Algorithms\n(.*?)^## ", README, flags=re.S | re.M).group(1)
  listed = re.findall(r"^\| `(\w+)` \|", table, flags=re.M)
  assert sorted(listed) == sorted(registry)
  index = DOC_PAGES["docs/algorithms/index.md"]
  assert sorted(re.findall(r"^\| `(\w+)` \|", index, flags=re.M)) == sorted(registry)
  pages = {"baseline": "baselines", "dro": "dro", "personalized": "personalized"}
  for name, entry in registry.items():
    page = DOC_PAGES[f"docs/algorithms/{pages[entry.family]}.md"]
    assert f"{{ #{name} }}" in page, f"{name} has no section on the {entry.family} page"
