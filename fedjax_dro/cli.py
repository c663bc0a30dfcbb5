"""The fedjax-dro command line: run, sweep, compare, reproduce, features, plot, list.

    fedjax-dro run                                   # FedAvg on synthetic-ridge, summary table
    fedjax-dro run --algorithm scaffold --dataset synthetic-classification --rounds 200 \
        --hparam client_lr=0.05 --out runs/scaffold
    fedjax-dro sweep --algorithm fedavg --grid client_lr=0.01,0.03,0.1 --seeds 0,1,2
    fedjax-dro run --algorithm karula --cv-folds 5 --cv-grid t=0.01,0.1,1   # t by 5-fold CV
    fedjax-dro reproduce scaffpd-synthetic --out benchmarks/results/scaffpd_synthetic   # Fig. 2
    fedjax-dro features --weights resnet18.safetensors --data-dir ~/data --dataset cifar100 \
        --out cifar100_resnet18.npz                  # the features reproduce scaffpd-table1 reads
    fedjax-dro list

Over 600 lines: every command's parser and body is in this one module, which is what a reader
of the command line opens.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import json
import math
import os
import re
import sys
import textwrap
from typing import Dict, List, NamedTuple, Optional, Tuple

DEFAULT_ALGORITHM = "fedavg"
DEFAULT_DATASET = "synthetic-ridge"


def _parse_kv(items: List[str], flag: str, multi: bool = False) -> Dict[str, object]:
  out = {}
  for item in items or []:
    if "=" not in item:
      raise ValueError(f"{flag} expects NAME=VALUE, got {item!r}")
    k, v = item.split("=", 1)
    try:
      out[k] = [float(x) for x in v.split(",")] if multi else float(v)
    except ValueError:
      raise ValueError(f"{flag} {k}: {v!r} is not a number{' list' if multi else ''}") from None
  return out


def _devices_flag(text: str):
  if text == "auto":
    return text
  try:
    return int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(
      f"expected a positive integer or 'auto', got {text!r}"
    ) from None


def _add_compile_cache(p: argparse.ArgumentParser) -> None:
  p.add_argument(
    "--compile-cache",
    default=None,
    metavar="DIR",
    help="keep XLA's compiled programs in DIR, so that running the same command again skips "
    "compilation (JAX's persistent compilation cache, for every program size)",
  )


def _compile_cache(args) -> None:
  """``--compile-cache DIR``: JAX's persistent compilation cache in DIR, before anything
  compiles (:func:`fedjax_dro.engine.compile_cache.enable_compile_cache`, which on a GPU also
  makes the cached programs loadable)."""
  path = getattr(args, "compile_cache", None)
  if path is None:
    return
  from fedjax_dro.engine.compile_cache import enable_compile_cache
  from fedjax_dro.records.files import check_writable_dir

  check_writable_dir(path, "--compile-cache")  # the error names the option
  enable_compile_cache(path)


# ----------------------------------------------------------------------------------------------
# Flags generated from the library's declarations: the shared settings (core.settings.DECLARED)
# and the arguments of fedjax_dro.private; an ArgumentError about one names its flag
# ----------------------------------------------------------------------------------------------
def _flag(name: str) -> str:
  """A declared setting's flag: ``batch_size`` -> ``--batch-size``."""
  return "--" + name.replace("_", "-")


def setting_flags() -> Dict[str, str]:
  """``{setting: flag}``: one flag for each shared algorithm setting the library declares
  (:data:`fedjax_dro.core.settings.DECLARED`), which the chosen algorithm's factory gets when
  given."""
  from fedjax_dro.core.settings import DECLARED

  return {name: _flag(name) for name in DECLARED}


class PrivacyFlag(NamedTuple):
  """The flag of one argument of :func:`fedjax_dro.privacy.private`.

  ``releasing``: the :class:`~fedjax_dro.core.release.Releases` field (``"losses"``,
  ``"counts"``) of the algorithms the argument is for; its help lists them (``%(releasing)s``).
  ``needs``: the argument without which this one is refused (not ignored)."""

  flag: str
  metavar: Optional[str]
  help: str
  choices: Optional[Tuple[str, ...]] = None
  releasing: Optional[str] = None
  needs: Optional[str] = None


def privacy_flags() -> Dict[str, PrivacyFlag]:
  """``{argument of fedjax_dro.private: its flag}``, one line per argument (a test checks that
  every keyword argument of :func:`~fedjax_dro.privacy.private` has its line). The value type
  and the default shown come from ``private``'s signature; ``--dp-noise`` defaults to 0 and
  ``--dp-rate`` to clients-per-round / clients (:func:`_private`)."""
  from fedjax_dro.core.privacy import SAMPLING
  from fedjax_dro.privacy.accounting import ACCOUNTANTS

  adaptive = "adaptive_quantile"
  return {
    "clip_norm": PrivacyFlag("--dp-clip", "C", "L2 clip norm of each update"),
    "noise_multiplier": PrivacyFlag(
      "--dp-noise", "Z", "noise multiplier (std Z C; default 0: no noise, epsilon infinite)"
    ),
    "sampling": PrivacyFlag(
      "--dp-sampling",
      None,
      "Poisson participation or a fixed-size sample of --clients-per-round",
      SAMPLING,
    ),
    "rate": PrivacyFlag(
      "--dp-rate", "Q", "Poisson participation rate (default: clients-per-round / clients)"
    ),
    "delta": PrivacyFlag("--dp-delta", "D", "delta of the epsilon reported"),
    "accountant": PrivacyFlag(
      "--dp-accountant", None, "epsilon's accountant (pld: Poisson sampling only)", ACCOUNTANTS
    ),
    "loss_bound": PrivacyFlag(
      "--dp-loss-bound",
      "B",
      "the algorithms that release a loss or a like report of each participant "
      "(%(releasing)s): reports clipped to [0, B]",
      releasing="losses",
    ),
    "loss_noise_multiplier": PrivacyFlag(
      "--dp-loss-noise",
      "ZL",
      "noise multiplier of the reported losses (std ZL B; default: --dp-noise)",
    ),
    "adaptive_quantile": PrivacyFlag(
      "--dp-adaptive-quantile",
      "G",
      "adaptive clipping toward the G quantile of the update norms (Andrew et al.; --dp-clip "
      "is its start)",
    ),
    "adaptive_lr": PrivacyFlag(
      "--dp-adaptive-lr", "ETA", "adaptive clipping's geometric step", needs=adaptive
    ),
    "count_noise": PrivacyFlag(
      "--dp-count-noise",
      "SB",
      "adaptive clipping: noise std on the count of unclipped updates, over the expected "
      "participants",
      needs=adaptive,
    ),
    "cluster_count_noise": PrivacyFlag(
      "--dp-cluster-noise",
      "ZC",
      "the algorithms that release per-group participant counts (%(releasing)s): noise std on "
      "each count (default: --dp-noise)",
      releasing="counts",
    ),
  }


def releasing(what: str) -> List[str]:
  """The registered algorithms whose declaration (``Algorithm.releases``) releases ``what``
  (``"losses"`` or ``"counts"``): :func:`fedjax_dro.privacy.releases_table`."""
  from fedjax_dro.privacy import Releases

  table = _releases_table()
  return sorted(n for n, d in table.items() if isinstance(d, Releases) and getattr(d, what))


@functools.lru_cache(maxsize=1)
def _releases_table():
  from fedjax_dro.privacy import releases_table

  return releases_table()


class _Releasing:
  """``%(releasing)s`` in a help: the algorithms, listed only when the help is shown (building
  every algorithm to read its declaration takes a second, and starts JAX's backend)."""

  def __init__(self, what: str):
    self.what = what

  def __str__(self) -> str:
    return ", ".join(releasing(self.what))


def _plain(text: str, names: Dict[str, str]) -> str:
  """A declared docstring paragraph as a flag's help: reST roles and literals as plain text,
  a declared name as its flag, ``%`` escaped for argparse."""
  text = re.sub(r":\w+:`(~?)([\w.]+)`", lambda m: m[2].rsplit(".", 1)[-1] if m[1] else m[2], text)
  return re.sub(r"``([^`]+)``", lambda m: names.get(m[1], m[1]), text).replace("%", "%%")


def _add_settings(p: argparse.ArgumentParser) -> None:
  """One flag per declared shared setting: its value type, choices and docstring paragraph
  (the declared default in it); not given, the algorithm's own default holds."""
  from fedjax_dro.core.settings import DECLARED

  group = p.add_argument_group(
    "shared algorithm settings (fedjax_dro.core.settings; `fedjax-dro list ALGORITHM`: those "
    "the algorithm takes, with its defaults)"
  )
  flags = setting_flags()
  for name, declared in DECLARED.items():
    default = declared.default
    doc = declared.doc.format(default=f'"{default}"' if isinstance(default, str) else default)
    group.add_argument(
      flags[name],
      dest=name,
      type=declared.type,
      choices=declared.choices,
      default=argparse.SUPPRESS,
      help=_plain(doc, flags),
    )


def _add_privacy(p: argparse.ArgumentParser) -> None:
  from fedjax_dro.privacy import private

  dp = p.add_argument_group(
    "client-level differential privacy (DP-FedAvg: fedjax_dro.private; docs/privacy.md)"
  )
  signature = inspect.signature(private).parameters
  for name, row in privacy_flags().items():
    default = signature[name].default
    shown = default not in (None, inspect.Parameter.empty)
    action = dp.add_argument(
      row.flag,
      type=str if isinstance(default, str) else float,
      choices=row.choices,
      default=argparse.SUPPRESS,
      metavar=row.metavar,
      help=row.help + (f" (default: {default})" if shown else ""),
    )
    if row.releasing is not None:
      action.releasing = _Releasing(row.releasing)


def _given(args, flags: Dict[str, str]) -> Dict[str, object]:
  """``{argument: value}`` of the flags given (an ungiven flag's value is absent)."""
  dests = {name: flag[2:].replace("-", "_") for name, flag in flags.items()}
  return {name: getattr(args, dest) for name, dest in dests.items() if hasattr(args, dest)}


def _privacy_given(args) -> Dict[str, object]:
  return _given(args, {name: row.flag for name, row in privacy_flags().items()})


@contextlib.contextmanager
def _named(flags: Dict[str, str]):
  """An :class:`~fedjax_dro.common.checks.ArgumentError` about an argument of ``flags`` (the
  table that made the flags) raised inside names its flag instead."""
  from fedjax_dro.common.checks import ArgumentError

  try:
    yield
  except ArgumentError as e:
    if e.argument not in flags:
      raise
    raise e.renamed(flags) from None


def _private(args, alg, num_clients: int):
  """``alg`` made private from the ``--dp-*`` flags (unchanged without them)."""
  rows = privacy_flags()
  given = _privacy_given(args)
  if not given:
    return alg
  if "clip_norm" not in given:
    clip, noise = rows["clip_norm"], rows["noise_multiplier"]
    raise ValueError(
      f"{clip.flag} {clip.metavar} is needed for a private run ({noise.flag} alone clips nothing)"
    )
  for name in given:
    needs = rows[name].needs
    if needs is not None and needs not in given:
      raise ValueError(f"{rows[name].flag} needs {rows[needs].flag}")
  from fedjax_dro.privacy import private

  kw = dict(given)
  clip, noise = kw.pop("clip_norm"), kw.pop("noise_multiplier", 0.0)
  sampling = kw.get("sampling", inspect.signature(private).parameters["sampling"].default)
  if sampling == "poisson" and "rate" not in kw:
    s = alg.settings.clients_per_round if alg.settings is not None else None
    kw["rate"] = min(1.0, (s or num_clients) / num_clients)
  with _named({name: row.flag for name, row in rows.items()}):
    return private(alg, clip, noise, **kw)


def _privacy_line(privacy: dict) -> str:
  return (
    f"privacy: epsilon {privacy['epsilon']:.4g} at delta {privacy['delta']:.3g} after "
    f"{privacy['rounds']} rounds (noise multiplier {privacy['noise_multiplier']:.4g}; dp-accounting)"
  )


def _add_common(p: argparse.ArgumentParser) -> None:
  p.add_argument(
    "--algorithm", default=DEFAULT_ALGORITHM, help="algorithm name (see `fedjax-dro list`)"
  )
  p.add_argument("--dataset", default=DEFAULT_DATASET, help="dataset name (see `fedjax-dro list`)")
  p.add_argument("--rounds", type=int, default=100, help="communication rounds")
  p.add_argument(
    "--data-seed",
    type=int,
    default=0,
    help="seed of the data draw (a generated dataset, a partition); the same for every "
    "training seed",
  )
  p.add_argument(
    "--hparam",
    action="append",
    default=[],
    metavar="NAME=VALUE",
    help="hyper-parameter override (repeatable)",
  )
  p.add_argument(
    "--precision",
    default=None,
    choices=["float32", "tf32", "bf16"],
    help="compute dtype of the forward and backward passes (default per platform: float32 on "
    "CPU, tf32 on GPU/TPU; parameters and aggregation stay float32)",
  )
  p.add_argument("--eval-every", type=int, default=None, help="rounds between evaluations")
  _add_compile_cache(p)
  _add_settings(p)
  _add_privacy(p)
  scale = p.add_argument_group("scale-out (see fedjax_dro.engine.sharding)")
  scale.add_argument(
    "--devices",
    type=_devices_flag,
    default=None,
    metavar="N|auto",
    help="shard the client axis over the first N devices; auto: as many as divide the clients "
    "evenly. On CPU the cores become JAX devices (one per core for auto): faster from ~100 "
    "clients on, slower for small federations (docs/scale.md)",
  )
  scale.add_argument(
    "--mesh",
    default=None,
    metavar="clients=C,sweep=S",
    help="device mesh: clients axis (data) x sweep axis (configurations)",
  )
  scale.add_argument(
    "--coordinator",
    default=None,
    metavar="HOST:PORT",
    help="jax.distributed coordinator (multi-host)",
  )
  scale.add_argument("--num-processes", type=int, default=None, help="jax.distributed processes")
  scale.add_argument("--process-id", type=int, default=None, help="this process's index")
  scale.add_argument(
    "--host-data",
    action="store_true",
    help="keep client data in host memory; only the sampled clients' rows go to the device",
  )
  p.add_argument(
    "--model",
    default=None,
    metavar="NAME",
    help="a zoo model in place of the dataset's default, for image datasets: resnet18, "
    "resnet50, densenet121, cifar_cnn (see docs/models.md)",
  )
  p.add_argument(
    "--weights",
    default=None,
    metavar="FILE",
    help="start --model from this .safetensors file under the publishers' names (torchvision's "
    "or timm's resnet18 / resnet50 / densenet121), the classification head drawn fresh; pickles "
    "(.pth, .pt, .bin, .pkl, .ckpt) are refused",
  )
  p.add_argument(
    "--option",
    action="append",
    default=[],
    metavar="NAME=VALUE",
    help="extra algorithm factory option (repeatable; numbers or strings)",
  )
  p.add_argument(
    "--server-optimizer",
    default=None,
    metavar="NAME",
    help="the server step as an optax optimizer on the averaged difference (fedavg, fedprox, "
    "scaffold, agnostic_fedavg): "
    "sgd, momentum, adam, reddi-adam, yogi, adagrad (fedjax_dro.core.server.NAMED); its update "
    "is scaled by the server_lr hyper-parameter",
  )
  p.add_argument(
    "--server-option",
    action="append",
    default=[],
    metavar="NAME=VALUE",
    help="an argument of --server-optimizer (repeatable), e.g. b2=0.999, tau=1e-4, momentum=0.9",
  )
  track = p.add_argument_group("experiment tracking (see fedjax_dro.records.loggers)")
  track.add_argument("--log-to", metavar="tensorboard,mlflow", help="also log to these (extras)")
  track.add_argument(
    "--log-dir", metavar="DIR", help="--log-to's files (default: --out, else ./fedjax-dro-logs)"
  )


def _settings(args) -> Dict[str, object]:
  """The shared settings given on the command line, ``{setting: value}``; one the algorithm's
  factory does not take is refused, naming its flag and the settings the algorithm takes."""
  from fedjax_dro.algorithms import get_algorithm

  flags = setting_flags()
  given = _given(args, flags)
  accepted = inspect.signature(get_algorithm(args.algorithm).factory).parameters
  for name in given:
    if name not in accepted:
      takes = ", ".join(flag for n, flag in flags.items() if n in accepted)
      raise ValueError(
        f"{flags[name]}: {args.algorithm} takes no {name} (its settings: {takes}; "
        f"`fedjax-dro list {args.algorithm}`)"
      )
  return given


def _factory_options(args) -> dict:
  """The options of the algorithm's factory: the settings given, ``--precision``, the server
  optimizer, each ``--option``, and ``weighting="uniform"`` for a private run where the factory
  takes a weighting and none is given (every participant counts once)."""
  opts = _settings(args)
  if getattr(args, "precision", None) is not None:
    opts["precision"] = args.precision
  if getattr(args, "server_optimizer", None) is not None or getattr(args, "server_option", []):
    opts["server_optimizer"] = _server_optimizer(args)
  for item in args.option:
    if "=" not in item:
      raise ValueError(f"--option expects NAME=VALUE, got {item!r}")
    k, v = item.split("=", 1)
    for cast in (int, float):
      try:
        v = cast(v)
        break
      except ValueError:
        pass
    opts[k] = v
  if _privacy_given(args) and "weighting" not in opts:
    from fedjax_dro.algorithms import get_algorithm

    if "weighting" in inspect.signature(get_algorithm(args.algorithm).factory).parameters:
      opts["weighting"] = "uniform"
  return opts


def _build(args):
  """``(algorithm, dataset)`` of a run or sweep from its flags, private under ``--dp-*``."""
  if getattr(args, "weights", None) is not None and args.model is None:
    raise ValueError("--weights: give the --model the file is for (resnet18, resnet50, ...)")
  alg, ds = build(
    args.algorithm,
    args.dataset,
    args.data_seed,
    _factory_options(args),
    model=None if args.model is None else (args.model, args.weights),
  )
  return _private(args, alg, ds.num_clients), ds


def _server_optimizer(args):
  """The optax transformation of ``--server-optimizer`` and ``--server-option``."""
  from fedjax_dro.core.server import named_server_optimizer

  if args.server_optimizer is None:
    raise ValueError("--server-option needs --server-optimizer NAME")
  options = {}
  for item in args.server_option:
    if "=" not in item:
      raise ValueError(f"--server-option expects NAME=VALUE, got {item!r}")
    k, v = item.split("=", 1)
    try:
      options[k] = float(v)
    except ValueError:
      raise ValueError(f"--server-option {k} must be a number, got {v!r}") from None
  try:
    return named_server_optimizer(args.server_optimizer, **options)
  except ValueError as e:
    raise ValueError(f"--server-optimizer: {e}") from None


def build(algorithm: str, dataset: str, seed: int, options: dict, model=None):
  """(algorithm, dataset) from registry names, with the dataset's default model, or with
  ``model = (zoo name, weights file or None)`` a zoo image model (``--model``, ``--weights``)."""
  from fedjax_dro.algorithms import get_algorithm
  from fedjax_dro.data import get_dataset

  entry = get_algorithm(algorithm)
  ds_entry = get_dataset(dataset)
  ds = ds_entry.load(seed)
  if model is None:
    model = ds_entry.default_model(ds)
  else:
    import numpy as np

    from fedjax_dro.models.start import image_model

    name, weights = model
    if not ds.num_classes:
      raise ValueError(f"--model {name}: {dataset} is not a classification dataset")
    model = image_model(name, np.asarray(ds.train.x[0]), ds.num_classes, weights)
  accepted = inspect.signature(entry.factory).parameters
  unknown = [k for k in options if k not in accepted]
  if unknown:
    raise ValueError(
      f"algorithm {algorithm!r} does not take option(s) {unknown}; it accepts "
      f"{[k for k in accepted if k != 'model']}"
    )
  return entry.factory(model, **options), ds


def _fmt(x):
  return f"{x:.4f}" if isinstance(x, float) and abs(x) < 1e4 else f"{x:.4g}"


def print_table(rows: List[List[str]], header: List[str], file=None) -> None:
  file = file or sys.stdout
  widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
  line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"
  print(line(header), file=file)
  print("|" + "|".join("-" * (w + 2) for w in widths) + "|", file=file)
  for r in rows:
    print(line(r), file=file)


def summary_rows(final: dict) -> List[List[str]]:
  stats = ["weighted_mean", "mean", "worst20", "best20", "worst"]
  return [[metric] + [_fmt(final[metric].get(s, float("nan"))) for s in stats] for metric in final]


def _distributed(args) -> None:
  """``jax.distributed.initialize`` from the flags (before any JAX computation)."""
  flags = (args.coordinator, args.num_processes, args.process_id)
  if all(f is None for f in flags):
    return
  if any(f is None for f in flags):
    raise ValueError("--coordinator, --num-processes and --process-id must be given together")
  from fedjax_dro.engine import initialize_distributed

  initialize_distributed(args.coordinator, args.num_processes, args.process_id)


def _cpu_devices(args) -> None:
  """``--devices N|auto`` on a CPU: split the cores into JAX devices before JAX starts (one per
  core for auto; no effect on accelerators, nor once JAX has started, e.g. in a notebook)."""
  from fedjax_dro.engine import request_cpu_devices
  from fedjax_dro.engine.sharding import local_cpu_cores

  if args.devices is None or getattr(args, "coordinator", None) is not None:
    return
  count = local_cpu_cores() if args.devices == "auto" else args.devices
  if isinstance(count, int) and count > 1:
    request_cpu_devices(count)


def _scale(args, ds, num_configs=None):
  """``(dataset, mesh)`` from the scale-out flags (host-resident data, device mesh)."""
  from fedjax_dro.engine.sharding import parse_mesh

  if args.host_data and args.devices == "auto" and args.mesh is None:
    mesh = None  # host-resident data runs on one device: nothing for auto to shard
  else:
    mesh = parse_mesh(args.mesh, args.devices, num_clients=ds.num_clients, num_configs=num_configs)
  if args.host_data:
    import dataclasses

    from fedjax_dro.data.host import to_host

    ds = dataclasses.replace(
      ds, train=to_host(ds.train), test=None if ds.test is None else to_host(ds.test)
    )
  return ds, mesh


def _device_line(mesh, alg=None) -> str:
  """``"1 x gpu (NVIDIA H100 80GB HBM3); precision tf32"``: where and in which precision."""
  import jax

  devices = jax.devices()
  kind = getattr(devices[0], "device_kind", "") or ""
  kind = f" ({kind})" if kind and kind.lower() != devices[0].platform else ""
  where = f"{len(devices)} x {devices[0].platform}{kind}" + (
    f", {jax.process_count()} processes" if jax.process_count() > 1 else ""
  )
  where += "" if mesh is None else f", mesh {dict(mesh.shape)}"
  precision = (alg.config or {}).get("precision") if alg is not None else None
  return where + ("" if precision is None else f"; precision {precision}")


def _check_paths(args) -> None:
  """Output paths are checked before any data loads or compiles, and errors name the flag."""
  from fedjax_dro.records.files import check_writable_dir

  out, ckpt = getattr(args, "out", None), getattr(args, "checkpoint_dir", None)
  if out is not None and ckpt is not None and os.path.realpath(out) == os.path.realpath(ckpt):
    raise ValueError(
      f"--out and --checkpoint-dir name the same directory ({out}): results and checkpoints "
      "go to two directories; give --checkpoint-dir another one (e.g. its subdirectory ckpt)"
    )
  if out is not None:
    check_writable_dir(out, "--out")
  if ckpt is not None and not os.path.isdir(ckpt):
    check_writable_dir(ckpt, "--checkpoint-dir")


def _check_counts(args):
  """--rounds, --eval-every and --seed checked before anything is built or printed (argparse
  accepts any Python int: 99999999999999999999 would reach JAX as an OverflowError)."""
  for flag in ("rounds", "eval_every"):
    value = getattr(args, flag, None)
    if value is not None and not 1 <= value <= 2**31 - 1:
      raise ValueError(
        f"--{flag.replace('_', '-')} must be an integer in [1, 2**31 - 1], got {value}"
      )
  seed = getattr(args, "seed", None)
  if seed is not None and not 0 <= seed < 2**32:
    raise ValueError(f"--seed must be an integer in [0, 2**32), got {seed}")


def _parse_seeds(text: str) -> List[int]:
  try:
    return [int(s) for s in text.split(",")]
  except ValueError:
    raise ValueError(f"--seeds expects comma-separated integers like 0,1,2, got {text!r}") from None


def cmd_run(args) -> int:
  from fedjax_dro.engine.sharding import is_writer

  _distributed(args)
  _cpu_devices(args)
  _check_paths(args)
  _check_counts(args)
  with _claim(args, "run", is_writer()):  # first: what --out holds is checked under the claim
    return _run_claimed(args)


def _run_claimed(args) -> int:
  from fedjax_dro.engine.errors import NonFiniteError
  from fedjax_dro.engine.runner import run
  from fedjax_dro.engine.sharding import is_writer
  from fedjax_dro.records.loggers import make_loggers, run_name, tracking_flags

  trackers, log_dir = tracking_flags(args.log_to, args.log_dir, args.out)
  _compile_cache(args)
  alg, ds = _build(args)
  ds, mesh = _scale(args, ds)
  hparams = _parse_kv(args.hparam, "--hparam")
  print(
    f"fedjax-dro run: {alg.name} on {ds.name} ({ds.num_clients} clients), {args.rounds} rounds, "
    f"model {alg.model.name}; devices: {_device_line(mesh, alg)}"
  )
  # what --out holds, checked under the claim before anything runs (cross-validation included)
  if args.out and _finished_elsewhere(args, alg, ds, hparams, cv=args.cv_folds is not None):
    return 0
  if (
    args.cv_folds is not None or args.cv_grid
  ):  # K-fold CV on the training rows, then the final run
    if args.cv_folds is None or not args.cv_grid:
      raise ValueError("--cv-folds and --cv-grid must be given together")
    from fedjax_dro.model_selection import select_hparams

    hparams = select_hparams(
      alg,
      ds,
      _parse_kv(args.cv_grid, "--cv-grid", multi=True),
      folds=args.cv_folds,
      rounds=args.rounds,
      seed=args.seed,
      metric=args.cv_metric,
      hparams=hparams,
      eval_every=args.eval_every,
      out_dir=args.out,
    )
  loggers = []
  if trackers and is_writer():
    name = run_name(alg.name, ds.name, f"d{args.data_seed}", f"s{args.seed}")
    params = tracking_params(alg, ds, args, hparams)
    loggers = make_loggers(trackers, log_dir, name, params)
    print(f"logging to {', '.join(trackers)} in {log_dir} as {name}")
  try:
    hist = run(
      alg,
      ds,
      rounds=args.rounds,
      seed=args.seed,
      hparams=hparams,
      eval_every=args.eval_every,
      # off in logs: a bar written into a redirected stderr runs into the summary table
      progress=not args.no_progress and sys.stderr.isatty(),
      out_dir=args.out,
      checkpoint_dir=args.checkpoint_dir,
      checkpoint_every=args.checkpoint_every,
      keep_checkpoints=args.keep_checkpoints,
      mesh=mesh,
      loggers=loggers,
      metadata={"data_seed": args.data_seed},
    )
  except NonFiniteError as e:
    print(f"error: {e}", file=sys.stderr)
    if args.out:
      e.history.save(args.out, metrics_jsonl=False)  # run() appended metrics.jsonl already
      print(f"results up to the last finite round saved in {args.out}", file=sys.stderr)
    return 3
  finally:
    for lg in loggers:
      lg.close()
  print_table(
    summary_rows(hist.final), ["metric", "weighted mean", "mean", "worst-20%", "best-20%", "worst"]
  )
  if hist.privacy_recorded:
    print(_privacy_line(hist.evaluations[-1]["privacy"]))
  print(
    f"compile {hist.compile_time:.2f}s, run {hist.wall_time:.2f}s "
    f"({args.rounds / max(hist.wall_time, 1e-9):.1f} rounds/s)"
  )
  from fedjax_dro.engine.sharding import is_writer

  if args.out and is_writer():  # run() wrote them (no second rewrite of finished results)
    print(f"wrote metrics.jsonl, summary.json, metrics.csv and clients.csv in {args.out}")
  return 0


def tracking_params(alg, ds, args, hparams, seed=None) -> Dict[str, object]:
  """The full configuration of a tracked run, as its parameters: algorithm, dataset, data and
  training seeds, rounds, every setting (``setting.NAME``) and hyper-parameter (``hparam.NAME``,
  defaults included) and the package version."""
  from fedjax_dro import __version__
  from fedjax_dro.algorithms.base import make_hparams
  from fedjax_dro.engine.runner import shortest_floats

  params: Dict[str, object] = {
    "algorithm": alg.name,
    "dataset": ds.name,
    "num_clients": ds.num_clients,
    "data_seed": args.data_seed,
    "rounds": args.rounds,
    "fedjax_dro_version": __version__,
  }
  if seed is not None or hasattr(args, "seed"):
    params["seed"] = args.seed if seed is None else seed
  params.update({f"setting.{k}": v for k, v in alg.config.items()})
  full = {k: shortest_floats(v) for k, v in make_hparams(alg, hparams).items()}
  params.update({f"hparam.{k}": v for k, v in full.items()})
  return params


def _finished_elsewhere(args, alg, ds, hparams, cv: bool) -> bool:
  """``--out`` holding a finished run: of another configuration, refused unless ``--overwrite``
  (one line naming what is there); of this one, said to be complete with its stored summary
  (True: nothing to run). A run with a checkpoint directory resumes or finishes on its own."""
  from fedjax_dro.algorithms.base import make_hparams
  from fedjax_dro.engine.runner import shortest_floats
  from fedjax_dro.records.history import json_text

  path = os.path.join(args.out, "summary.json")
  if args.overwrite or not os.path.isfile(path):
    return False
  try:
    with open(path) as f:
      stored = json.load(f)
    old = stored["config"]
  except (OSError, ValueError, KeyError, TypeError):
    return False  # not one of our summaries: nothing to compare, the run writes its own
  new = {
    "algorithm": alg.name,
    "dataset": ds.name,
    "metadata": {"data_seed": args.data_seed},
    "seed": args.seed,
    "rounds": args.rounds,
    "settings": json.loads(json_text(alg.config)),
  }
  if not cv:
    new["hparams"] = {k: shortest_floats(v) for k, v in make_hparams(alg, hparams).items()}
  differ = [k for k, v in new.items() if old.get(k) != v]
  if differ:
    raise ValueError(
      f"--out {args.out} holds a finished run of another configuration ({old.get('algorithm')} "
      f"on {old.get('dataset')}, training seed {old.get('seed')}, {old.get('rounds')} rounds; "
      f"differs in "
      f"{', '.join(differ)}); pass --overwrite to replace it, or choose another --out"
    )
  if args.checkpoint_dir or stored.get("rounds_done") != args.rounds:
    return False
  print(f"{args.out} already holds this run, complete ({args.rounds} rounds); its summary:")
  print_table(
    summary_rows(stored["final"]),
    ["metric", "weighted mean", "mean", "worst-20%", "best-20%", "worst"],
  )
  return True


def cmd_sweep(args) -> int:
  from fedjax_dro.engine.sharding import is_writer

  _distributed(args)
  _cpu_devices(args)
  _check_paths(args)
  _check_counts(args)
  with _claim(args, "sweep", is_writer(), results=("sweep.json",)) as claim:
    return _sweep_claimed(args, claim)


def _claim(args, command: str, writer: bool = True, results=()):
  """The command's claim of its output directories, taken before anything is checked, loaded or
  compiled (:class:`~fedjax_dro.records.claim.OutputClaim` on ``--out``; for ``run``, also the
  checkpoint lock on ``--checkpoint-dir``, whose foreign files are refused first): a second
  command writing there is refused with one line naming the holder, and what the directory
  holds is checked under the claim. Outside the writer process of a multi-process run, nothing
  is claimed."""
  import contextlib

  from fedjax_dro.records.claim import OutputClaim

  out, ckpt = getattr(args, "out", None), getattr(args, "checkpoint_dir", None)
  claim = OutputClaim(out, "--out", command, results) if out is not None and writer else None
  with contextlib.ExitStack() as stack:
    if claim is not None:
      stack.enter_context(claim)
    if ckpt is not None and writer:
      from fedjax_dro.records.checkpoint import CheckpointLock, scan

      scan(ckpt)  # foreign files: refused before the lock file is created
      stack.enter_context(CheckpointLock(ckpt, reentrant=True))
    return _Claimed(stack.pop_all(), claim)


class _Claimed:
  """A held claim (``with``: released on exit); ``check``/``finish`` act on ``--out``'s job
  record, and do nothing where there is no ``--out`` (or in a process that does not write)."""

  def __init__(self, stack, claim):
    self._stack, self._claim = stack, claim

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return self._stack.__exit__(*exc)

  def check(self, config, overwrite: bool) -> bool:
    return False if self._claim is None else self._claim.check(config, overwrite=overwrite)

  def finish(self) -> None:
    if self._claim is not None:
      self._claim.finish()


def _sweep_claimed(args, claim) -> int:
  from fedjax_dro.engine.sharding import is_writer
  from fedjax_dro.engine.sweeps import sweep
  from fedjax_dro.records.history import json_text
  from fedjax_dro.records.loggers import log_sweep_to, run_name, tracking_flags

  trackers, log_dir = tracking_flags(args.log_to, args.log_dir, args.out)
  _compile_cache(args)
  seeds = _parse_seeds(args.seeds)
  alg, ds = _build(args)
  grid = _parse_kv(args.grid, "--grid", multi=True)
  config = {
    "algorithm": alg.name,
    "dataset": ds.name,
    "data_seed": args.data_seed,
    "settings": json.loads(json_text(alg.config)),
    "grid": grid,
    "seeds": seeds,
    "hparams": _parse_kv(args.hparam, "--hparam"),
    "rounds": args.rounds,
    "eval_every": args.eval_every,
  }
  if claim.check(config, overwrite=args.overwrite):
    print(f"{args.out} already holds this sweep, complete: sweep.json and sweep.csv")
    return 0
  ds, mesh = _scale(args, ds, num_configs=math.prod(len(v) for v in grid.values()) * len(seeds))
  print(f"fedjax-dro sweep: {alg.name} on {ds.name}; devices: {_device_line(mesh, alg)}")
  print(_sweep_size(alg, ds, grid, seeds), flush=True)
  res = sweep(
    alg,
    ds,
    rounds=args.rounds,
    grid=grid,
    seeds=seeds,
    hparams=_parse_kv(args.hparam, "--hparam"),
    eval_every=args.eval_every,
    mesh=mesh,
  )
  metric = "accuracy" if alg.model.task == "classification" else "r2"
  rows = [
    [
      json.dumps(c["hparams"]),
      c["seed"],
      _fmt(s[metric]["mean"]),
      _fmt(s[metric]["worst20"]),
      "yes" if d else "",
    ]
    for c, s, d in zip(res.configs, res.final_summary, res.diverged)
  ]
  header = ["hparams", "training seed", f"{metric} mean", f"{metric} worst-20%", "diverged"]
  if res.privacy is not None:  # each row's epsilon after its rounds (its own noise multiplier)
    header.append(f"epsilon (delta {alg.privacy.delta:.3g})")
    for row, record in zip(rows, res.privacy):
      row.append(f"{record['epsilon']:.4g}")
  print_table(rows, header)
  print(
    f"best (mean {metric}): {res.best(metric)}; {len(res.configs)} runs in one program: "
    f"compile {res.compile_time:.2f}s, run {res.wall_time:.2f}s"
  )
  if len(seeds) > 1 and _seeds_changed_nothing(res):
    print(
      "note: every training seed gave the same results: nothing in this configuration is "
      "random (all clients take part, full batches, a fixed initialization); --data-seed draws "
      "other data, --clients-per-round or --batch-size make the training stochastic"
    )
  res.metadata = {"data_seed": args.data_seed}
  if args.out and is_writer():
    res.save(args.out)
    claim.finish()
    print(f"wrote sweep.json and sweep.csv in {args.out}")
  if trackers and is_writer():  # one tracked run per row, under one sweep name
    base = run_name(alg.name, ds.name, f"d{args.data_seed}", "sweep")
    params = tracking_params(alg, ds, args, _parse_kv(args.hparam, "--hparam"), seed=seeds[0])
    log_sweep_to(res, trackers, log_dir, base, params)
    print(f"logged {len(res.configs)} rows to {', '.join(trackers)} in {log_dir} as {base}/")
  return 0


def _sweep_size(alg, ds, grid, seeds) -> str:
  """The sweep's size, said before its host-side preparation starts: the runs (grid points
  times seeds) and the device memory their states take (each row holds a whole state)."""
  import jax

  rows = math.prod(len(v) for v in grid.values()) * len(seeds)
  axes = " x ".join(str(len(v)) for v in grid.values()) or "1"
  line = f"{rows:,} runs (grid {axes}, {len(seeds)} seed{'s' * (len(seeds) > 1)}) in one program"
  try:  # the states' shapes, traced abstractly (nothing is computed)
    key = jax.random.PRNGKey(0)
    shapes = jax.eval_shape(lambda k: alg.init(alg.model.init(k), ds.train, k), key)
  except Exception:  # noqa: BLE001  the size line must not stop a sweep the engine accepts
    return line
  per_row = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(shapes))
  return f"{line}; their states take about {_bytes(rows * per_row)} of device memory"


def _bytes(n: float) -> str:
  """``n`` bytes in decimal units (``204.0 MB``)."""
  unit = "B"
  for unit in ("B", "KB", "MB", "GB", "TB"):
    if n < 1000 or unit == "TB":
      break
    n /= 1000
  return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"


def _seeds_changed_nothing(res) -> bool:
  """Whether the rows of every grid point are identical across the training seeds."""
  groups: Dict[str, list] = {}
  for c, s in zip(res.configs, res.final_summary):
    groups.setdefault(json.dumps(c["hparams"], sort_keys=True), []).append(json.dumps(s))
  return all(len(set(v)) == 1 for v in groups.values())


def cmd_list(args) -> int:
  from fedjax_dro.algorithms import describe, list_algorithms
  from fedjax_dro.data import list_datasets

  if args.name is not None:
    print(describe(args.name), end="")
    return 0
  print("Algorithms:")
  for name, e in list_algorithms().items():
    print(f"  {name:<22} {e.description}")
  print("Datasets:")
  for name, e in list_datasets().items():
    print(f"  {name:<22} {e.description}")
  return 0


def cmd_plot(args) -> int:
  from fedjax_dro.records import plot

  for path in plot(args.dirs, args.out, metric=args.metric):
    print(f"wrote {path}")
  return 0


def cmd_reproduce(args) -> int:
  _check_paths(args)  # before any computing: --out /etc/passwd is refused at once
  _check_counts(args)
  with _claim(args, "reproduce") as claim:
    return _reproduce_claimed(args, claim)


def _reproduce_claimed(args, claim) -> int:
  from fedjax_dro.reproduce import EXPERIMENTS, reproduce

  _compile_cache(args)
  inputs = {}  # the user's data files, passed only to the experiments that read them
  for option, name in (
    ("--data-dir", "data_dir"),
    ("--features", "features"),
    ("--leaf-dir", "leaf_dir"),
    ("--weights-dir", "weights_dir"),
  ):
    value = getattr(args, name)
    if value is None:
      continue
    if name not in inspect.signature(EXPERIMENTS[args.experiment]).parameters:
      raise ValueError(f"{option}: reproduce {args.experiment} reads no such input")
    inputs[name] = value
  if args.part is not None:
    if "part" not in inspect.signature(EXPERIMENTS[args.experiment]).parameters:
      raise ValueError(f"--part: reproduce {args.experiment} does not split into parts yet")
    if args.out is None:
      raise ValueError("--part needs --out: a part records its runs there for fedjax-dro merge")
    inputs["part"] = args.part
  config = {
    "experiment": args.experiment,
    "rounds": args.rounds,
    "quick": args.quick,
    "seed": args.seed,
    "inputs": {k: v if k == "part" else os.path.abspath(v) for k, v in inputs.items()},
  }
  claim.check(config, overwrite=args.overwrite)  # the same one again: its finished runs resume
  reproduce(
    args.experiment,
    out_dir=args.out,
    rounds=args.rounds,
    quick=args.quick,
    seed=args.seed,
    **inputs,
  )
  claim.finish()
  return 0


def cmd_merge(args) -> int:
  """``fedjax-dro merge --out OUT PART...``: the run records of the parts of one ``reproduce``
  or ``compare`` (``--part i/N``) joined in --out, and the table written from them (no run is
  computed again; the table equals one run of the whole)."""
  import json

  from fedjax_dro.compare.resume import merge_runs

  found = []
  for part in args.parts:
    records = [
      (c, os.path.join(part, f".fedjax-dro-{c}.json"))
      for c in ("reproduce", "compare")
      if os.path.isfile(os.path.join(part, f".fedjax-dro-{c}.json"))
    ]
    if not records:
      raise ValueError(f"PART {part}: no reproduce or compare job record; not a part's --out")
    command, path = records[0]
    with open(path) as f:
      job = json.load(f)
    config = dict(job.get("config", {}))
    inputs = dict(config.get("inputs", {}))
    inputs.pop("part", None)
    config.pop("part", None)
    if "inputs" in config:
      config["inputs"] = inputs
    found.append((command, config))
  if len({json.dumps(f, sort_keys=True) for f in found}) != 1:
    raise ValueError(
      "PART: the parts are not of one command and configuration (their --part aside)"
    )
  command, config = found[0]
  if args.out is None:
    raise ValueError("--out: none given; the folder the merged table goes to")
  _check_paths(args)
  with _claim(args, command) as claim:
    claim.check(config, overwrite=args.overwrite)
    copied = merge_runs(args.out, args.parts)
    print(f"merge: {copied} run records from {len(args.parts)} parts into {args.out}")
    if command == "reproduce":
      from fedjax_dro.reproduce import reproduce

      result = reproduce(
        config["experiment"],
        out_dir=args.out,
        rounds=config["rounds"],
        quick=config["quick"],
        seed=config["seed"],
        **config["inputs"],
      )
    else:
      from fedjax_dro.compare import compare
      from fedjax_dro.compare.config import experiment_from_config

      result = compare(experiment_from_config(config), out_dir=args.out, progress=False)
    if result is None:
      raise ValueError("PART: the parts given do not hold every run of the table")
    claim.finish()
  return 0


def cmd_compare(args) -> int:
  """``fedjax-dro compare CONFIG``: the comparison a TOML file declares
  (:mod:`fedjax_dro.compare.config`), written to ``--out`` (default: ``compare-NAME``)."""
  from fedjax_dro.compare import compare
  from fedjax_dro.compare.config import experiment_from_config, load_config

  config = load_config(args.config)
  experiment = experiment_from_config(config)
  if args.out is None:
    args.out = f"compare-{experiment.name}"
  _check_paths(args)
  with _claim(args, "compare", results=(f"{experiment.name}.json",)) as claim:
    recorded = config if args.part is None else {**config, "part": args.part}
    claim.check(recorded, overwrite=args.overwrite)  # the same again: its finished runs resume
    _compile_cache(args)
    compare(experiment, out_dir=args.out, progress=not args.no_progress, part=args.part)
    claim.finish()
  return 0


# ``fedjax-dro features``: a ResNet's penultimate features of the user's images ------------------

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # torchvision's Normalize for ImageNet-trained weights
IMAGENET_STD = (0.229, 0.224, 0.225)
FEATURE_MODELS = {"resnet18": 512, "resnet50": 2048}  # the features' width
FEATURE_DATASETS = ("cifar100", "cifar10", "tinyimagenet")


def _one_line(error: BaseException) -> str:
  return " ".join(str(error).split())


def _check_features_args(args) -> None:
  """Every flag of ``features`` checked before anything is read or compiled."""
  if args.model not in FEATURE_MODELS:
    raise ValueError(
      f"--model: unknown model {args.model!r}; choose one of {', '.join(FEATURE_MODELS)}"
    )
  if args.dataset is None or args.dataset not in FEATURE_DATASETS:
    got = "none given" if args.dataset is None else f"unknown data set {args.dataset!r}"
    raise ValueError(f"--dataset: {got}; choose one of {', '.join(FEATURE_DATASETS)}")
  if args.data_dir is None:
    raise ValueError("--data-dir: none given; the folder (or TinyImageNet .npz) of the images")
  if not os.path.exists(os.path.expanduser(args.data_dir)):
    raise ValueError(f"--data-dir: {args.data_dir!r} does not exist")
  if args.weights is None and not args.random_weights:
    raise ValueError(
      "--weights: none given; features of random weights are meaningless: give the model's "
      ".safetensors file (torchvision's or timm's names), or --random-weights for a smoke test"
    )
  if args.weights is not None and args.random_weights:
    raise ValueError("--random-weights: give it or --weights, not both")
  if args.weights is not None:
    from fedjax_dro.models.weights import refuse_pickle_formats

    try:
      refuse_pickle_formats(args.weights)
    except ValueError as e:
      raise ValueError(f"--weights: {_one_line(e)}") from None
    if not os.path.isfile(args.weights):
      raise ValueError(f"--weights: {args.weights!r} is not a file")
  if args.batch_size < 1:
    raise ValueError(f"--batch-size: must be >= 1, got {args.batch_size}")
  if args.image_size is not None and args.image_size < 1:
    raise ValueError(f"--image-size: must be >= 1, got {args.image_size}")
  if args.out is None:
    raise ValueError("--out: none given; the features .npz to write")
  if not args.out.endswith(".npz"):
    raise ValueError(f"--out: {args.out!r} must name an .npz file")
  if os.path.isdir(args.out):
    raise ValueError(f"--out: {args.out!r} is a directory; name the .npz file to write")
  if os.path.exists(args.out) and not args.overwrite:
    raise ValueError(f"--out: {args.out!r} exists; --overwrite replaces it")
  from fedjax_dro.records.files import check_writable_dir

  check_writable_dir(os.path.dirname(os.path.abspath(args.out)), "--out's folder")


def _feature_model(args):
  """The ResNet returning its pooled features and its variables: from --weights (``fc``'s
  width read off the file; a file without ``fc`` loads too) or random (--random-weights)."""
  import jax
  import jax.numpy as jnp

  from fedjax_dro.models.resnet import resnet18, resnet50, resnet_variables_from_torchvision

  build = {"resnet18": resnet18, "resnet50": resnet50}[args.model]
  if args.weights is None:
    module = build(1000, features_only=True)
    sample = jnp.zeros((1, 64, 64, 3), jnp.float32)
    init = jax.jit(lambda k: module.init(k, sample, train=False))
    return module, init(jax.random.PRNGKey(args.seed))
  from fedjax_dro.models.weights import read_safetensors

  try:
    tensors = read_safetensors(args.weights)
    conv1 = tensors.get("conv1.weight")
    if conv1 is not None and (conv1.ndim != 4 or conv1.shape[1] != 3):
      raise ValueError(f"conv1.weight has shape {conv1.shape}; RGB images need [64, 3, 7, 7]")
    fc = tensors.get("fc.weight")
    num_classes = int(fc.shape[0]) if fc is not None and fc.ndim == 2 else 1000
    module = build(num_classes, features_only="fc.weight" not in tensors)
    variables = resnet_variables_from_torchvision(tensors, module, in_channels=3)
  except ValueError as e:
    raise ValueError(f"--weights: {args.weights}: {_one_line(e)}") from None
  return module.clone(features_only=True), variables


def _feature_images(args):
  """The reader's :class:`~fedjax_dro.data.user_files.ImageSet` of --dataset in --data-dir."""
  from fedjax_dro.data import load_cifar10, load_cifar100, load_tiny_imagenet

  read = {"cifar100": load_cifar100, "cifar10": load_cifar10, "tinyimagenet": load_tiny_imagenet}
  try:
    return read[args.dataset](os.path.expanduser(args.data_dir))
  except (FileNotFoundError, ValueError, TypeError, ImportError) as e:
    raise ValueError(f"--data-dir: {_one_line(e)}") from None


def image_features(module, variables, images, *, batch_size=256, image_size=None, bar=None):
  """``module``'s outputs (in inference mode) on ``images`` (float ``[N, H, W, 3]`` in
  ``[0, 1]``, or a list of such arrays, taken one after the other), as a float32 NumPy ``[N, d]``:
  each image resized to ``image_size`` x ``image_size`` first when given (``jax.image.resize``,
  bilinear, antialiased when shrinking), then normalized with ImageNet's per-channel mean
  (0.485, 0.456, 0.406) and standard deviation (0.229, 0.224, 0.225), in compiled batches of
  ``min(batch_size, N)`` (the last one padded, so one program serves all); ``bar`` (a tqdm bar
  or None) is advanced once a batch."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  parts = [images] if isinstance(images, np.ndarray) else list(images)
  starts = np.cumsum([0] + [len(p) for p in parts])
  n = int(starts[-1])
  b = max(1, min(batch_size, n))
  mean, std = np.asarray(IMAGENET_MEAN, np.float32), np.asarray(IMAGENET_STD, np.float32)

  @jax.jit
  def embed(variables, x):
    if image_size is not None:
      x = jax.image.resize(x, (x.shape[0], image_size, image_size, x.shape[3]), "bilinear")
    return module.apply(variables, (x - mean) / std, train=False)

  def rows(begin, end):  # rows [begin, end) of the parts, one after the other
    pieces = []
    for part, first in zip(parts, starts[:-1]):
      lo, hi = max(begin, first), min(end, first + len(part))
      if lo < hi:
        pieces.append(np.asarray(part[lo - first : hi - first], np.float32))
    return np.concatenate(pieces)

  variables = jax.device_put(variables)
  out = []
  for begin in range(0, n, b):
    x = rows(begin, min(begin + b, n))
    count = len(x)
    if count < b:
      x = np.concatenate([x, np.zeros((b - count,) + x.shape[1:], np.float32)])
    out.append(np.asarray(embed(variables, jnp.asarray(x)), np.float32)[:count])
    if bar is not None:
      bar.update(1)
  return np.concatenate(out)


def _option_value(text: str):
  """A ``--option KEY=VALUE`` value: an int, a float, true / false / none, or the string."""
  low = text.lower()
  if low in ("true", "false"):
    return low == "true"
  if low == "none":
    return None
  for kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      pass
  return text


def cmd_prepare(args) -> int:
  """``fedjax-dro prepare SOURCE DIR --out PREPARED``: a dataset written once in the prepared
  format (:mod:`fedjax_dro.data.prepared`); resumable, never replacing a finished --out."""
  from fedjax_dro.data import prepared

  options = {}
  for item in args.option:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
      raise ValueError(f"--option must be KEY=VALUE, got {item!r}")
    options[key.strip().replace("-", "_")] = _option_value(value.strip())
  if args.source not in prepared.READERS:
    raise ValueError(f"SOURCE must be one of {sorted(prepared.READERS)}, got {args.source!r}")
  path = args.dir
  if args.standin:
    path = prepared.write_standin(args.source, args.dir)
    print(f"prepare: wrote the {args.source} STAND-IN (generated, tiny; not the dataset) in {path}")
  out = prepared.prepare(
    args.source,
    path,
    args.out,
    overwrite=args.overwrite,
    progress=not args.no_progress and sys.stderr.isatty(),
    **options,
  )
  manifest = prepared.read_manifest(out, verify=False)
  print(f"prepare: {manifest['dataset']} -> {out}")
  for name, split in manifest["splits"].items():
    size = sum(a["bytes"] for a in split["arrays"].values())
    print(
      f"  {name}: {len(split['clients'])} clients, {split['total_rows']:,} rows, "
      f"{size / 2**20:,.1f} MiB"
    )
  return 0


def cmd_features(args) -> int:
  """``fedjax-dro features``: the pooled features of --model (``fc``'s input) on every image of
  --dataset, train then test, written to --out as a features file (``split``: the test images
  held out) that ``reproduce scaffpd-table1 --features`` reads."""
  import numpy as np

  from fedjax_dro.data import write_features

  _check_features_args(args)
  module, variables = _feature_model(args)
  data = _feature_images(args)
  n_train, n_test = len(data.y_train), len(data.y_test)
  n = n_train + n_test
  b = max(1, min(args.batch_size, n))
  batches = -(-n // b)
  h, w = data.x_train.shape[1:3]
  size = f"{h}x{w}" + (
    f" resized to {args.image_size}x{args.image_size}" if args.image_size is not None else ""
  )
  weights = args.weights if args.weights is not None else "RANDOM weights (a smoke test)"
  print(
    f"features: {n:,} images of {args.dataset} ({n_train:,} train, {n_test:,} test; {size}, "
    f"ImageNet mean/std normalization) through {args.model} ({weights}) in {batches:,} batches "
    f"of {b} -> {FEATURE_MODELS[args.model]}-d features",
    flush=True,
  )
  bar = None
  if not args.no_progress and sys.stderr.isatty():
    from tqdm.auto import tqdm

    bar = tqdm(total=batches, desc="features", unit="batch", leave=False)
  try:
    images = (data.x_train, data.x_test)  # train then test, not copied into one array
    feats = image_features(
      module, variables, images, batch_size=b, image_size=args.image_size, bar=bar
    )
  finally:
    if bar is not None:
      bar.close()
  labels = np.concatenate([data.y_train, data.y_test])
  split = np.concatenate([np.zeros(n_train, bool), np.ones(n_test, bool)])
  folder, name = os.path.split(os.path.abspath(args.out))
  tmp = os.path.join(folder, f".{name[:-4]}.tmp-{os.getpid()}.npz")
  try:
    write_features(tmp, feats, labels, split)
    os.replace(tmp, args.out)  # atomic: --out is the old file or the whole new one
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  print(
    f"wrote {args.out}: features [{n}, {feats.shape[1]}], labels ({data.num_classes} "
    f"classes), split ({n_test:,} test rows held out)"
  )
  return 0


def interrupted_message(args) -> str:
  """The one line printed on Ctrl-C: the round of the newest checkpoint and how to resume, or
  what is kept without one."""
  ckpt, out = getattr(args, "checkpoint_dir", None), getattr(args, "out", None)
  rounds = []
  if ckpt and os.path.isdir(ckpt):
    from fedjax_dro.records.checkpoint import scan

    try:
      rounds = scan(ckpt)
    except (OSError, ValueError):
      rounds = []
  if rounds:
    return (
      f"interrupted: stopped after round {rounds[-1]} (checkpoint in {ckpt}); rerun the same "
      "command to resume"
    )
  if args.command == "run":
    kept = f"; the evaluations finished so far are in {out}/metrics.jsonl" if out else ""
    how = (
      "before the first checkpoint; a rerun starts over"
      if ckpt
      else "with no checkpoint (--checkpoint-dir DIR makes a run resumable)"
    )
    return f"interrupted {how}{kept}"
  if args.command == "features":
    return "interrupted: features stopped; nothing was written (--out is written at the end)"
  kept = f"; the files already finished in {out} are kept" if out else ""
  runs = os.path.join(out, "runs") if out else None
  if args.command in ("compare", "reproduce") and runs and os.path.isdir(runs):
    done = sum(
      n.endswith(".json")
      for d in os.listdir(runs)
      if os.path.isdir(os.path.join(runs, d))
      for n in os.listdir(os.path.join(runs, d))
    )
    kept = f"; {done} finished runs are recorded in {runs}: rerun the same command to resume"
  return f"interrupted: {args.command} stopped{kept}"


def _add_output(p: argparse.ArgumentParser, files: str, what: str, bar: bool) -> None:
  """The output flags of every command that runs rounds (run, sweep, compare, reproduce):
  ``--out``, ``--overwrite`` and ``--no-progress``, so that one command line's flags serve all."""
  p.add_argument("--out", default=None, help=f"directory for {files}")
  p.add_argument(
    "--overwrite",
    action="store_true",
    help=f"replace a finished {what} of another configuration in --out (refused without it)",
  )
  p.add_argument(
    "--no-progress",
    action="store_true",
    help="no progress bar (there is none when stderr is not a terminal)"
    if bar
    else "no progress bar (there is none when stderr is not a terminal; the job's size and "
    "each finished run are printed all the same)",
  )


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
  """Every flag's default in its help (where it has one: not None, off or empty); descriptions
  and epilogs kept as written."""

  def _get_help_string(self, action):
    if action.default in (None, False, [], argparse.SUPPRESS) or "%(default)" in (
      action.help or ""
    ):
      return action.help
    return super()._get_help_string(action)

  def _split_lines(self, text, width):
    """Lines broken at spaces only: a flag in a help (``--dp-noise``) is never split."""
    return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def _reproduce_epilog() -> str:
  from fedjax_dro.reproduce import EXPERIMENTS, RUN_TIMES

  lines = ["experiments (run time on 2 CPU cores without --quick):"]
  for name in sorted(EXPERIMENTS):
    lines.append(f"  {name:<18} {RUN_TIMES.get(name, '')}")
  return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
  """The ``fedjax-dro`` argument parser (every command and flag, each with its help)."""
  parser = argparse.ArgumentParser(
    prog="fedjax-dro",
    description="fedjax-dro: simulated federated learning (distributionally robust and "
    "personalized algorithms) in JAX. Commands: run, sweep, compare, reproduce, features, plot, "
    "list; "
    "`fedjax-dro COMMAND --help` for each.",
    formatter_class=_HelpFormatter,
  )
  sub = parser.add_subparsers(dest="command")
  add_parser = lambda *a, **k: sub.add_parser(*a, formatter_class=_HelpFormatter, **k)  # noqa: E731
  p_run = add_parser("run", help="run one algorithm on one dataset and print a summary table")
  _add_common(p_run)
  p_run.add_argument(
    "--seed",
    type=int,
    default=0,
    help="training seed: model initialization, client sampling, minibatches (the data are drawn "
    "with --data-seed)",
  )
  _add_output(p_run, "metrics.jsonl and summary.json", "run", bar=True)
  p_run.add_argument(
    "--checkpoint-dir",
    default=None,
    help="save state after every evaluation chunk; rerunning the same command resumes",
  )
  p_run.add_argument(
    "--checkpoint-every",
    type=int,
    default=None,
    metavar="K",
    help="checkpoint at the first evaluation after every K rounds (default: every evaluation)",
  )
  p_run.add_argument(
    "--keep-checkpoints", type=int, default=2, metavar="N", help="keep the newest N checkpoints"
  )
  p_run.add_argument(
    "--cv-folds",
    type=int,
    default=None,
    help="pick the --cv-grid point by K-fold CV on the clients' training rows first",
  )
  p_run.add_argument(
    "--cv-grid",
    action="append",
    default=[],
    metavar="NAME=V1,V2,...",
    help="hyper-parameter grid for --cv-folds (repeatable)",
  )
  p_run.add_argument(
    "--cv-metric",
    default="loss",
    help="held-out metric for --cv-folds "
    "(loss, mse, r2, accuracy; example-weighted mean over clients)",
  )
  p_sweep = add_parser("sweep", help="vmapped sweep over a hyper-parameter grid and seeds")
  _add_common(p_sweep)
  p_sweep.add_argument(
    "--grid",
    action="append",
    default=[],
    metavar="NAME=V1,V2,...",
    help="values of one hyper-parameter (repeatable; the sweep runs their product); the names "
    "are in `fedjax-dro list ALGORITHM`",
  )
  p_sweep.add_argument(
    "--seeds",
    default="0",
    metavar="S1,S2,...",
    help="training seeds (model initialization, client sampling, minibatches), as run --seed; "
    "every grid point runs with each; the data are drawn once, with --data-seed",
  )
  _add_output(p_sweep, "sweep.json and sweep.csv", "sweep", bar=False)
  p_rep = add_parser("reproduce", help="reproduce a paper figure (JSON + PNG)")
  from fedjax_dro.reproduce import EXPERIMENTS

  p_rep.epilog = _reproduce_epilog()
  p_rep.add_argument("experiment", choices=sorted(EXPERIMENTS), help="the experiment (below)")
  _add_output(p_rep, "the experiment's JSON, markdown and PNG files", "reproduction", bar=False)
  p_rep.add_argument(
    "--rounds", type=int, default=None, help="communication rounds (default: the experiment's)"
  )
  p_rep.add_argument(
    "--part",
    default=None,
    metavar="i/N",
    help="run only every N-th run of the table, starting with run i (N machines or a Slurm "
    "array: --part $((SLURM_ARRAY_TASK_ID+1))/N); fedjax-dro merge joins the parts",
  )
  p_rep.add_argument(
    "--quick",
    action="store_true",
    help="tiny grids, few rounds, small data: a smoke run, labelled quick in its tables",
  )
  p_rep.add_argument(
    "--seed",
    type=int,
    default=0,
    help="the experiment's first seed (its seeds are SEED, SEED+1, ...; each draws the data and "
    "the training randomness)",
  )
  p_rep.add_argument(
    "--data-dir", default=None, help="folder with the image data set the experiment reads"
  )
  p_rep.add_argument(
    "--features", default=None, help=".npz of precomputed features the experiment reads"
  )
  p_rep.add_argument(
    "--leaf-dir", default=None, help="folder of LEAF FEMNIST JSON files the experiment reads"
  )
  p_rep.add_argument(
    "--weights-dir",
    default=None,
    help="folder of published .safetensors weights the experiment starts from (fgdro-table3, "
    "fgdro-figure1: densenet121, resnet50; fgdro-table2: distilbert-base-uncased)",
  )
  _add_compile_cache(p_rep)
  p_cmp = add_parser(
    "compare", help="a fair comparison of strategies declared in a TOML file (JSON + MD + PNG)"
  )
  p_cmp.add_argument("config", help="the TOML file (see fedjax_dro.compare.config)")
  p_cmp.add_argument(
    "--part",
    default=None,
    metavar="i/N",
    help="run only every N-th run of the table, starting with run i; fedjax-dro merge joins "
    "the parts",
  )
  _add_output(
    p_cmp, "NAME.json, NAME.md and NAME.png (default: compare-NAME)", "comparison", bar=False
  )
  _add_compile_cache(p_cmp)
  p_feat = add_parser(
    "features",
    help="a ResNet's penultimate features of CIFAR / TinyImageNet images, written to a features "
    ".npz (what reproduce scaffpd-table1 --features reads)",
  )
  p_feat.add_argument(
    "--model",
    default="resnet18",
    help="the network: resnet18 (512-d features) or resnet50 (2048-d); the features are the "
    "input of its final layer fc",
  )
  p_feat.add_argument(
    "--weights",
    default=None,
    metavar="FILE",
    help="the model's .safetensors file under torchvision's names (torchvision's or timm's "
    "resnet18 / resnet50); pickles (.pth, .pt, .bin, .pkl, .ckpt) are refused",
  )
  p_feat.add_argument(
    "--random-weights",
    action="store_true",
    help="random weights instead of --weights: for a smoke test only (such features are "
    "meaningless)",
  )
  p_feat.add_argument("--seed", type=int, default=0, help="the random key of --random-weights")
  p_feat.add_argument(
    "--data-dir",
    default=None,
    help="the images: the cifar-100-binary (cifar-10-batches-bin) folder or the folder holding "
    "it; for tinyimagenet the tiny-imagenet-200 folder or its .npz form",
  )
  p_feat.add_argument(
    "--dataset", default=None, help="the images' data set: cifar100, cifar10 or tinyimagenet"
  )
  p_feat.add_argument(
    "--out",
    default=None,
    help="the .npz to write: features, labels and split (the data set's test images held out); "
    "written whole at the end",
  )
  p_feat.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
  p_feat.add_argument(
    "--batch-size", type=int, default=256, help="images a compiled batch (the last one padded)"
  )
  p_feat.add_argument(
    "--image-size",
    type=int,
    default=None,
    metavar="N",
    help="resize the images to N x N first (bilinear), e.g. 224, ImageNet's training size "
    "(default: as stored); then ImageNet's mean and standard deviation normalize them",
  )
  p_feat.add_argument(
    "--no-progress",
    action="store_true",
    help="no progress bar (there is none when stderr is not a terminal)",
  )
  p_merge = add_parser(
    "merge",
    help="join the parts of a reproduce / compare run with --part i/N (their --out folders) "
    "into --out and write the table from their records",
  )
  p_merge.add_argument("parts", nargs="+", metavar="PART", help="the parts' --out folders")
  p_merge.add_argument("--out", default=None, help="the folder of the merged table")
  p_merge.add_argument(
    "--overwrite", action="store_true", help="replace a finished table of another configuration"
  )
  p_prep = add_parser(
    "prepare",
    help="write a dataset once as client-sorted, unpadded, memory-mapped arrays (resumable) "
    "for streamed rounds (fedjax_dro.data.load_prepared)",
  )
  p_prep.add_argument(
    "source",
    help="the reader: camelyon17, iwildcam, poverty, civilcomments (WILDS), pile (the "
    "uncopyrighted Pile), shakespeare (LEAF), fedcifar100, stackoverflow (TFF's HDF5)",
  )
  p_prep.add_argument("dir", help="the dataset's directory, in its publisher's layout")
  p_prep.add_argument("--out", required=True, help="the prepared directory to write")
  p_prep.add_argument(
    "--option",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="a reader option, repeatable (image_size=448, clients=10, seq_len=1024, "
    "tokenizer=FILE, dtype=float16, ...; see the reader's docs)",
  )
  p_prep.add_argument(
    "--standin",
    action="store_true",
    help="first write the reader's generated stand-in (tiny, the publisher's layout) into DIR "
    "and prepare that: for a smoke test only",
  )
  p_prep.add_argument(
    "--overwrite",
    action="store_true",
    help="replace a finished --out (only once the new one is complete), or restart an "
    "interrupted prepare of another configuration",
  )
  p_prep.add_argument("--no-progress", action="store_true", help="no progress bar")
  p_plot = add_parser("plot", help="PNG plots of run / sweep output directories")
  p_plot.add_argument("dirs", nargs="+", help="run directories (seeds) and/or sweep directories")
  p_plot.add_argument("--out", default=None, help="output directory (default: the first dir)")
  p_plot.add_argument("--metric", default=None, help="metric to plot (default: accuracy or r2)")
  p_list = add_parser(
    "list", help="list algorithms and datasets; with NAME, an algorithm's settings and hparams"
  )
  p_list.add_argument(
    "name",
    nargs="?",
    default=None,
    help="an algorithm: print its settings and hyper-parameters (defaults, ranges, meanings)",
  )
  return parser


def main(argv: Optional[List[str]] = None, *, exit_on_interrupt: bool = False) -> int:
  """Runs the command line ``argv`` (default: ``sys.argv[1:]``) and returns its exit status:
  0 done, 1 an operating-system error (one line naming the path), 2 bad input (one line naming
  the flag), 3 a run stopped by a non-finite value, 130 interrupted (one line saying what is
  kept; also when the interrupt arrives while the package is still loading).

  With ``exit_on_interrupt`` (the program, :func:`entry`), Ctrl-C once the command has started
  prints that line and ends the process at once with status 130: a ``KeyboardInterrupt``
  raised wherever Python happens to be could land in a garbage-collection callback of the
  runtime, where it is printed as ignored and the command goes on."""
  import signal

  args = None
  try:
    parser = _start(build_parser)  # loads the registries and JAX
    args = parser.parse_args(argv)
    if args.command is None:
      parser.print_help()
      return 2
    if exit_on_interrupt and _in_main_thread():
      signal.signal(signal.SIGINT, _exit_on_interrupt(args))
    return _dispatch(args)
  except (KeyboardInterrupt, ImportError) as e:  # Ctrl-C: one line, exit code 130
    if isinstance(e, ImportError) and not _interrupted_import(e):
      raise
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C cannot cut the line short
    line = "interrupted while starting: nothing was run" if args is None else None
    print(line or interrupted_message(args), file=sys.stderr, flush=True)
    return 130


def _in_main_thread() -> bool:
  import threading

  return threading.current_thread() is threading.main_thread()


def _exit_on_interrupt(args):
  """The SIGINT handler of a started command: the one line, then ``os._exit(130)`` (files are
  only ever replaced atomically, so nothing is left half-written; the operating system frees
  the devices' buffers with the process)."""
  import signal

  def handler(signum, frame):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C cannot cut the line short
    try:
      line = interrupted_message(args)
    except Exception:  # noqa: BLE001  the line must come out whatever the directories hold
      line = f"interrupted: {args.command} stopped"
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except (OSError, ValueError):
        pass
    try:
      os.write(2, (line + "\n").encode())
    finally:
      os._exit(130)

  return handler


def _start(load):
  """``load()`` with Ctrl-C held back until it returns, then raised as ``KeyboardInterrupt``:
  an interrupt inside a compiled extension's initialization would surface as an ``ImportError``
  with a traceback. Outside the main thread (no signal handlers there), just ``load()``."""
  import signal

  if not _in_main_thread():
    return load()
  caught = []
  previous = signal.signal(signal.SIGINT, lambda *_: caught.append(True))
  try:
    value = load()
  finally:
    signal.signal(signal.SIGINT, previous)
  if caught:
    raise KeyboardInterrupt
  return value


def _interrupted_import(error: BaseException) -> bool:
  """Whether an ``ImportError`` was caused by Ctrl-C during a module's initialization."""
  seen = set()
  while error is not None and id(error) not in seen:
    if isinstance(error, KeyboardInterrupt):
      return True
    seen.add(id(error))
    error = error.__cause__ or error.__context__
  return False


def _dispatch(args) -> int:
  command = {
    "run": cmd_run,
    "sweep": cmd_sweep,
    "list": cmd_list,
    "plot": cmd_plot,
    "reproduce": cmd_reproduce,
    "compare": cmd_compare,
    "features": cmd_features,
    "merge": cmd_merge,
    "prepare": cmd_prepare,
  }[args.command]
  try:
    if args.command not in ("run", "sweep"):
      return command(args)
    with _named(setting_flags()):  # a bad setting, wherever it is found, names its flag
      return command(args)
  except (ValueError, TypeError, MemoryError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except OSError as e:  # a full disk, a read-only or vanished directory: one line naming the path
    where = f" ({e.filename})" if e.filename and str(e.filename) not in str(e) else ""
    print(f"error: {' '.join(str(e).split())}{where}", file=sys.stderr)
    return 1


def entry() -> None:
  """The ``fedjax-dro`` program (and ``python -m fedjax_dro``): :func:`main`, then the exit.

  After an interrupt the process ends at once (``os._exit(130)``, output flushed): tearing the
  interpreter down while the runtime's threads are still running work can crash it (a
  segmentation fault after the line was printed); the operating system frees the devices'
  buffers with the process."""
  code = main(exit_on_interrupt=True)
  if code == 130:
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except (OSError, ValueError):
        pass
    os._exit(130)
  sys.exit(code)


if __name__ == "__main__":
  entry()
