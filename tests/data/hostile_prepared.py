"""Hostile files for ``prepare`` and ``load_prepared`` (rows of ``tests/test_bad_inputs.py``):
each builds a reader's stand-in in a fresh directory, damages one file the way a bad download or
a full disk would, and runs the step that must refuse it in one line naming the file."""

import glob
import os
import tempfile

from fedjax_dro.data import load_prepared, prepared


def _standin(name):
  return prepared.write_standin(name, os.path.join(tempfile.mkdtemp(), name))


def _prepare(name, root, **options):
  out = os.path.join(tempfile.mkdtemp(), "prepared")
  return prepared.prepare(name, root, out, progress=False, **options)


def _truncate(path):
  data = open(path, "rb").read()
  with open(path, "wb") as f:
    f.write(data[: len(data) // 2])


def _edit_csv(path, old, new):
  text = open(path).read()
  assert old in text
  with open(path, "w") as f:
    f.write(text.replace(old, new, 1))


def truncated_png():
  root = _standin("camelyon17")
  _truncate(sorted(glob.glob(os.path.join(root, "camelyon17_v1.0", "patches", "*", "*.png")))[0])
  return _prepare("camelyon17", root)


def truncated_jpeg():
  root = _standin("iwildcam")
  _truncate(sorted(glob.glob(os.path.join(root, "iwildcam_v2.0", "train", "*.jpg")))[0])
  return _prepare("iwildcam", root)


def truncated_npz():
  root = _standin("poverty")
  _truncate(sorted(glob.glob(os.path.join(root, "poverty_v1.1", "images", "*.npz")))[0])
  return _prepare("poverty", root)


def csv_without_a_column():
  root = _standin("camelyon17")
  _edit_csv(os.path.join(root, "camelyon17_v1.0", "metadata.csv"), ",tumor,", ",tumour,")
  return _prepare("camelyon17", root)


def unknown_split_string():
  root = _standin("iwildcam")
  _edit_csv(os.path.join(root, "iwildcam_v2.0", "metadata.csv"), ",train,", ",trian,")
  return _prepare("iwildcam", root)


def pile_line_not_json():
  import zstandard

  root = _standin("pile")
  path = os.path.join(root, "val.jsonl.zst")
  text = zstandard.ZstdDecompressor().stream_reader(open(path, "rb")).read()
  with open(path, "wb") as f:
    f.write(zstandard.ZstdCompressor().compress(text + b"{not json\n"))
  return _prepare("pile", root)


def changed_prepared_array():
  out = _prepare("camelyon17", _standin("camelyon17"))
  path = os.path.join(out, "train", "x.npy")
  data = bytearray(open(path, "rb").read())
  data[-1] ^= 0xFF
  with open(path, "wb") as f:
    f.write(bytes(data))
  return load_prepared(out)


def finished_directory_again():
  root = _standin("camelyon17")
  out = _prepare("camelyon17", root)
  return prepared.prepare("camelyon17", root, out, progress=False)


def disk_full_behaviour():
  """A disk that fills while ``prepare --overwrite`` writes: an ``OSError`` of one line naming
  the partial directory; the finished directory stays byte for byte; the rerun resumes."""
  import errno

  import pytest

  root = _standin("camelyon17")
  out = _prepare("camelyon17", root)
  before = {f: open(os.path.join(d, f), "rb").read() for d, _, fs in os.walk(out) for f in fs}
  original = prepared._Appender.append
  calls = {"n": 0}

  def fill(self, rows):
    calls["n"] += 1
    if calls["n"] > 3:
      raise OSError(errno.ENOSPC, "No space left on device")
    return original(self, rows)

  prepared._Appender.append = fill
  try:
    with pytest.raises(OSError, match="disk filled while writing") as info:
      prepared.prepare("camelyon17", root, out, progress=False, overwrite=True)
  finally:
    prepared._Appender.append = original
  assert "\n" not in str(info.value) and os.path.exists(out + ".partial")
  after = {f: open(os.path.join(d, f), "rb").read() for d, _, fs in os.walk(out) for f in fs}
  assert after == before
  prepared.prepare("camelyon17", root, out, progress=False, overwrite=True)
  assert not os.path.exists(out + ".partial")
