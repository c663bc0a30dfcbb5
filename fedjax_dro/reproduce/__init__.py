"""Reproductions of the papers' headline figures and tables: ``fedjax-dro reproduce NAME``.

Each experiment is a function ``(out_dir=None, *, rounds=None, quick=False, seed=0, ...) ->
dict`` registered in :data:`EXPERIMENTS` under its CLI name; it writes JSON (and a PNG / markdown
table) to ``out_dir``. One module per paper:

* ``scaffpd-synthetic`` (:mod:`fedjax_dro.reproduce.scaffpd`): SCAFF-PD, Fig. 2.
* ``scaffpd-table1`` (:mod:`fedjax_dro.reproduce.scaffpd_table1`): SCAFF-PD, Table 1 and Fig. 3.
* ``karula-synthetic``, ``karula-heart`` (:mod:`fedjax_dro.reproduce.karula`): Karula, Table 1
  (``karula-synthetic-gradients``: Table 1a at equal client gradients, beside the equal-rounds
  table of ``karula-synthetic``).
* ``karula-femnist`` (:mod:`fedjax_dro.reproduce.karula_femnist`): Karula, Sec. 5.3 and
  Figure 1 (``--leaf-dir``: LEAF FEMNIST digits; without it, the by-writer digits stand-in).
* ``fgdro-table7`` (:mod:`fedjax_dro.reproduce.fgdro`, data steps and held-out metrics in
  :mod:`fedjax_dro.reproduce.fgdro_protocol`): FGDRO, Appendix G, Table 7 on the harness
  (``--data-dir``: the paper's CIFAR-10 protocol; without it, the digits stand-in).
* ``fgdro-table2`` (:mod:`fedjax_dro.reproduce.fgdro_language`): FGDRO, Table 2, the Pile (GPT-2)
  and CivilComments (DistilBERT) on the harness, the Pile's FGDRO rows with the paper's
  domain-weight phase (``--data-dir``: the prepared directories; ``--weights-dir``:
  distilbert-base-uncased; without them, the readers' stand-ins).
* ``fgdro-table3`` (:mod:`fedjax_dro.reproduce.fgdro_wilds`): FGDRO, Table 3, WILDS images on
  the harness with held-out-domain selection (``--data-dir``: the prepared WILDS directories;
  without it, the readers' stand-ins).
* ``fgdro-figure1`` (:mod:`fedjax_dro.reproduce.fgdro_figure1`): FGDRO, Figure 1, the
  communication interval and local Adam steps on Camelyon17, on the same protocol.

* ``privacy-fairness`` (:mod:`fedjax_dro.reproduce.privacy_fairness`): FedAvg, AFL, DR-DSGD and
  AgnosticFedAvg under client-level DP at matched epsilon (this package's own experiment).

To add one, write ``fedjax_dro/reproduce/<paper>.py`` and add its entry below.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict

from fedjax_dro.reproduce.fgdro import fgdro_table7
from fedjax_dro.reproduce.fgdro_figure1 import fgdro_figure1
from fedjax_dro.reproduce.fgdro_language import fgdro_table2
from fedjax_dro.reproduce.fgdro_wilds import fgdro_table3
from fedjax_dro.reproduce.karula import karula_heart, karula_synthetic
from fedjax_dro.reproduce.karula_femnist import karula_femnist
from fedjax_dro.reproduce.privacy_fairness import privacy_fairness
from fedjax_dro.reproduce.scaffpd import scaffpd_synthetic
from fedjax_dro.reproduce.scaffpd_table1 import scaffpd_table1

EXPERIMENTS: Dict[str, Callable[..., Dict[str, Any]]] = {
  "scaffpd-synthetic": scaffpd_synthetic,
  "scaffpd-table1": scaffpd_table1,
  "fgdro-table7": fgdro_table7,
  "fgdro-table2": fgdro_table2,
  "fgdro-table3": fgdro_table3,
  "fgdro-figure1": fgdro_figure1,
  "karula-synthetic": karula_synthetic,
  "karula-synthetic-gradients": functools.partial(karula_synthetic, budgets=("gradients",)),
  "karula-heart": karula_heart,
  "karula-femnist": karula_femnist,
  "privacy-fairness": privacy_fairness,
}


# What each experiment is and how long its full run takes on a shared 2-core CPU (the recorded
# runs' wall times; --quick runs take about a minute each).
RUN_TIMES: Dict[str, str] = {
  "scaffpd-synthetic": "SCAFF-PD Fig. 2 (synthetic shift) on the harness, 10 seeds x 3 rhos, 50 "
  "rounds: about 10 minutes",
  "scaffpd-table1": "SCAFF-PD Table 1 (plateau and equal uploads) and Fig. 3 (features file or "
  "stand-in): about 130 minutes of runs, 66 in two parts side by side (--part)",
  "fgdro-table7": "FGDRO Table 7 on the harness (CIFAR-10 files or digits stand-in): the stand-in "
  "about 37 minutes",
  "fgdro-table2": "FGDRO Table 2 (prepared Pile and CivilComments, or their stand-ins): the "
  "stand-in about 7 minutes (--quick); the real table's runs are GPU jobs, not yet timed",
  "fgdro-table3": "FGDRO Table 3 (prepared WILDS Camelyon17, iWildCam, PovertyMap, or their "
  "stand-ins): the stand-in about 10 minutes (--quick); the real table's runs are GPU jobs, "
  "not yet timed",
  "fgdro-figure1": "FGDRO Figure 1 ablations on Camelyon17 (prepared directory or stand-in): the "
  "stand-in a few minutes (--quick); the real runs are GPU jobs, not yet timed",
  "karula-synthetic": "Karula Table 1a (synthetic ridge, both readings): about 76 minutes",
  "karula-synthetic-gradients": "Karula Table 1a at equal client gradients (FedAvg's at 600 "
  "rounds), both readings: about 90 minutes (the feature-means reading took 44)",
  "karula-heart": "Karula Table 1b (UCI heart disease, shipped): about 8 minutes",
  "karula-femnist": "Karula by-writer digits / LEAF FEMNIST, three budgets: about 55 minutes",
  "privacy-fairness": "FedAvg and eight DRO algorithms under DP, four levels: about 17 minutes",
}


def reproduce(name: str, **kwargs) -> Dict[str, Any]:
  """Runs the experiment registered as ``name`` with ``kwargs`` (see :data:`EXPERIMENTS`)."""
  if name not in EXPERIMENTS:
    raise ValueError(f"unknown experiment {name!r}; available: {sorted(EXPERIMENTS)}")
  return EXPERIMENTS[name](**kwargs)


__all__ = [
  "reproduce",
  "EXPERIMENTS",
]
