"""Round mechanics every algorithm shares, and the building blocks of an algorithm of your own.

The public face is what an algorithm's round function calls: :func:`local_round` (participants
drawn, local SGD, their updates aggregated through the round's release mechanism),
:func:`stateful_local_round` (local steps that carry estimators beside the model),
:func:`round_metrics` / :func:`stateful_round_metrics` (the round's training metrics with its
privacy metrics), :func:`state_init` (an ``init`` without randomness), :data:`PLAIN` (the
identity release, the default of every round's ``release``) and :func:`reddi_optimizer` (the
adaptive server optimizers of Reddi et al. for the FedAvg family's ``server_optimizer``).

The modules inside are internal (tests and benchmarks import them; their names may change):
client sampling (``sampling``), a round's client plan (``participants``), local training and
its schedule (``local``, ``schedule``, ``ragged``), the execution backends (``clients``),
aggregation (``aggregation``), the release mechanisms (``release``, ``privacy``), metrics
(``metrics``), the validated round settings (``settings``), the hyper-parameter spec
(``hparams``), linear models' smoothness (``smoothness``), and what several algorithms share so
that no algorithm imports another: the server steps and the FedAvg-type state (``server``), the
adaptive FedOpt round (``fedopt``) and the FGDRO paper's local rounds (``fgdro``). Numerical
solvers (projections, prox steps, the DRO problems, the saddle-point solver) live in
:mod:`fedjax_dro.solvers`.
"""

from fedjax_dro.core.local import (
  local_round,
  round_metrics,
  stateful_local_round,
  stateful_round_metrics,
)
from fedjax_dro.core.release import PLAIN
from fedjax_dro.core.server import reddi_optimizer
from fedjax_dro.core.settings import state_init

__all__ = [
  "local_round",
  "stateful_local_round",
  "round_metrics",
  "stateful_round_metrics",
  "state_init",
  "PLAIN",
  "reddi_optimizer",
]
