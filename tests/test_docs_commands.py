"""Every shell command and Python block of README.md and docs/ runs as printed, so the docs cannot
drift from the code: per page, its Python blocks run in order in one fresh process, and its
`fedjax-dro` commands one after the other, both in one scratch folder (a ```toml block whose first
line is ``# NAME`` is written there as NAME first, the page's own before another page's). Short
ones run in the default suite; long ones (`fedjax-dro reproduce`, run with ``--quick`` added, and
`fedjax-dro compare`) are marked slow.
What is not run is listed in :data:`NOT_RUN` with the reason (installing, the suite itself, the
docs build, servers tested in ``tests/records/test_viewers.py``, the user's data files, the
benchmark scripts, which ``tests/test_benchmarks.py`` runs in their quick form); a test checks
that every command is either run or listed."""

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted(
  p for p in (ROOT / "docs").rglob("*.md") if p.name != "bad_inputs.md"
)
# (pattern, reason): a command matching it is not run here
NOT_RUN = [
  (r"python3 -m venv|pip install|^\. \.venv", "installing: .ci/run does it on a fresh clone"),
  (r"python -m pytest", "the test suite itself"),
  (r"mkdocs build", "the docs build is a step of .ci/run"),
  (r"^(\S+=\S+ )*(tensorboard|mlflow ui)\b", "a server: tests/records/test_viewers.py serves one"),
  (r"--data-dir|--features|--leaf-dir", "reads the user's data files"),
  (
    r"^fedjax-dro prepare \S+ '?~/|WILDS_DIR|PILE_DIR|--data-dir prepared",
    "reads the user's data files",
  ),
  (r"^fedjax-dro (reproduce \S+ .*--part|merge)", "a split table: tests/compare/test_parts.py"),
  (r"^(nice -n \d+ )?python benchmarks/", "a benchmark: tests/test_benchmarks.py runs them quick"),
]
SLOW = r"^fedjax-dro (reproduce \S+|compare)( |$)"
USER_FILES = "~/data"  # a Python block reading the user's files is not run
# pages that need an optional extra: skipped where it is not installed (the test extra has neither
# the full tensorboard nor mlflow; it has equinox)
REQUIRES = {"docs/tracking.md": ("tensorboardX", "mlflow"), "docs/bring-your-own.md": ("equinox",)}


def _blocks(language, text):
  return [m.group(1) for m in re.finditer(rf"^```{language}\n(.*?)^```", text, re.S | re.M)]


def _commands(text):
  out = []
  for block in _blocks("bash", text):
    for line in block.replace("\\\n", " ").splitlines():
      words = shlex.split(line, comments=True)
      if words:
        out.append(shlex.join(words))
  return out


def _not_run(command):
  return next((why for pattern, why in NOT_RUN if re.search(pattern, command)), None)


def _page_id(page):
  return str(page.relative_to(ROOT))


def _env(tmp_path):
  env = dict(os.environ, HOME=str(tmp_path / "home"), MPLBACKEND="Agg")
  env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
  env.pop("XLA_FLAGS", None)
  return env


def _require_extras(page):
  for module in REQUIRES.get(_page_id(page), ()):
    pytest.importorskip(module, reason=f"{_page_id(page)} needs {module} (an optional extra)")


def _write_files(text, cwd):
  """The page's ```toml files, and those of the other pages it does not define (the README's
  `compare ridge.toml` runs the file of docs/comparing.md)."""
  for page in [text] + [p.read_text() for p in PAGES]:
    for block in _blocks("toml", page):
      first = block.splitlines()[0].strip()
      if re.fullmatch(r"# [\w.-]+\.toml", first) and not (cwd / first[2:]).exists():
        (cwd / first[2:]).write_text(block)


def _run(command, cwd, env, timeout):
  done = subprocess.run(
    command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
  )
  assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


def _command_cases(slow):
  cases = []
  for page in PAGES:
    commands = [
      c for c in _commands(page.read_text()) if not _not_run(c) and bool(re.match(SLOW, c)) is slow
    ]
    if commands:
      cases.append(pytest.param(page, commands, id=_page_id(page)))
  return cases


@pytest.mark.parametrize("page,commands", _command_cases(slow=False))
def test_commands_run_as_printed(page, commands, tmp_path):
  _require_extras(page)
  text = page.read_text()
  _write_files(text, tmp_path)
  env = _env(tmp_path)
  for command in commands:
    _run(command, tmp_path, env, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("page,commands", _command_cases(slow=True))
def test_long_commands_run(page, commands, tmp_path):
  """The reproductions with ``--quick`` added (their full runs take minutes to hours); the
  comparisons as printed."""
  _require_extras(page)
  text = page.read_text()
  _write_files(text, tmp_path)
  env = _env(tmp_path)
  for command in commands:
    quick = " --quick" if command.startswith("fedjax-dro reproduce") else ""
    _run(command + quick, tmp_path, env, timeout=1800)


def _python_cases():
  cases = []
  for page in PAGES:
    blocks = [b for b in _blocks("python", page.read_text()) if USER_FILES not in b]
    if blocks:
      cases.append(pytest.param(page, blocks, id=_page_id(page)))
  return cases


@pytest.mark.parametrize("page,blocks", _python_cases())
def test_python_blocks_run_as_printed(page, blocks, tmp_path):
  _require_extras(page)
  script = tmp_path / "page.py"
  script.write_text("\n\n".join(blocks))
  _run(f"{shlex.quote(sys.executable)} page.py", tmp_path, _env(tmp_path), timeout=900)


def test_every_command_is_run_or_listed():
  """A shell line of the docs is a `fedjax-dro` command this file runs, or matches a reason in
  NOT_RUN; nothing falls through silently."""
  for page in PAGES:
    for command in _commands(page.read_text()):
      assert command.startswith("fedjax-dro") or _not_run(command), (_page_id(page), command)
