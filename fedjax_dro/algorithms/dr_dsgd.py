"""DR-DSGD in its federated (server) form: local SGD on exp(l / lambda), then averaging.

Ben Issaid, Elgabli and Bennis, "DR-DSGD: A Distributionally Robust Decentralized Learning
Algorithm over Graphs", TMLR 2022, arXiv:2208.13810; the KL-regularised baseline of the FGDRO paper
(Guo and Yang, NeurIPS 2024, Table 7). The KL-regularised robust problem
``min_w lambda log((1/N) sum_i exp(l_i(w) / lambda))`` has the same minimisers as
``min_w (1/N) sum_i exp(l_i(w) / lambda)`` (log is increasing), and DR-DSGD runs SGD on the latter
with the stochastic gradient ``(1/lambda) exp(l(w; z) / lambda) grad l(w; z)``.

Federated form (ours; the original mixes with graph neighbours through a doubly stochastic
matrix ``W`` after every step): the server plays the complete graph, ``W = 11^T / N``, applied
every ``I = local_steps`` steps. Each participant runs, from ``w_{i,0} = w_bar``,

    w_{i,t} = w_{i,t-1} - eta (1 / lambda) exp(l(w_{i,t-1}; z_{i,t}) / lambda) grad l(w_{i,t-1}; z_{i,t})

and ``w_bar`` becomes the unweighted average of the ``w_{i,I}`` (with ``I = 1`` and all clients,
exactly DR-DSGD on the complete graph). The exponential weight is of the minibatch loss, as in
the original; the convergence theory asks for ``lambda > 1``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.core.costs import local_training_costs
from fedjax_dro.core.local import stateful_local_round, stateful_round_metrics
from fedjax_dro.core.model_state import AVERAGED
from fedjax_dro.core.release import PLAIN, Releases
from fedjax_dro.core.settings import CommonSettings, round_zero, state_init
from fedjax_dro.solvers.dro import kl


class DrDsgdState(NamedTuple):
  params: Any  # w_bar, the global model
  round: jnp.ndarray  # [] int32


RELEASES = Releases(
  "each participant's model delta (its local steps weight each gradient by exp(loss / "
  "lambda) on the client); the server reads the noised sum of the clipped updates over the expected participants"
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""

HPARAMS = {
  "client_lr": HParam(0.01, "local step size eta"),
  # lam, the parameter of the KL problem (solvers.dro.kl) whose robust objective DR-DSGD minimizes
  **kl(2.0).hparams("KL regularisation lambda (theory: lambda > 1)"),
}


@register("dr_dsgd", family="dro")
@with_settings(defaults={"local_steps": 32, "batch_size": 32}, fixed={"weighting": "uniform"})
def dr_dsgd(model, settings: CommonSettings) -> Algorithm:
  """DR-DSGD (Issaid 2022), federated form: local SGD on exp(loss / lambda), server averaging.

  DR-DSGD with server averaging every ``local_steps`` steps (uniform averages).

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` of the averaged model ``w_bar``.
    clients_per_round: clients averaged each round (drawn without replacement); ``None``
      (default): all, the complete graph of the original.
    local_steps: the mixing interval ``I``: local steps between two averages (default 32).
    batch_size: examples per stochastic gradient (default 32); ``None``: full batches.

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. Hyper-parameters: ``client_lr``, the local
    step size eta (default 0.01), and ``lam``, the KL regularisation lambda (default 2.0; the
    theory asks for lambda > 1, smaller is more robust).
  """
  init = state_init(settings, lambda params, n: DrDsgdState(params, round_zero()))

  def round_fn(state, data, key, hparams, release=PLAIN):
    lr, lam = hparams["client_lr"], hparams["lam"]

    def step(carry, loss, grad):
      scale = lr * jnp.exp(loss / lam) / lam
      w = jax.tree.map(lambda p, g: (p - scale * g).astype(p.dtype), carry["params"], grad)
      return {"params": w}

    start = lambda row: {"params": state.params}
    update = stateful_local_round(
      model, settings, data, key, start=start, step=step, averaged=("params",), release=release
    )
    new_state = DrDsgdState(update.carries["params"], state.round + 1)
    return new_state, stateful_round_metrics(update)

  cost = local_training_costs(model, settings)
  return build_algorithm(
    "dr_dsgd",
    model,
    settings,
    init,
    round_fn,
    HPARAMS,
    cost=cost,
    releases=RELEASES,
    model_states=AVERAGED,
  )
