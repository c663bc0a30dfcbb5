"""Reading and writing the files runs leave behind.

Writing: atomic replacement (:func:`atomic_write`), appends forced to disk (:func:`append_lines`),
the up-front check that a directory is writable (:func:`check_writable_dir`). Every byte goes
through :func:`write_all` (``os.write``), and every ``OSError`` of a write (a full disk, a
read-only file system, a permission) becomes one :class:`FileWriteError` naming the path; a failed
write leaves the previous content of the file as it was (a temporary file is removed, an append is
cut back to the file's previous length, so no line is ever torn).

Reading untrusted files (checkpoints): :func:`read_regular_file` opens only regular files (a FIFO
or a device named like a checkpoint is refused, never opened for a blocking read), follows a
symbolic link only to a regular file inside the given directory, and never reads more than a
given number of bytes; :func:`read_npz_bytes` parses an ``.npz`` from bytes without pickle and
checks every member's header (dtype, shape, size) before allocating its array. Both raise
:class:`UnreadableFileError` (a ``ValueError``) naming the file and the member.
"""

from __future__ import annotations

import errno as errno_codes
import fcntl
import io
import os
import stat
import tempfile
import threading
import zipfile
from typing import Callable, Dict, Optional, Union

import numpy as np


class FileWriteError(OSError):
  """A file could not be written (disk full, read-only, permissions): names the path.

  ``errno`` and ``filename`` are those of the failed write; ``str(error)`` is one line.
  """

  def __init__(self, path: str, cause: OSError):
    super().__init__(cause.errno, cause.strerror or str(cause), path)
    code = errno_codes.errorcode.get(cause.errno or 0)
    reason = cause.strerror or str(cause) or type(cause).__name__
    self.message = f"cannot write {path}: {reason}" + (f" ({code})" if code else "")

  def __str__(self) -> str:
    return self.message


class UnreadableFileError(ValueError):
  """A file that is refused before (or while) it is read: names the file and the reason."""


def write_all(fd: int, data: bytes) -> None:
  """Writes all of ``data`` to the file descriptor ``fd`` (``os.write`` until done)."""
  view = memoryview(data)
  while view:
    written = os.write(fd, view)
    view = view[written:]


def fsync_dir(directory: str) -> None:
  """Forces a directory's entries (a rename) to disk, where the platform allows it."""
  try:
    fd = os.open(directory, os.O_RDONLY)
  except OSError:  # pragma: no cover - platforms without directory fds
    return
  try:
    os.fsync(fd)
  except OSError:  # pragma: no cover - file systems without directory fsync
    pass
  finally:
    os.close(fd)


def atomic_write(path: str, text: Union[str, bytes], *, durable: bool = False) -> None:
  """Writes ``text`` to a temporary file beside ``path`` and renames it into place.

  With ``durable=True`` the file and the directory entry are forced to disk (``fsync``) before
  returning. Raises :class:`FileWriteError` naming ``path``; ``path`` is then unchanged.
  """
  data = text.encode() if isinstance(text, str) else bytes(text)
  directory = os.path.dirname(os.path.abspath(path))
  try:
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
  except OSError as e:
    raise FileWriteError(path, e) from None
  try:
    try:
      write_all(fd, data)
      if durable:
        os.fsync(fd)
    finally:
      os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give results the usual permissions
    os.replace(tmp, path)
  except BaseException as e:
    try:
      os.remove(tmp)
    except OSError:
      pass
    if isinstance(e, OSError) and not isinstance(e, FileWriteError):
      raise FileWriteError(path, e) from None
    raise
  if durable:
    fsync_dir(directory)


def append_lines(path: str, lines) -> None:
  """Appends ``lines`` to ``path`` and forces them to disk (fsync) before returning.

  A failed append (:class:`FileWriteError`) cuts the file back to its previous length.
  """
  data = "".join(lines).encode()
  try:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
  except OSError as e:
    raise FileWriteError(path, e) from None
  try:
    size = os.fstat(fd).st_size
    try:
      write_all(fd, data)
      os.fsync(fd)
    except OSError as e:
      try:
        os.ftruncate(fd, size)  # no torn line
      except OSError:  # pragma: no cover - the cut itself failed
        pass
      raise FileWriteError(path, e) from None
  finally:
    os.close(fd)


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


# ----------------------------------------------------------------------------------------------
# One writer per directory
# ----------------------------------------------------------------------------------------------
OUT_LOCK_FILE = ".fedjax-dro.lock"


def _lock_holder(fd: int) -> str:
  """``"process PID"`` as the lock file's holder wrote it, else ``"a live process"``."""
  try:
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
  except OSError:
    text = ""
  return f"process {int(text)}" if text.isdigit() else "a live process"


class DirectoryLock:
  """Exclusive lock on ``directory`` for one writer (``with DirectoryLock(d, "--out"): ...``).

  An advisory ``flock`` on the regular file ``lock_file`` inside the directory (created if
  missing, never followed through a symbolic link): a second writer is refused at once with
  ``error`` naming ``name`` and the directory; the operating system releases the lock when its
  holder exits, however it exits (a SIGKILLed holder leaves the file, not the lock, so the next
  writer takes it over).

  With ``reentrant=True`` the thread holding it may enter it again (any ``DirectoryLock`` of the
  same directory and lock file): a command claims its output directory first
  (:class:`fedjax_dro.records.claim.OutputClaim`) and the run it then starts takes the same lock
  without being refused; the lock is released when the outermost holder exits. A lock taken
  without it refuses every other entry, in its own thread too.
  """

  _held = threading.local()  # per thread: {(real path, lock file): [fd, depth, reentrant]}

  def __init__(
    self,
    directory: str,
    name: str,
    lock_file: str = OUT_LOCK_FILE,
    error=ValueError,
    *,
    reentrant: bool = False,
  ):
    self.directory, self.name, self.lock_file, self.error = directory, name, lock_file, error
    self.reentrant = reentrant
    self._fd: Optional[int] = None
    self._key = None

  def _holding(self) -> dict:
    held = getattr(self._held, "locks", None)
    if held is None:
      held = self._held.locks = {}
    return held

  def __enter__(self):
    os.makedirs(self.directory, exist_ok=True)
    key = (os.path.realpath(self.directory), self.lock_file)
    held = self._holding()
    path = os.path.join(self.directory, self.lock_file)
    if key in held:  # this thread holds it already: enter again where its holder allows
      if not held[key][2]:
        raise self.error(
          f"{self.name} {self.directory!r} is in use by another run (this process holds "
          f"{path}); wait for it to finish or use another directory"
        )
      held[key][1] += 1
      self._key = key
      return self
    try:
      fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as e:
      raise self.error(f"{path} cannot be opened as a lock file ({e.strerror or e})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
      os.close(fd)
      raise self.error(f"{path} is not a regular file: it cannot be the lock file")
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = _lock_holder(fd)
      os.close(fd)
      raise self.error(
        f"{self.name} {self.directory!r} is in use by another run ({holder} holds {path}); "
        "wait for it to finish or use another directory"
      ) from None
    try:  # the holder's process id, for the message of the writers it refuses
      os.ftruncate(fd, 0)
      os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
      pass  # a full disk: the lock holds all the same
    self._fd, self._key = fd, key
    held[key] = [fd, 1, self.reentrant]
    return self

  def __exit__(self, *exc):
    if self._key is None:
      return False
    held, key = self._holding(), self._key
    self._key, self._fd = None, None
    entry = held.get(key)
    if entry is not None:
      entry[1] -= 1
      if entry[1] == 0:
        del held[key]
        fcntl.flock(entry[0], fcntl.LOCK_UN)
        os.close(entry[0])
    return False


# ----------------------------------------------------------------------------------------------
# Reading untrusted files
# ----------------------------------------------------------------------------------------------
def open_regular_file(path: str, directory: str, flags: int = os.O_RDONLY) -> int:
  """A file descriptor of ``path``, which must be a regular file; a symbolic link is followed
  only to a regular file inside ``directory``. Never blocks (``O_NONBLOCK``: a FIFO is refused
  before it is opened, and a swap between the check and the open is detected)."""
  try:
    st = os.lstat(path)
  except OSError as e:
    raise UnreadableFileError(f"{path} cannot be read ({e.strerror or e})") from None
  if stat.S_ISLNK(st.st_mode):
    real, root = os.path.realpath(path), os.path.realpath(directory)
    if os.path.commonpath([real, root]) != root:
      raise UnreadableFileError(
        f"{path} is a symbolic link to {real}, outside the directory {directory}: not followed"
      )
    try:
      st = os.stat(path)
    except OSError as e:
      raise UnreadableFileError(f"{path} is a broken symbolic link ({e.strerror or e})") from None
  if not stat.S_ISREG(st.st_mode):
    raise UnreadableFileError(f"{path} is not a regular file ({_kind(st.st_mode)}): not read")
  try:
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC)
  except OSError as e:
    raise UnreadableFileError(f"{path} cannot be opened ({e.strerror or e})") from None
  opened = os.fstat(fd)
  if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
    os.close(fd)
    raise UnreadableFileError(f"{path} changed while it was being opened: not read")
  return fd


def _kind(mode: int) -> str:
  for test, name in (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISSOCK, "a socket"),
  ):
    if test(mode):
      return name
  return "not a regular file"


def read_up_to(fd: int, count: int) -> bytes:
  """At most ``count`` bytes of ``fd`` from its position (fewer where the file ends), read in
  blocks of at most 1 MiB."""
  chunks, left = [], count
  while left > 0:
    block = os.read(fd, min(left, 1 << 20))
    if not block:
      break
    chunks.append(block)
    left -= len(block)
  return b"".join(chunks)


def read_regular_file(path: str, directory: str, limit: int) -> bytes:
  """The content of the regular file ``path`` (see :func:`open_regular_file`), refused without
  reading it if it holds more than ``limit`` bytes."""
  fd = open_regular_file(path, directory)
  try:
    size = os.fstat(fd).st_size
    if size > limit:
      raise UnreadableFileError(
        f"{path} holds {size} bytes, more than the {limit} it can hold: not read"
      )
    data = read_up_to(fd, limit + 1)
  except OSError as e:
    raise UnreadableFileError(f"{path} cannot be read ({e.strerror or e})") from None
  finally:
    os.close(fd)
  if len(data) > limit:
    raise UnreadableFileError(f"{path} grew beyond {limit} bytes while it was read: not read")
  return data


def read_npz_bytes(
  blob: bytes, where: str, check: Optional[Callable[[str, np.dtype, tuple], None]] = None
) -> Dict[str, np.ndarray]:
  """The arrays of the ``.npz`` held in ``blob`` (as ``np.savez`` writes it: stored, not
  compressed), in file order, without pickle.

  Each member's ``.npy`` header is parsed first: object dtypes are refused, the size its shape
  and dtype imply must be the member's size, and ``check(name, dtype, shape)`` (if given) may
  refuse it; only then is the array read. ``where`` starts every error message.
  """
  out: Dict[str, np.ndarray] = {}
  try:
    with zipfile.ZipFile(io.BytesIO(blob)) as archive:
      for info in archive.infolist():
        name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
        here = f"{where}, member {name!r}"
        if not info.filename.endswith(".npy") or name in out:
          raise UnreadableFileError(f"{here}: not a .npy member (or a duplicate)")
        if info.compress_type != zipfile.ZIP_STORED or info.file_size > len(blob):
          raise UnreadableFileError(f"{here}: compressed or larger than the file")
        with archive.open(info) as f:
          version = np.lib.format.read_magic(f)
          if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
          elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
          else:
            raise UnreadableFileError(f"{here}: .npy format version {version} is not read")
          if dtype.hasobject:
            raise UnreadableFileError(
              f"{here}: dtype {dtype.str!r} holds Python objects (pickle), which are never read"
            )
          count = 1
          for n in shape:
            count *= int(n)
          nbytes = count * dtype.itemsize
          if nbytes != info.file_size - f.tell():
            raise UnreadableFileError(
              f"{here}: its header claims shape {tuple(shape)} of {dtype} ({nbytes} bytes), but "
              f"the member holds {info.file_size - f.tell()} bytes"
            )
          if check is not None:
            check(name, dtype, tuple(shape))
          data = f.read(nbytes)
        if len(data) != nbytes:  # pragma: no cover - sizes were checked above
          raise UnreadableFileError(f"{here}: truncated")
        arr = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
        out[name] = arr.copy()
  except UnreadableFileError:
    raise
  except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as e:
    raise UnreadableFileError(
      f"{where} cannot be read as arrays ({type(e).__name__}: {e})"
    ) from None
  except (KeyError, NotImplementedError, TypeError, SyntaxError) as e:  # bad headers
    raise UnreadableFileError(
      f"{where} cannot be read as arrays ({type(e).__name__}: {e})"
    ) from None
  return out
