"""A full disk (or any failed write) ends the CLI with one line naming the path, rc != 0 and no
traceback, keeps every file finished before it intact (no torn metrics.jsonl line), and the run
resumes from its checkpoints to the uninterrupted result; a finished run writes metrics.jsonl
once (appends only, no second rewrite at the end).

The disk fills at the N-th ``os.write`` to a file under the test's folder: every byte the package
writes goes through ``fedjax_dro.records.files.write_all`` (``os.write``)."""

import errno
import json
import os

import pytest

from fedjax_dro import cli
from fedjax_dro.records.files import FileWriteError, append_lines, atomic_write

ARGV = ["run", "--rounds", "8", "--eval-every", "2", "--no-progress"]


def _writes_to(monkeypatch, folder, fail_at=None, seen=None):
  """Patches os.write: records the paths written under ``folder`` and raises ENOSPC at the
  ``fail_at``-th such write (1-based)."""
  real = os.write
  count = [0]

  def write(fd, data):
    try:
      path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
      path = ""
    if path.startswith(str(folder)):
      count[0] += 1
      if seen is not None:
        seen.append(path)
      if fail_at is not None and count[0] >= fail_at:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return real(fd, data)

  monkeypatch.setattr(os, "write", write)
  return count


def _lines(path):
  with open(path, "rb") as f:
    data = f.read()
  assert not data or data.endswith(b"\n"), "a torn line"
  return [json.loads(line) for line in data.splitlines()]


def test_a_finished_run_writes_metrics_jsonl_once_by_appends(tmp_path, monkeypatch, capsys):
  seen = []
  _writes_to(monkeypatch, tmp_path, seen=seen)
  out = tmp_path / "out"
  assert cli.main(ARGV + ["--out", str(out)]) == 0
  names = [os.path.basename(p) for p in seen]
  assert not any(n.startswith(".tmp-") and n.endswith("metrics.jsonl") for n in names), names
  assert names.count("metrics.jsonl") == 4  # one append per evaluation (4 chunks)
  assert sum(n.endswith("summary.json") for n in names) == 1  # written once, at the end
  assert "wrote metrics.jsonl" in capsys.readouterr().out


@pytest.mark.parametrize("fail_at", [1, 4, 9, 13, 18])
def test_disk_full_is_one_line_naming_the_path_and_finished_results_are_kept(
  tmp_path, monkeypatch, capsys, fail_at
):
  reference, out, ckpt = tmp_path / "reference", tmp_path / "out", tmp_path / "ckpt"
  assert cli.main(ARGV + ["--out", str(reference)]) == 0
  ref_lines = _lines(reference / "metrics.jsonl")
  capsys.readouterr()
  with monkeypatch.context() as patch:
    count = _writes_to(patch, tmp_path / "", fail_at)
    rc = cli.main(ARGV + ["--out", str(out), "--checkpoint-dir", str(ckpt)])
  err = capsys.readouterr().err.strip()
  assert count[0] >= fail_at
  assert rc == 1, err
  assert err.startswith("error: cannot write ") and "\n" not in err, err
  assert "No space left on device (ENOSPC)" in err and str(tmp_path) in err, err
  assert "Traceback" not in err
  if (out / "metrics.jsonl").exists():  # what was finished is intact: a prefix of the reference
    kept = _lines(out / "metrics.jsonl")
    assert kept == ref_lines[: len(kept)]
  # the space comes back: the same command resumes and ends with the uninterrupted results
  assert cli.main(ARGV + ["--out", str(out), "--checkpoint-dir", str(ckpt)]) == 0
  with open(out / "metrics.jsonl", "rb") as f, open(reference / "metrics.jsonl", "rb") as g:
    assert f.read() == g.read()
  with open(out / "summary.json") as f, open(reference / "summary.json") as g:
    assert json.load(f)["final"] == json.load(g)["final"]


def test_writers_name_the_path_and_leave_the_previous_content(tmp_path, monkeypatch):
  path = str(tmp_path / "metrics.jsonl")
  append_lines(path, ['{"a": 1}\n'])
  atomic_write(str(tmp_path / "s.json"), "{}")
  _writes_to(monkeypatch, tmp_path, fail_at=1)
  with pytest.raises(FileWriteError, match="cannot write .*metrics.jsonl: No space left") as e:
    append_lines(path, ['{"a": 2}\n' * 5000])
  assert e.value.errno == errno.ENOSPC and isinstance(e.value, OSError)
  with pytest.raises(FileWriteError, match="s.json"):
    atomic_write(str(tmp_path / "s.json"), "[1]")
  monkeypatch.undo()
  assert open(path).read() == '{"a": 1}\n'  # the failed append was cut back
  assert open(tmp_path / "s.json").read() == "{}"
  assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]


def disk_full_behaviour():
  """The bad-input table's row (tests/test_bad_inputs.py): the disk fills at the 6th write of a
  checkpointed CLI run; one line, rc 1, the kept metrics.jsonl is whole; the rerun finishes."""
  import contextlib
  import io
  import tempfile
  from unittest import mock

  with tempfile.TemporaryDirectory(prefix="fedjax-dro-disk-full-") as tmp:
    real, count = os.write, [0]

    def write(fd, data):
      if os.readlink(f"/proc/self/fd/{fd}").startswith(tmp):
        count[0] += 1
        if count[0] >= 6:
          raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
      return real(fd, data)

    argv = ARGV + ["--out", os.path.join(tmp, "out"), "--checkpoint-dir", os.path.join(tmp, "c")]
    err = io.StringIO()
    with mock.patch.object(os, "write", write), contextlib.redirect_stderr(err):
      with contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(argv)
    lines = err.getvalue().strip().splitlines()
    assert rc == 1 and len(lines) == 1 and lines[0].startswith("error: cannot write "), lines
    assert "(ENOSPC)" in lines[0] and tmp in lines[0], lines
    _lines(os.path.join(tmp, "out", "metrics.jsonl"))  # whole lines only
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
      assert cli.main(argv) == 0
    assert len(_lines(os.path.join(tmp, "out", "metrics.jsonl"))) == 8 + 4


def test_a_fifo_named_metrics_jsonl_is_refused_without_blocking(tmp_path):
  from tests.records.test_checkpoint_manifest import _no_hang, _pristine

  p = _pristine()
  out = tmp_path / "out"
  out.mkdir()
  os.mkfifo(out / "metrics.jsonl")
  from fedjax_dro import run

  with _no_hang(60), pytest.raises(ValueError, match="metrics.jsonl exists and is not a regular"):
    run(p["alg"], p["ds"], rounds=8, eval_every=2, out_dir=str(out))
