"""What the device executes during a run: a ``jax.profiler`` trace read back and summarised.

:func:`traced` runs a function under ``jax.profiler.trace`` (a Perfetto trace) and
:func:`device_summary` reads the events of the device's streams out of it: how many kernels ran
and for how long, the top kernels by total time, the copies between host and device (a
``while_loop`` on a GPU copies its predicate to the host on every iteration: a device-to-host
copy and a wait per iteration), and how busy the device was over the traced span (the union of
its kernels' intervals over the span from the first to the last: the rest of the span the device
waited for the host). Divided by the traced rounds, these are the per-round figures the anchors
report (``anchors.py``).

On a CPU there are no device streams: the summary says so (``device_events = 0``) and the work
runs as host threads, which ``speed_profile.py`` reads instead.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import tempfile

import jax


def _is_device_process(name: str) -> bool:
  return "/device:" in name or "GPU" in name or "TPU" in name


def _copy_kind(name: str):
  """``"d2h"``, ``"h2d"``, ``"d2d"`` for a memory copy's event name, else None."""
  low = name.lower().replace(" ", "")
  if "memcpy" not in low and "memset" not in low and "copy" not in low:
    return None
  if "dtoh" in low or "d2h" in low:
    return "d2h"
  if "htod" in low or "h2d" in low:
    return "h2d"
  if "dtod" in low or "d2d" in low:
    return "d2d"
  return "d2d" if "memcpy" in low else None


def busy_time(intervals) -> float:
  """The length of the union of ``(start, duration)`` intervals."""
  total, end = 0.0, None
  for start, dur in sorted(intervals):
    stop = start + dur
    if end is None or start >= end:
      total += dur
      end = stop
    elif stop > end:
      total += stop - end
      end = stop
  return total


def device_summary(events, top: int = 12) -> dict:
  """The device side of a trace's events (Chrome trace format: ``ph``, ``pid``, ``tid``,
  ``name``, ``ts`` and ``dur`` in microseconds).

  Returns ``device_events`` (complete events on device processes), ``kernels`` (those that are
  not memory copies), ``kernel_us`` (their summed duration), ``copies`` (count by kind:
  ``d2h``, ``h2d``, ``d2d``), ``span_us`` (first start to last end of the device events),
  ``busy_us`` (the union of their intervals), ``busy_share`` (``busy / span``), ``top``
  (``[name, count, total us]`` of the ``top`` kernels by total time) and the device
  ``processes`` and ``threads`` by name.
  """
  procs, threads = {}, {}
  for e in events:
    if e.get("ph") == "M" and e.get("name") == "process_name":
      procs[e.get("pid")] = str((e.get("args") or {}).get("name", ""))
    if e.get("ph") == "M" and e.get("name") == "thread_name":
      threads[(e.get("pid"), e.get("tid"))] = str((e.get("args") or {}).get("name", ""))
  device_pids = {pid for pid, name in procs.items() if _is_device_process(name)}
  dev = [e for e in events if e.get("ph") == "X" and "dur" in e and e.get("pid") in device_pids]
  copies = collections.Counter()
  per_kernel = collections.defaultdict(lambda: [0, 0.0])
  kernel_us = 0.0
  for e in dev:
    kind = _copy_kind(str(e.get("name", "")))
    if kind:
      copies[kind] += 1
      continue
    per_kernel[e["name"]][0] += 1
    per_kernel[e["name"]][1] += float(e["dur"])
    kernel_us += float(e["dur"])
  span = max(e["ts"] + e["dur"] for e in dev) - min(e["ts"] for e in dev) if dev else 0.0
  busy = busy_time([(float(e["ts"]), float(e["dur"])) for e in dev])
  ranked = sorted(per_kernel.items(), key=lambda kv: -kv[1][1])[:top]
  return {
    "device_events": len(dev),
    "kernels": sum(c for c, _ in per_kernel.values()),
    "kernel_us": kernel_us,
    "copies": dict(copies),
    "span_us": float(span),
    "busy_us": busy,
    "busy_share": busy / span if span else float("nan"),
    "top": [[name[:160], c, us] for name, (c, us) in ranked],
    "processes": sorted(procs[p] for p in device_pids),
    "threads": sorted({n for (p, _), n in threads.items() if p in device_pids})[:16],
  }


def traced(fn, keep_trace: str = None):
  """``(fn's result, device_summary of its trace)``: ``fn()`` run under ``jax.profiler.trace``
  (block on its result inside). ``keep_trace``: a path to copy the gzipped trace to."""
  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp, create_perfetto_trace=True):
      out = fn()
      jax.block_until_ready(out)
    paths = glob.glob(os.path.join(tmp, "**", "perfetto_trace.json.gz"), recursive=True)
    if not paths:
      return out, {"error": "no perfetto trace written"}
    with gzip.open(paths[0], "rt") as f:
      trace = json.load(f)
    if keep_trace and os.path.getsize(paths[0]) < 15 * 2**20:  # small enough to keep
      os.makedirs(os.path.dirname(os.path.abspath(keep_trace)), exist_ok=True)
      with open(paths[0], "rb") as src, open(keep_trace, "wb") as dst:
        dst.write(src.read())
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  return out, device_summary(events)


def per_round(summary: dict, rounds: int) -> dict:
  """Kernels, kernel milliseconds and device-to-host copies per round of a summary."""
  if not rounds or summary.get("error"):
    return {}
  return {
    "kernels_per_round": summary.get("kernels", 0) / rounds,
    "kernel_ms_per_round": summary.get("kernel_us", 0.0) / rounds / 1e3,
    "d2h_per_round": (summary.get("copies") or {}).get("d2h", 0) / rounds,
  }
