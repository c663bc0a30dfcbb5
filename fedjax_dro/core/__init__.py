"""Round mechanics every algorithm shares: client sampling (``sampling``), local training and
the execution backends (``local``, ``clients``), aggregation (``aggregation``), metrics
(``metrics``), the validated round settings (``settings``), the argument validators
(``checks``), the hyper-parameter spec (``hparams``) and linear models' smoothness, the unit of
their step sizes (``smoothness``); and the pieces several algorithms share, so that no algorithm
imports another: the server steps and the FedAvg-type state (``server``), the adaptive FedOpt
round (``fedopt``) and the local rounds and steps of the FGDRO paper's algorithms (``fgdro``).

Numerical solvers (projections, prox steps, the DRO problems, the saddle-point solver) live in
:mod:`fedjax_dro.solvers`.
"""
