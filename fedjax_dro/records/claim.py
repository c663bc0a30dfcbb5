"""One claim of an output directory per command: the lock first, then the check of what the
directory holds, then the work, then the record that the job finished.

Every command that writes a directory (``run``, ``sweep``, ``compare``, ``reproduce``) enters
:class:`OutputClaim` before it loads data or compiles anything, so two commands started on one
``--out`` at any moment cannot both pass the check: the second is refused in one line naming the
holder (:class:`~fedjax_dro.records.files.DirectoryLock`), or, once the first has finished, by the
check below. Under the claim, :meth:`OutputClaim.check` compares the configuration of the job
with the record the last job of the same command left there (``.fedjax-dro-COMMAND.json``,
written atomically): a finished job of another configuration is refused unless ``overwrite``,
naming the keys that differ; a directory holding the command's result files without such a
record (written by an older version, or by hand) is refused the same way, since what produced
them cannot be told. :meth:`OutputClaim.finish` marks the job finished once its files are written.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Sequence

from fedjax_dro.records.files import DirectoryLock, atomic_write


def job_record_path(directory: str, command: str) -> str:
  """The path of the job record that ``command`` keeps in ``directory``."""
  return os.path.join(directory, f".fedjax-dro-{command}.json")


def _canonical(value: Any) -> Any:
  """``value`` as JSON would give it back (tuples as lists, numbers as written)."""
  return json.loads(json.dumps(value, sort_keys=True, default=str))


class OutputClaim:
  """``with OutputClaim(directory, "--out", "sweep") as claim: claim.check(config, ...); ...;
  claim.finish()``.

  The claim is a re-entrant :class:`~fedjax_dro.records.files.DirectoryLock`: the run the command
  starts in the same thread (:func:`fedjax_dro.run` with this ``out_dir``) enters it again.

  Args:
    directory: the output directory (created if missing).
    flag: how the user named it, for the messages (``"--out"``).
    command: the command writing it (``"sweep"``, ``"compare"``, ``"reproduce"``).
    results: the names of the files whose presence means a finished result of ``command``
      (checked only where the directory holds no job record).
  """

  def __init__(
    self, directory: str, flag: str, command: str, results: Sequence[str] = (), *, lock=True
  ):
    self.directory, self.flag, self.command = os.fspath(directory), flag, command
    self.results = tuple(results)
    self._lock = DirectoryLock(self.directory, flag, reentrant=True) if lock else None
    self._config: Optional[Dict[str, Any]] = None

  def __enter__(self) -> "OutputClaim":
    if self._lock is not None:
      self._lock.__enter__()
    return self

  def __exit__(self, *exc):
    if self._lock is not None:
      return self._lock.__exit__(*exc)
    return False

  @property
  def path(self) -> str:
    return job_record_path(self.directory, self.command)

  def stored(self) -> Optional[Dict[str, Any]]:
    """The job record the directory holds for this command (``None``: none, or unreadable)."""
    try:
      with open(self.path) as f:
        record = json.load(f)
    except (OSError, ValueError):
      return None
    return record if isinstance(record, dict) and isinstance(record.get("config"), dict) else None

  def check(self, config: Dict[str, Any], *, overwrite: bool = False) -> bool:
    """Checks the directory against the job of configuration ``config`` (JSON-able) and records
    the job as started. Returns whether the directory already holds this job, finished.

    Raises:
      ValueError: the directory holds a finished job of another configuration (naming what
        differs), or result files of this command without a record; not with ``overwrite``.
    """
    config = _canonical(config)
    record = self.stored()
    same_finished = False
    if record is None:
      present = [r for r in self.results if os.path.exists(os.path.join(self.directory, r))]
      if present and not overwrite:
        raise ValueError(
          f"{self.flag} {self.directory} holds {', '.join(present)} of a {self.command} whose "
          "configuration is not recorded there; pass --overwrite to replace it, or choose "
          f"another {self.flag}"
        )
    elif record.get("finished"):
      old = record["config"]
      differ = sorted(k for k in set(old) | set(config) if old.get(k) != config.get(k))
      if differ and not overwrite:
        raise ValueError(
          f"{self.flag} {self.directory} holds a finished {self.command} of another "
          f"configuration (differs in {', '.join(differ)}); pass --overwrite to replace it, or "
          f"choose another {self.flag}"
        )
      same_finished = not differ
    self._config = config
    if not same_finished:
      self._write(finished=False)
    return same_finished

  def finish(self) -> None:
    """Records the job checked by :meth:`check` as finished (atomically)."""
    if self._config is None:
      raise RuntimeError("OutputClaim.finish() before check()")
    self._write(finished=True)

  def _write(self, finished: bool) -> None:
    record = {"command": self.command, "config": self._config, "finished": finished}
    atomic_write(self.path, json.dumps(record, indent=1, sort_keys=True) + "\n")
