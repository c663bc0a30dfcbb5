"""Fair comparisons of federated strategies: ``fedjax_dro.compare``.

A comparison is controlled when a gap between two rows can only come from the strategies: every
strategy is selected the same way, on the metric the table reports, within each seed and on that
seed's training rows only; every strategy gets the same budget (rounds, uploads or client
gradients, or training to a validation plateau); every failure is treated the same way in every
row; and the table says what each strategy spent. An experiment declares its strategies, its data
(a function of the seed) and its protocol::

    from fedjax_dro import algorithms as A, compare as C, data, models

    entry = data.get_dataset("synthetic-ridge")
    exp = C.Experiment(
      name="ridge",
      data=entry.load,                                  # seed -> FederatedDataset
      model=entry.default_model,
      strategies=[
        C.Strategy("FedAvg", lambda m: A.fedavg(m, local_steps=10, clients_per_round=10),
                   grid={"client_lr": [0.01, 0.03, 0.1]}),
        C.Strategy("FedSGD", lambda m: A.fedsgd(m, clients_per_round=10),
                   grid={"lr": [0.1, 0.3, 1.0]}),
      ],
      protocol=C.Protocol(seeds=(0, 1, 2), metric=C.Metric("r2", "mean"),
                          budget=C.Budget("uploads", match="FedAvg", rounds=50)),
    )
    result = C.compare(exp, out_dir="runs/ridge")      # ridge.json, ridge.md, ridge.png
    print(result.to_markdown())

Per seed ``s``: the data are ``data(s)``; every strategy's grid is scored by K-fold
cross-validation (or a hold-out) over each client's *training* rows, hyper-parameters vmapped in
one program per fold (:func:`fedjax_dro.model_selection.cross_validate`), every geometric axis
widened while the choice sits on its edge, up to ``max_widenings`` values per axis
(:func:`fedjax_dro.model_selection.widen_at_edges`; an axis split across sub-grids is judged on
the union of its values and its edge reported, not widened); the chosen
configuration is trained on all training rows for the rounds the budget gives it
(:func:`budget_rounds`, from the costs the algorithms state: :mod:`fedjax_dro.core.costs`) and
scored on the test rows. The record holds the per-seed rows (choices, scores, rounds, spent
budget, tuning cost, curves), mean +- 2 SE over seeds, paired differences against a reference
strategy (paired t-test p-value and 95% t-interval, win counts with a one-sided sign test,
Holm-adjusted p-values when a table has more than three comparisons), the choices left on grid
edges, and failures.

From the command line: ``fedjax-dro compare CONFIG.toml`` (:mod:`fedjax_dro.compare.config`).
"""

from fedjax_dro.compare.harness import SelectionFailed, compare
from fedjax_dro.compare.protocol import Budget, Experiment, ExtraMetric, Metric, Protocol, Strategy
from fedjax_dro.compare.report import ComparisonResult, comparison_markdown, plot_comparison
from fedjax_dro.compare.stats import paired_difference

__all__ = [
  "Experiment",
  "Strategy",
  "Protocol",
  "Budget",
  "Metric",
  "ExtraMetric",
  "compare",
  "ComparisonResult",
  "SelectionFailed",
  "paired_difference",
  "comparison_markdown",
  "plot_comparison",
]
