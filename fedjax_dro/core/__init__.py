"""Round mechanics every algorithm shares: client sampling (``sampling``), local training and
the execution backends (``local``, ``clients``), aggregation (``aggregation``), metrics
(``metrics``), the validated round settings (``settings``), the argument validators
(``checks``) and linear models' smoothness, the unit of their step sizes (``smoothness``).

Numerical solvers (projections, prox steps, the saddle-point solver) live in
:mod:`fedjax_dro.solvers`.
"""
