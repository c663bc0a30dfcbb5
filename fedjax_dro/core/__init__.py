"""Round mechanics every algorithm shares: client sampling (``sampling``), local training and
the execution backends (``local``, ``clients``), aggregation (``aggregation``), metrics
(``metrics``) and the validated round settings (``settings``).

Numerical solvers (projections, prox steps, the saddle-point solver) live in
:mod:`fedjax_dro.solvers`.
"""
