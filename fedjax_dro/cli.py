"""The fedjax-dro command line: run, sweep, compare, reproduce, plot, list.

    fedjax-dro run                                   # FedAvg on synthetic-ridge, summary table
    fedjax-dro run --algorithm scaffold --dataset synthetic-classification --rounds 200 \
        --hparam client_lr=0.05 --out runs/scaffold
    fedjax-dro sweep --algorithm fedavg --grid client_lr=0.01,0.03,0.1 --seeds 0,1,2
    fedjax-dro run --algorithm karula --cv-folds 5 --cv-grid t=0.01,0.1,1   # t by 5-fold CV
    fedjax-dro reproduce scaffpd-synthetic --out benchmarks/results/scaffpd_synthetic   # Fig. 2
    fedjax-dro list

Over 600 lines: every command's parser and body is in this one module, which is what a reader
of the command line opens.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import sys
from typing import Dict, List, Optional

from fedjax_dro.records.loggers import log_sweep_to, make_loggers, run_name, tracking_flags

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


def _add_privacy(p: argparse.ArgumentParser) -> None:
  dp = p.add_argument_group(
    "client-level differential privacy (DP-FedAvg: fedjax_dro.private; docs/privacy.md)"
  )
  dp.add_argument(
    "--dp-clip", type=float, default=None, metavar="C", help="L2 clip norm of each update"
  )
  dp.add_argument(
    "--dp-noise", type=float, default=None, metavar="Z", help="noise multiplier (std Z C)"
  )
  dp.add_argument(
    "--dp-delta", type=float, default=None, metavar="D", help="delta of epsilon (default 1e-5)"
  )
  dp.add_argument(
    "--dp-rate",
    type=float,
    default=None,
    metavar="Q",
    help="Poisson participation rate (default: clients-per-round / clients)",
  )
  dp.add_argument(
    "--dp-sampling",
    default=None,
    choices=["poisson", "fixed"],
    help="Poisson participation (default) or a fixed-size sample of --clients-per-round",
  )
  dp.add_argument("--dp-accountant", default=None, choices=["rdp", "pld"], help="default rdp")
  dp.add_argument(
    "--dp-adaptive-quantile",
    type=float,
    default=None,
    metavar="G",
    help="adaptive clipping toward the G quantile of the update norms (Andrew et al.; --dp-clip "
    "is its start)",
  )
  dp.add_argument(
    "--dp-loss-bound",
    type=float,
    default=None,
    metavar="B",
    help="algorithms that report losses (afl, agnostic_fedavg, drfa, scaff_pd; qffl's h_k): "
    "reports clipped to [0, B]",
  )
  dp.add_argument(
    "--dp-loss-noise",
    type=float,
    default=None,
    metavar="ZL",
    help="noise multiplier of the reported losses (std ZL B; default: --dp-noise)",
  )
  dp.add_argument(
    "--dp-cluster-noise",
    type=float,
    default=None,
    metavar="ZC",
    help="ifca: noise std on each cluster's participant count (default: --dp-noise)",
  )


def _dp_requested(args) -> bool:
  names = ("dp_clip", "dp_noise", "dp_delta", "dp_rate", "dp_sampling", "dp_accountant")
  names += ("dp_loss_bound", "dp_loss_noise", "dp_adaptive_quantile", "dp_cluster_noise")
  return any(getattr(args, n, None) is not None for n in names)


def _dp_options(args, options: dict) -> dict:
  """A private run weighs participants uniformly: ``weighting="uniform"`` unless given."""
  if not _dp_requested(args):
    return options
  import inspect

  from fedjax_dro.algorithms import get_algorithm

  accepted = inspect.signature(get_algorithm(args.algorithm).factory).parameters
  if "weighting" in accepted and "weighting" not in options:
    options = {**options, "weighting": "uniform"}
  return options


def _private(args, alg, num_clients: int):
  """``alg`` made private from the ``--dp-*`` flags (unchanged without them)."""
  if not _dp_requested(args):
    return alg
  if args.dp_clip is None:
    raise ValueError("--dp-clip C is needed for a private run (--dp-noise alone clips nothing)")
  from fedjax_dro.privacy.wrapper import private

  sampling = args.dp_sampling or "poisson"
  rate = args.dp_rate
  if sampling == "poisson" and rate is None:
    s = alg.settings.clients_per_round if alg.settings is not None else None
    rate = min(1.0, (s or num_clients) / num_clients)
  kw = dict(sampling=sampling, rate=rate, accountant=args.dp_accountant or "rdp")
  if args.dp_delta is not None:
    kw["delta"] = args.dp_delta
  if args.dp_adaptive_quantile is not None:
    kw["adaptive_quantile"] = args.dp_adaptive_quantile
  if args.dp_loss_bound is not None or args.dp_loss_noise is not None:
    kw.update(loss_bound=args.dp_loss_bound, loss_noise_multiplier=args.dp_loss_noise)
  if args.dp_cluster_noise is not None:
    kw["cluster_count_noise"] = args.dp_cluster_noise
  try:
    return private(alg, args.dp_clip, 0.0 if args.dp_noise is None else args.dp_noise, **kw)
  except ValueError as e:
    flags = {
      "clip_norm": "--dp-clip",
      "noise_multiplier": "--dp-noise",
      "delta": "--dp-delta",
      "rate": "--dp-rate",
      "loss_bound": "--dp-loss-bound",
      "loss_noise_multiplier": "--dp-loss-noise",
      "adaptive_quantile": "--dp-adaptive-quantile",
      "cluster_count_noise": "--dp-cluster-noise",
    }
    msg = str(e)
    for name, flag in flags.items():
      if msg.startswith(name):
        msg = flag + msg[len(name) :]
    raise ValueError(msg) from None


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
    "--clients-per-round", type=int, default=None, help="participants per round (default: all)"
  )
  p.add_argument("--local-steps", type=int, default=None, help="local steps per round")
  p.add_argument(
    "--local-epochs",
    type=int,
    default=None,
    help="passes over each client's data per round, without replacement (instead of --local-steps)",
  )
  p.add_argument(
    "--batch-size", type=int, default=None, help="local minibatch size (default: full batch)"
  )
  p.add_argument(
    "--backend",
    default="auto",
    choices=["auto", "vmap", "map", "chunked"],
    help="execution backend for the participants' local updates",
  )
  p.add_argument(
    "--chunk-size", type=int, default=None, help="clients per chunk for --backend chunked"
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


def _factory_options(args) -> dict:
  opts = {}
  if args.clients_per_round is not None:
    opts["clients_per_round"] = args.clients_per_round
  if args.local_steps is not None:
    opts["local_steps"] = args.local_steps
  if args.local_epochs is not None:
    opts["local_epochs"] = args.local_epochs
  if args.batch_size is not None:
    opts["batch_size"] = args.batch_size
  opts["backend"] = args.backend
  if args.chunk_size is not None:
    opts["chunk_size"] = args.chunk_size
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
  return opts


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


def build(algorithm: str, dataset: str, seed: int, options: dict):
  """(algorithm, dataset) from registry names, with the dataset's default model."""
  from fedjax_dro.algorithms import get_algorithm
  from fedjax_dro.data import get_dataset

  entry = get_algorithm(algorithm)
  ds_entry = get_dataset(dataset)
  ds = ds_entry.load(seed)
  model = ds_entry.default_model(ds)
  import inspect

  accepted = inspect.signature(entry.factory).parameters
  options = {
    k: v for k, v in options.items() if k in accepted or k not in ("backend", "chunk_size")
  }
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

  if getattr(args, "out", None) is not None:
    check_writable_dir(args.out, "--out")
  ckpt = getattr(args, "checkpoint_dir", None)
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
  from fedjax_dro.engine.errors import NonFiniteError
  from fedjax_dro.engine.runner import run
  from fedjax_dro.engine.sharding import is_writer

  _distributed(args)
  _cpu_devices(args)
  _check_paths(args)
  _check_counts(args)
  trackers, log_dir = tracking_flags(args.log_to, args.log_dir, args.out)
  _compile_cache(args)
  options = _dp_options(args, _factory_options(args))
  alg, ds = build(args.algorithm, args.dataset, args.data_seed, options)
  alg = _private(args, alg, ds.num_clients)
  ds, mesh = _scale(args, ds)
  hparams = _parse_kv(args.hparam, "--hparam")
  print(
    f"fedjax-dro run: {alg.name} on {ds.name} ({ds.num_clients} clients), {args.rounds} rounds, "
    f"model {alg.model.name}; devices: {_device_line(mesh, alg)}"
  )
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
  if args.out and _finished_elsewhere(args, alg, ds, hparams, cv=args.cv_folds is not None):
    return 0
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
  with _out_lock(args, is_writer()):
    return _sweep_locked(args)


def _out_lock(args, writer: bool = True):
  """One writer per ``--out`` directory (:class:`~fedjax_dro.records.files.DirectoryLock`):
  a second command writing there is refused with one line naming the holder."""
  from contextlib import nullcontext

  from fedjax_dro.records.files import DirectoryLock

  out = getattr(args, "out", None)
  return DirectoryLock(out, "--out") if out is not None and writer else nullcontext()


def _sweep_locked(args) -> int:
  from fedjax_dro.engine.sharding import is_writer
  from fedjax_dro.engine.sweeps import sweep

  _check_counts(args)
  trackers, log_dir = tracking_flags(args.log_to, args.log_dir, args.out)
  _compile_cache(args)
  seeds = _parse_seeds(args.seeds)
  options = _dp_options(args, _factory_options(args))
  alg, ds = build(args.algorithm, args.dataset, args.data_seed, options)
  alg = _private(args, alg, ds.num_clients)
  grid = _parse_kv(args.grid, "--grid", multi=True)
  ds, mesh = _scale(args, ds, num_configs=math.prod(len(v) for v in grid.values()) * len(seeds))
  print(f"fedjax-dro sweep: {alg.name} on {ds.name}; devices: {_device_line(mesh, alg)}")
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
    print(f"wrote sweep.json and sweep.csv in {args.out}")
  if trackers and is_writer():  # one tracked run per row, under one sweep name
    base = run_name(alg.name, ds.name, f"d{args.data_seed}", "sweep")
    params = tracking_params(alg, ds, args, _parse_kv(args.hparam, "--hparam"), seed=seeds[0])
    log_sweep_to(res, trackers, log_dir, base, params)
    print(f"logged {len(res.configs)} rows to {', '.join(trackers)} in {log_dir} as {base}/")
  return 0


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
  with _out_lock(args):
    return _reproduce_locked(args)


def _reproduce_locked(args) -> int:
  from fedjax_dro.reproduce import EXPERIMENTS, reproduce

  _check_counts(args)
  _compile_cache(args)
  inputs = {}  # the user's data files, passed only to the experiments that read them
  for option, name in (
    ("--data-dir", "data_dir"),
    ("--features", "features"),
    ("--leaf-dir", "leaf_dir"),
  ):
    value = getattr(args, name)
    if value is None:
      continue
    if name not in inspect.signature(EXPERIMENTS[args.experiment]).parameters:
      raise ValueError(f"{option}: reproduce {args.experiment} reads no such input")
    inputs[name] = value
  reproduce(
    args.experiment,
    out_dir=args.out,
    rounds=args.rounds,
    quick=args.quick,
    seed=args.seed,
    **inputs,
  )
  return 0


def cmd_compare(args) -> int:
  """``fedjax-dro compare CONFIG``: the comparison a TOML file declares
  (:mod:`fedjax_dro.compare.config`), written to ``--out`` (default: ``compare-NAME``)."""
  from fedjax_dro.compare import compare
  from fedjax_dro.compare.config import experiment_from_config, load_config

  experiment = experiment_from_config(load_config(args.config))
  if args.out is None:
    args.out = f"compare-{experiment.name}"
  _check_paths(args)
  _compile_cache(args)
  with _out_lock(args):
    compare(experiment, out_dir=args.out)
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
  kept = f"; the files already finished in {out} are kept" if out else ""
  return f"interrupted: {args.command} stopped{kept}"


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
  """Every flag's default in its help (where it has one: not None, off or empty); descriptions
  and epilogs kept as written."""

  def _get_help_string(self, action):
    if action.default in (None, False, [], argparse.SUPPRESS) or "%(default)" in (
      action.help or ""
    ):
      return action.help
    return super()._get_help_string(action)


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
    "personalized algorithms) in JAX. Commands: run, sweep, compare, reproduce, plot, list; "
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
  p_run.add_argument("--out", default=None, help="directory for metrics.jsonl and summary.json")
  p_run.add_argument(
    "--overwrite",
    action="store_true",
    help="replace a finished run of another configuration in --out (refused without it)",
  )
  p_run.add_argument(
    "--no-progress",
    action="store_true",
    help="no progress bar (there is none when stderr is not a terminal)",
  )
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
  p_sweep.add_argument("--out", default=None, help="directory for sweep.json and sweep.csv")
  p_rep = add_parser("reproduce", help="reproduce a paper figure (JSON + PNG)")
  from fedjax_dro.reproduce import EXPERIMENTS

  p_rep.epilog = _reproduce_epilog()
  p_rep.add_argument("experiment", choices=sorted(EXPERIMENTS), help="the experiment (below)")
  p_rep.add_argument("--out", default=None, help="output directory (JSON, markdown, PNG)")
  p_rep.add_argument(
    "--rounds", type=int, default=None, help="communication rounds (default: the experiment's)"
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
  _add_compile_cache(p_rep)
  p_cmp = add_parser(
    "compare", help="a fair comparison of strategies declared in a TOML file (JSON + MD + PNG)"
  )
  p_cmp.add_argument("config", help="the TOML file (see fedjax_dro.compare.config)")
  p_cmp.add_argument("--out", default=None, help="output directory (default: compare-NAME)")
  _add_compile_cache(p_cmp)
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


def main(argv: Optional[List[str]] = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.command is None:
    parser.print_help()
    return 2
  try:
    return {
      "run": cmd_run,
      "sweep": cmd_sweep,
      "list": cmd_list,
      "plot": cmd_plot,
      "reproduce": cmd_reproduce,
      "compare": cmd_compare,
    }[args.command](args)
  except (ValueError, TypeError, MemoryError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:  # Ctrl-C: one line saying where the run stopped, exit code 130
    print(interrupted_message(args), file=sys.stderr)
    return 130
  except OSError as e:  # a full disk, a read-only or vanished directory: one line naming the path
    where = f" ({e.filename})" if e.filename and str(e.filename) not in str(e) else ""
    print(f"error: {' '.join(str(e).split())}{where}", file=sys.stderr)
    return 1


if __name__ == "__main__":
  sys.exit(main())
