"""The README stays true to the code: its Python API example runs as printed and returns what its
comments say, the names its examples import exist, and every command it shows (`fedjax-dro ...`,
`python benchmarks/...`) parses with the parser of the program it names, with registered
algorithm, dataset, option and hyper-parameter names."""

import argparse
import importlib
import importlib.util
import pathlib
import re
import shlex

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

README = (ROOT / "README.md").read_text()


def _fenced(language):
  """``[(heading, code)]`` of the README's fenced blocks in ``language``, with the nearest
  ``#``-heading above each block."""
  blocks = []
  for m in re.finditer(rf"^```{language}\n(.*?)^```", README, flags=re.S | re.M):
    headings = re.findall(r"^#+ (.+)$", README[: m.start()], flags=re.M)
    blocks.append((headings[-1] if headings else "", m.group(1)))
  return blocks


def _commands(program_pattern):
  """Every command of the README starting with ``program_pattern``: the lines of its bash blocks
  (with ``\\`` continuations joined, comments dropped) and its inline code spans."""
  lines = []
  for _, code in _fenced("bash"):
    lines += code.replace("\\\n", " ").splitlines()
  lines += re.findall(r"`([^`\n]*(?:\n[^`\n]+)*)`", README)  # inline spans may wrap a line
  found = []
  for line in lines:
    for part in re.split(r"&&|;", line):
      words = shlex.split(part, comments=True)
      while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # an environment prefix
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


def test_python_api_example_runs_as_printed(tmp_path, monkeypatch):
  (code,) = [code for heading, code in _fenced("python") if heading == "Python API"]
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


def test_names_imported_by_the_examples_exist():
  imports = []
  for _, code in _fenced("python"):
    imports += re.findall(r"^from (fedjax_dro[\w.]*) import ([\w, ]+)$", code, flags=re.M)
  assert len(imports) >= 3
  for module, names in imports:
    mod = importlib.import_module(module)
    for name in (n.strip() for n in names.split(",")):
      assert hasattr(mod, name), f"README imports {name} from {module}, which has no such name"


def test_every_cli_command_parses_with_registered_names(monkeypatch):
  from fedjax_dro import cli
  from fedjax_dro.algorithms import default_hparams

  commands = [c for c in _commands(r"fedjax-dro.*") if "NAME" not in c]  # `reproduce NAME`
  assert len(commands) >= 15, commands
  subcommands = set()
  for words in commands:
    args = _parse_only(cli.main, words[1:], monkeypatch)
    subcommands.add(args.command)
    if args.command not in ("run", "sweep"):
      continue
    alg, _ = cli.build(args.algorithm, args.dataset, args.seed, cli._factory_options(args))
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
    assert path.exists(), f"README runs {words[1]}, which does not exist"
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
