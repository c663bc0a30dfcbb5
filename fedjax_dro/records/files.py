"""Writing result files: atomic replacement (:func:`atomic_write`), appends forced to disk
(:func:`append_lines`), and the up-front check that a directory is writable
(:func:`check_writable_dir`)."""

from __future__ import annotations

import os
import tempfile
from typing import Union


def atomic_write(path: str, text: Union[str, bytes]) -> None:
  """Writes ``text`` to a temporary file beside ``path`` and renames it into place."""
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
  try:
    with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
      f.write(text)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give results the usual permissions
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def append_lines(path: str, lines) -> None:
  """Appends ``lines`` to ``path`` and forces them to disk (flush + fsync) before returning."""
  with open(path, "a") as f:
    f.write("".join(lines))
    f.flush()
    os.fsync(f.fileno())


def check_writable_dir(path, name: str) -> None:
  """``path`` is (or can be created as) a directory this process can write into."""
  if path is None:
    return
  if not isinstance(path, (str, os.PathLike)):
    raise TypeError(f"{name} must be a directory path, got {type(path).__name__}")
  path = os.fspath(path)
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"{name} {path!r} exists and is not a directory")
  try:
    os.makedirs(path, exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=path, prefix=".tmp-write-probe-")
    os.close(fd)
    os.remove(probe)
  except OSError as e:
    raise ValueError(
      f"{name} {path!r} is not a writable directory ({e.strerror or e}); choose another path"
    ) from None
