"""FGDRO Table 7's data steps, held-out metrics and CIFAR-10 timing protocol.

Guo and Yang, "Communication-Efficient Federated Group Distributionally Robust Optimization",
NeurIPS 2024, arXiv:2410.06369, Appendix G, Table 7 (``fedjax-dro reproduce fgdro-table7``,
:mod:`fedjax_dro.reproduce.fgdro`, on the comparison harness). Here:

* the data step of the code the paper cites (:func:`image_partition`: "reducing the data of 5
  classes by 80%" and the Dirichlet(0.3) and Dirichlet(10) splits over 100 clients as the
  released code makes them) and the held-out set's stratified halves (:func:`split_holdout`);
* :class:`ClassHeldOut`, the balanced held-out set that scores the table's accuracies (worst
  class, worst client under each client's label mix, the clients' average);
* :func:`protocol`, the CIFAR-10 settings per row (a two-layer CNN, ``I = 32`` local steps of
  batch 32, 625 rounds, a grid per row) with which :func:`cifar_round_time` and
  ``benchmarks/fgdro_cifar_rounds.py`` time rounds of the real size on generated data; the
  table's own grids are :func:`fedjax_dro.reproduce.fgdro.table7_strategies`'.

:func:`~fedjax_dro.algorithms.wrappers.with_class_weighted_accuracy` adds the same accuracies to
every round of a run (the timings include them).
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Dict, List, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.algorithms.wrappers import per_class_accuracy, with_class_weighted_accuracy

# The paper's Table 7 (imbalanced CIFAR-10): (worst, worst std, average, average std) per
# Dirichlet alpha. Printed in their own table, never beside the digits stand-in's numbers.
PAPER_TABLE7 = {
  "FedAvg": {0.3: (0.3140, 0.0027, 0.6236, 0.0019), 10: (0.3620, 0.0032, 0.6742, 0.0020)},
  "SCAFFOLD": {0.3: (0.3245, 0.0032, 0.6337, 0.0038), 10: (0.3821, 0.0022, 0.6816, 0.0025)},
  "FedProx": {0.3: (0.3102, 0.0027, 0.6189, 0.0036), 10: (0.3757, 0.0041, 0.6925, 0.0053)},
  "FedAdam": {0.3: (0.4860, 0.0047, 0.7147, 0.0058), 10: (0.4460, 0.0039, 0.7042, 0.0043)},
  "DRFA": {0.3: (0.3215, 0.0129, 0.6381, 0.0131), 10: (0.3752, 0.0053, 0.6739, 0.0048)},
  "DR-DSGD": {0.3: (0.3277, 0.0074, 0.6403, 0.0058), 10: (0.3700, 0.0063, 0.6792, 0.0088)},
  "FGDRO-CVaR": {0.3: (0.4100, 0.0032, 0.6606, 0.0039), 10: (0.4010, 0.0022, 0.6882, 0.0027)},
  "FGDRO-KL": {0.3: (0.3560, 0.0018, 0.6369, 0.0029), 10: (0.4110, 0.0035, 0.6951, 0.0042)},
  "FGDRO-KL-Adam": {0.3: (0.5280, 0.0101, 0.7057, 0.0133), 10: (0.5110, 0.0072, 0.7286, 0.0063)},
}

ALPHAS = (0.3, 10.0)
NUM_CLIENTS = 100
REDUCED_CLASSES = (0, 2, 4, 6, 8)  # the released code's --n_minority 5
KEPT_FRACTION = 0.2
# The FedAdam row: the paper's server update (Reddi et al., "Adaptive Federated Optimization",
# arXiv:2003.00295, Algorithm 2), not Adam's bias-corrected one.
FEDADAM_OPTIONS = {"bias_correction": False}
PAPER_LRS = (1e-4, 1e-3, 1e-2, 1e-1)
PAPER_BETAS = (0.01, 0.1, 0.2, 0.5)
KL_BETAS = ("beta1", "beta2", "beta3")  # tied: the paper tunes "the beta parameters" as one


def _rows(grids: Dict[str, tuple], betas: Optional[tuple], quick: bool) -> List[Dict[str, Any]]:
  """The eleven rows: label, registry name, options, product ``grid``, ``tied`` and ``fixed``.

  ``betas``: the grid of the moving-average weights of FGDRO-KL, FGDRO-KL-Adam and FedAvg-M, one
  value for all of a row's weights (``None``: fixed at 0.1). ``quick``: the middle value of every
  grid and no tied grid.
  """

  def g(key):
    values = tuple(grids[key])
    return values[len(values) // 2 : len(values) // 2 + 1] if quick else values

  def averaged(label, name, grid, names, **extra):
    """A row whose moving-average weights ``names`` are tuned as one on ``betas`` (fixed at 0.1
    without), with ``extra`` fixed."""
    if betas is None or quick:
      tied, fixed = {}, {**{k: 0.1 for k in names}, **extra}
    else:
      tied, fixed = {names: tuple(betas)}, dict(extra)
    return dict(label=label, name=name, grid=grid, tied=tied, fixed=fixed)

  def kl_grid(lr):  # FGDRO-KL and FGDRO-KL-Adam: a step grid and the KL lambda's
    return {"client_lr": g(lr), "lam": g("kl_lam")}

  return [
    dict(label="FedAvg", name="fedavg", grid={"client_lr": g("lr")}),
    dict(label="SCAFFOLD", name="scaffold", grid={"client_lr": g("scaffold_lr")}),
    dict(label="FedProx", name="fedprox", grid={"client_lr": g("lr")}, fixed={"mu": 0.01}),
    dict(
      label="FedAdam",
      name="fedadam",
      options=FEDADAM_OPTIONS,
      grid={"server_lr": g("server_lr")},
      fixed={"client_lr": 0.1, "tau": 1e-3},
    ),
    averaged("FedAvg-M", "fedavg_momentum", {"client_lr": g("momentum_lr")}, ("beta3",)),
    dict(label="DRFA", name="drfa", grid={"client_lr": g("drfa_lr"), "gamma": g("drfa_gamma")}),
    dict(
      label="DR-DSGD", name="dr_dsgd", grid={"client_lr": g("drdsgd_lr"), "lam": g("drdsgd_lam")}
    ),
    dict(
      label="FGDRO-CVaR",
      name="fgdro_cvar",
      grid={
        "client_lr": g("cvar_lr"),
        "alpha": g("cvar_alpha"),
        "threshold_lr": g("threshold_lr"),
      },
      fixed={"beta1": 0.1},
    ),
    averaged("FGDRO-KL", "fgdro_kl", kl_grid("kl_lr"), KL_BETAS),
    averaged("FGDRO-KL-Adam", "fgdro_kl_adam", kl_grid("adam_lr"), KL_BETAS, beta4=0.001, tau=1e-8),
    dict(label="LocalAdam", name="local_adam", grid={"client_lr": g("adam_lr")}),
  ]


def protocol(kind: str, quick: bool = False) -> Dict[str, Any]:
  """Settings and rows of the ``"cifar10"`` timing protocol (the paper's sizes).

  Args:
    kind: ``"cifar10"``.
    quick: the middle value of every grid, no tied grid, 2 rounds of 2 local steps of batch 4
      (a smoke run of the same code path).

  Returns:
    A dict with ``rounds``, ``local_steps``, ``batch_size``, ``features`` (the CNN's two conv
    widths), ``backend`` and ``rows`` (per row ``label``, ``name``, ``grid`` (tuned as a
    product), ``tied`` (``{names: values}``: one value for all ``names``), ``fixed``,
    ``options``).
  """
  if kind == "cifar10":
    grids = {k: PAPER_LRS for k in ("lr", "scaffold_lr", "server_lr", "momentum_lr", "drfa_lr")}
    grids["drdsgd_lr"] = PAPER_LRS
    grids.update({k: PAPER_LRS for k in ("cvar_lr", "kl_lr", "adam_lr")})
    grids.update(
      drfa_gamma=(1e-4, 1e-3, 1e-2, 1e-1),
      drdsgd_lam=(1.0, 3.0, 10.0, 30.0, 100.0),
      cvar_alpha=(0.05, 0.1, 0.2, 0.5, 0.8),
      threshold_lr=(1e-3, 1e-2, 1e-1),
      kl_lam=(0.1, 0.3, 1.0, 3.0, 10.0, 30.0),
    )
    rows = _rows(grids, PAPER_BETAS, quick)
    out = dict(rounds=625, local_steps=32, batch_size=32, features=(32, 64), backend="auto")
  else:
    raise ValueError(f"kind must be 'cifar10', got {kind!r}")
  if quick:
    out.update(rounds=2, local_steps=2, batch_size=4)
  for row in rows:
    row.setdefault("tied", {})
    row.setdefault("fixed", {})
    row.setdefault("options", {})
  out["rows"] = rows
  return out


def split_holdout(x, y, seed: int):
  """Stratified halves ``((x_val, y_val), (x_test, y_test))`` of a held-out set."""
  rng = np.random.default_rng(seed + 7919)
  val, test = [], []
  for c in np.unique(y):
    rows = rng.permutation(np.flatnonzero(y == c))
    val.extend(rows[: rows.size // 2].tolist())
    test.extend(rows[rows.size // 2 :].tolist())
  val, test = np.sort(val), np.sort(test)
  return (x[val], y[val]), (x[test], y[test])


@functools.partial(jax.jit, static_argnums=(0,))
def _class_accuracies(model, params, x, y, proportions):
  acc, present = per_class_accuracy(model, params, x, y, proportions.shape[1], proportions.dtype)
  client = proportions @ acc
  return {
    "worst_class_accuracy": jnp.min(jnp.where(present, acc, jnp.inf)),
    "worst_client_accuracy": jnp.min(client),
    "mean_client_accuracy": jnp.mean(client),
    "class_average_accuracy": jnp.sum(jnp.where(present, acc, 0.0)) / jnp.sum(present),
  }


class ClassHeldOut(NamedTuple):
  """A balanced held-out set ``(x, y)`` and the training clients' label mixes ``proportions``
  ``[clients, classes]``, scored by the global model's accuracy on each class ``acc_c``:

  * ``worst_class_accuracy``: ``min_c acc_c`` (over the classes present);
  * ``worst_client_accuracy``: ``min_i sum_c p_ic acc_c``, client ``i``'s expected accuracy under
    its own label mix;
  * ``mean_client_accuracy``: ``mean_i sum_c p_ic acc_c``;
  * ``class_average_accuracy``: ``mean_c acc_c``.

  The held-out split of ``Protocol(selection="domains")`` (:mod:`fedjax_dro.compare.domains`:
  a split that scores itself), and the same numbers as
  :func:`~fedjax_dro.algorithms.wrappers.with_class_weighted_accuracy`'s round metrics.
  """

  x: Any
  y: Any
  proportions: Any

  def split_metrics(self, model, params) -> Dict[str, float]:
    """The four accuracies above of ``model`` at ``params``."""
    out = _class_accuracies(
      model, params, jnp.asarray(self.x), jnp.asarray(self.y), jnp.asarray(self.proportions)
    )
    return {k: float(v) for k, v in out.items()}


def image_partition(x_train, y_train, num_classes: int, alpha: float, seed: int):
  """The paper's data step on an image training set, as the code it cites (Shen et al., ICLR
  2021) makes it: :func:`~fedjax_dro.data.partition.climb_imbalance` (the first 20% of classes
  0, 2, 4, 6, 8's pooled rows kept), then
  :func:`~fedjax_dro.data.partition.climb_dirichlet_partition` over 100 clients (per-client
  Dirichlet(``alpha``) class proportions, every client ``N // 100`` rows). Returns
  ``(train FederatedData, proportions [100, num_classes])``."""
  from fedjax_dro.data import from_client_arrays
  from fedjax_dro.data.digits import label_proportions
  from fedjax_dro.data.partition import climb_dirichlet_partition, climb_imbalance

  reduce_seed, partition_seed = (int(s) for s in np.random.SeedSequence(seed).generate_state(2))
  keep = climb_imbalance(y_train, REDUCED_CLASSES, KEPT_FRACTION, seed=reduce_seed)
  x, y = x_train[keep], y_train[keep]
  parts = climb_dirichlet_partition(
    y, NUM_CLIENTS, float(alpha), num_classes=num_classes, seed=partition_seed
  )
  ys = [y[p] for p in parts]
  train = from_client_arrays([x[p] for p in parts], ys, dtype=np.float32)
  return train, label_proportions(ys, num_classes)


def build_row_algorithm(row, model, settings, holdouts, proportions, num_classes):
  """The registered algorithm of ``row`` with the protocol's settings and the metrics above."""
  from fedjax_dro.algorithms import get_algorithm

  alg = get_algorithm(row["name"]).factory(
    model,
    local_steps=settings["local_steps"],
    batch_size=settings["batch_size"],
    backend=settings["backend"],
    **row["options"],
  )
  return with_class_weighted_accuracy(alg, holdouts, proportions, num_classes)


def generated_cifar(alpha: float = 0.3, seed: int = 0):
  """CIFAR-10-shaped uniform-noise images through the protocol's data step: 50000 training and
  10000 test images, 32x32x3, 5000 and 1000 per class, then :func:`image_partition` and
  :func:`split_holdout`. Returns ``(train, proportions, holdouts)``, the inputs that
  :func:`cifar_round_time` times (generate once, time several rows)."""
  rng = np.random.default_rng(seed)
  x_train = rng.random((50000, 32, 32, 3), dtype=np.float32)
  y_train = np.repeat(np.arange(10, dtype=np.int32), 5000)
  x_test = rng.random((10000, 32, 32, 3), dtype=np.float32)
  y_test = np.repeat(np.arange(10, dtype=np.int32), 1000)
  train, proportions = image_partition(x_train, y_train, 10, alpha, seed)
  holdouts = dict(zip(("val", "test"), split_holdout(x_test, y_test, seed)))
  return train, proportions, holdouts


def cifar_round_time(
  label: str = "FGDRO-KL",
  *,
  rounds: int = 2,
  alpha: float = 0.3,
  seed: int = 0,
  out_dir: Optional[str] = None,
  data=None,
) -> Dict[str, Any]:
  """Seconds per round of the full CIFAR-10 protocol for one configuration of ``label``.

  Generates uniform-noise images of the real size in memory (50000 training and 10000 test
  images, 32x32x3, 5000 and 1000 per class), runs the protocol's data step, model, ``I = 32``,
  batch 32 and 100 clients, compiles, then times ``rounds`` rounds (the held-out metrics
  included). Nothing is written.

  Args:
    label: the Table 7 row to time.
    rounds: rounds timed after compilation.
    alpha: the Dirichlet concentration of the partition.
    seed: seed of the generated images and the partition.
    out_dir: where to write ``cifar_round_time.{json,md}`` (``None``: nothing is written).
    data: ``generated_cifar(alpha, seed)`` made once for several rows (``None``: made here).

  Returns:
    ``{"seconds_per_round", "compile_s", "rounds_timed", "full_run_s_per_config",
    "full_protocol_s", "device", ...}``: ``full_run_s_per_config`` is ``seconds_per_round * 625``,
    ``full_protocol_s`` that times every tuning and reporting run of both partitions.
  """
  from fedjax_dro import models
  from fedjax_dro.engine.sweeps import sweep

  if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
    raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
  settings = protocol("cifar10")
  rows = {row["label"]: row for row in settings["rows"]}
  if label not in rows:
    raise ValueError(f"label must be one of {sorted(rows)}, got {label!r}")
  train, proportions, holdouts = generated_cifar(alpha, seed) if data is None else data
  model = models.cnn((32, 32, 3), 10, features=settings["features"], dense=None, conv="patches")
  alg = build_row_algorithm(rows[label], model, settings, holdouts, proportions, 10)
  hparams = {k: v[len(v) // 2] for k, v in rows[label]["grid"].items()}
  hparams.update(rows[label]["fixed"])
  for names, values in rows[label]["tied"].items():
    hparams.update({k: values[1] for k in names})
  t0 = time.perf_counter()
  res = sweep(alg, train, rounds=rounds, hparams=hparams, seeds=[0], eval_every=1)
  runs = len(ALPHAS) * sum(len(configurations(row)) + 3 for row in settings["rows"])
  out = {
    "label": label,
    "hparams": hparams,
    "alpha": alpha,
    "train_rows": int(np.asarray(train.num_examples).sum()),
    "max_rows_per_client": int(np.asarray(train.num_examples).max()),
    "rounds_timed": rounds,
    "seconds_per_round": res.wall_time / rounds,
    "compile_s": res.compile_time,
    "total_s": time.perf_counter() - t0,
    "full_run_s_per_config": res.wall_time / rounds * settings["rounds"],
    "runs": runs,
    "full_protocol_s": res.wall_time / rounds * settings["rounds"] * runs,
    "device": str(jax.devices()[0].device_kind),
    "platform": str(jax.devices()[0].platform),
    "cpu_count": os.cpu_count(),
    "load_average": list(os.getloadavg()),
  }
  if out_dir is not None:
    from fedjax_dro.records.files import atomic_write
    from fedjax_dro.records.history import json_text

    os.makedirs(out_dir, exist_ok=True)
    atomic_write(os.path.join(out_dir, "cifar_round_time.json"), json_text(out, indent=1))
    atomic_write(os.path.join(out_dir, "cifar_round_time.md"), round_time_markdown(out))
  return out


def round_time_markdown(m: Dict[str, Any]) -> str:
  """The measurement of :func:`cifar_round_time` as a markdown table."""
  rows = [
    ("row timed", f"{m['label']} {m['hparams']}, Dirichlet({m['alpha']:g})"),
    ("device", f"{m['platform']} ({m['device']}), {m['cpu_count']} cores"),
    ("load average during the run", " / ".join(f"{v:.1f}" for v in m["load_average"])),
    ("training rows / largest client", f"{m['train_rows']} / {m['max_rows_per_client']}"),
    ("compile", f"{m['compile_s']:.0f} s"),
    ("one round (100 clients x 32 steps x 32 images)", f"{m['seconds_per_round']:.1f} s"),
    ("one run of 625 rounds", f"{m['full_run_s_per_config'] / 3600:.1f} h"),
    (f"the full protocol ({m['runs']} runs)", f"{m['full_protocol_s'] / 86400:.0f} days"),
  ]
  lines = ["| measured | |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
  return "\n".join(lines) + "\n"


def edges(grid: Dict[str, Any], chosen: Dict[str, float]) -> List[str]:
  """The tuned parameters whose chosen value is the smallest or largest of a grid of >= 2."""
  out = []
  for name, values in grid.items():
    values = sorted(float(v) for v in values)
    if len(values) > 1 and float(chosen[name]) in (values[0], values[-1]):
      out.append(f"{name}={chosen[name]:g} ({'low' if chosen[name] == values[0] else 'high'} edge)")
  return out


def tuned_grid(row) -> Dict[str, Any]:
  """The tuned values of ``row`` by hyper-parameter (a tied set under its first name)."""
  grid = {k: tuple(v) for k, v in row["grid"].items()}
  for names, values in row["tied"].items():
    grid["=".join(names)] = tuple(values)
  return grid


def configurations(row) -> List[Dict[str, float]]:
  """Every tuned configuration of ``row`` (product grid times tied values), as hparams."""
  import itertools

  names = sorted(row["grid"])
  product = [
    dict(zip(names, combo)) for combo in itertools.product(*[row["grid"][k] for k in names])
  ]
  tied: List[Dict[str, float]] = [{}]
  for group, values in row["tied"].items():
    tied = [
      {**t, **{k: v for k, v in zip(group, [value] * len(group))}} for t in tied for value in values
    ]
  return [{**p, **t} for t in tied for p in product]
