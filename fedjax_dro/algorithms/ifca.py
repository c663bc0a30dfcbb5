"""IFCA: the Iterative Federated Clustering Algorithm, model averaging (option II).

A. Ghosh, J. Chung, D. Yin, K. Ramchandran, "An Efficient Framework for Clustered Federated
Learning", NeurIPS 2020, arXiv:2006.04088, Algorithm 1. The server keeps ``k`` cluster
models ``theta_1..theta_k``.
Round ``t``, every participant ``i in M_t``:

    j_i = argmin_j F_i(theta_j^t)                          (F_i: loss on i's whole local data)
    theta~_i = LocalUpdate(theta_{j_i}^t)                   (local_steps SGD steps, step client_lr)

and the server averages per cluster (option II, model averaging):

    theta_j^{t+1} = sum_{i in M_t, j_i = j} theta~_i / |{i in M_t: j_i = j}|

leaving the clusters nobody picked unchanged.

Readings where the paper leaves a choice (each reproduced by the numpy loop in
``tests/algorithms/test_personalized_baselines.py``):

* ``F_i`` is the client's objective of the simulator (masked mean loss on all of its training
  data plus the model's ridge penalty); ties go to the lowest cluster index (``argmin``).
* The cluster identities of all ``n`` clients are computed at the end of every round (and in
  ``init``) at the new cluster models and stored in the state: the next round's participants read
  theirs (the same ``argmin`` at the same models as the paper's line 6, so the round is
  unchanged), and ``client_models`` (which gets no data) returns them. This costs ``n k``
  full-data loss evaluations per round, the price of evaluating personalized models; it needs
  device-resident data (every client's data is read).
* The personalized model of client ``i`` is the cluster model it picks at the current state,
  ``theta_{j_i}`` (``client_models`` returns the ``[n, ...]`` rows ``clusters[assignment]``).
* The average is unweighted, as in the paper (``weighting="uniform"``); ``weighting=
  "num_examples"`` weights the participants' models by their sample counts.
* Initialisation, the paper's random restarts: cluster 0 starts at the ``params`` given to
  ``init`` (``run`` draws them with ``model.init`` from its model key, or passes ``init_params``)
  and cluster ``j >= 1`` at ``model.init(key_j)`` with independent keys ``key_j`` split from the
  init key. A model whose ``init`` ignores the key (zero-initialised linear regression: every
  draw identical, so the clusters would never separate) is detected by comparing two draws, and
  then every cluster model gets an independent seeded Gaussian perturbation ``init_scale N(0, I)``
  (factory setting, default 0.1). With ``num_clusters=1`` nothing is drawn or perturbed and IFCA
  is FedAvg with unweighted averaging.
* Minibatches and participants follow the key schedule of
  :func:`fedjax_dro.core.local.stateful_local_round` (that of ``local_round``).

Round metrics: ``train_loss`` / ``train_loss_max`` (first local minibatch, at the chosen cluster
model) and ``clusters_used``, the number of clusters some client picks after the round.

Persistent per-client state: ``assignment`` ``[n]`` int32 (the cluster identities).

Private form (:func:`fedjax_dro.privacy.private`): the cluster choice is made on the client and
never sent (``assignment`` is the simulator's record of the clients' choices; the
``clusters_used`` metric reads it like an evaluation does). A drawn participant sends its update
``theta~_i - theta_{j_i}`` clipped to the clip norm into the sum of its cluster, and a 1 into its
cluster's count. The server releases the ``k`` sums with Gaussian noise of standard deviation
``z C`` each (a client adds to one sum only) and the ``k`` counts with noise of standard deviation
``z_c`` each (the wrapper's ``count_noise_multiplier``; one client moves the count vector by 1),
and moves cluster ``j`` by its noised sum over ``max(noised count, 1)`` where the noised count is
at least 1/2 (with no noise: where somebody picked it, as in the plain round). Both releases are
on the same participants: the accountant composes them into one Gaussian mechanism of multiplier
``(z^-2 + z_c^-2)^(-1/2)``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.common.checks import integer, number
from fedjax_dro.common.model import client_loss
from fedjax_dro.core.clients import map_clients
from fedjax_dro.core.costs import local_training_costs
from fedjax_dro.core.local import stateful_local_round, stateful_round_metrics
from fedjax_dro.core.release import PLAIN, Releases
from fedjax_dro.core.settings import (
  LOCAL_TRAINING,
  CommonSettings,
  aggregation_weights,
  backend_for,
  participants,
  round_zero,
)


class IfcaState(NamedTuple):
  clusters: Any  # [k, ...] cluster models theta_j (params-shaped rows)
  assignment: jnp.ndarray  # [n] int32 argmin_j F_i(theta_j) at the current cluster models
  round: jnp.ndarray  # [] int32 rounds done


HPARAMS = {"client_lr": HParam(0.1, "local SGD step size gamma")}

RELEASES = Releases(
  "each participant's model delta (clipped to C) into the sum of the cluster it chose on the "
  "client, and a 1 into that cluster's count: k sums noised with std z C each, k counts with "
  "std z_c each; cluster j moves by its noised sum over max(noised count, 1) where the count "
  "is at least 1/2",
  counts=True,
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""


def _gaussian_like(key, tree):
  """Standard normal noise shaped like ``tree`` (zeros for non-floating leaves)."""
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(key, max(len(leaves), 1))
  noise = [
    jax.random.normal(k, jnp.shape(a), jnp.result_type(a))
    if jnp.issubdtype(jnp.result_type(a), jnp.floating)
    else jnp.zeros_like(a)
    for k, a in zip(keys, leaves)
  ]
  return treedef.unflatten(noise)


def _same(a, b):
  """Traceable ``a == b`` for two pytrees of the same structure."""
  return jnp.all(
    jnp.stack([jnp.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))])
  )


@register("ifca", family="personalized")
@with_settings((*LOCAL_TRAINING, "weighting"), defaults={"weighting": "uniform"})
def ifca(model, settings: CommonSettings, *, num_clusters=2, init_scale=0.1) -> Algorithm:
  """IFCA (Ghosh 2020, option II): k cluster models, clients pick the one with least local loss.

  IFCA, option II (model averaging within each cluster).

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` of every cluster model ``theta_j``.
    num_clusters: ``k``, the number of cluster models (default 2).
    init_scale: standard deviation of the seeded Gaussian perturbation of the initial cluster
      models, applied only when ``model.init`` is deterministic (default 0.1; see the module
      docstring).
    clients_per_round: clients that train each round (uniform, without replacement); ``None``
      (default): all.
    local_steps: local SGD steps of a participant on its cluster's model (default 10).
    batch_size: examples per local step; ``None`` (default): full batches (the cluster choice
      always uses the full data).
    weighting: weights of the participants within a cluster's average: ``"uniform"`` (default)
      or ``"num_examples"`` (sample counts).

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. The one hyper-parameter is ``client_lr``,
    the local SGD step gamma (default 0.1). A participant uploads ``P + 1`` floats (``P``
    parameters): its model and its cluster identity (the cluster losses are no gradients).
  """
  num_clusters = integer(num_clusters, "num_clusters")
  init_scale = number(init_scale, "init_scale", minimum=0.0)
  k = num_clusters

  def assign(clusters, data):
    """``[n]`` int32 ``argmin_j F_i(theta_j)`` of every client."""
    reference = jax.tree.map(lambda a: a[0], clusters)

    def one(x, y, mask):
      losses = jax.vmap(lambda theta: client_loss(model, theta, x, y, mask))(clusters)
      return jnp.argmin(losses).astype(jnp.int32)

    return map_clients(
      one,
      data.x,
      data.y,
      data.mask,
      backend=backend_for(settings, reference),
      chunk_size=settings.chunk_size,
    )

  def init(params, data, key):
    participants(settings, data.num_clients)
    draws = [params]
    if k > 1:
      draw_key, noise_key = jax.random.split(key)
      keys = jax.random.split(draw_key, k)
      cast = lambda tree: jax.tree.map(
        lambda p, d: jnp.asarray(d, jnp.result_type(p)), params, tree
      )
      draws += [cast(model.init(keys[j])) for j in range(1, k)]
      # deterministic init (the same draw for two keys): perturb every cluster
      scale = jnp.where(_same(cast(model.init(keys[0])), draws[1]), init_scale, 0.0)
      noise_keys = jax.random.split(noise_key, k)
      draws = [
        jax.tree.map(
          lambda p, z: (p + scale * z).astype(jnp.result_type(p)),
          draw,
          _gaussian_like(noise_keys[j], draw),
        )
        for j, draw in enumerate(draws)
      ]
    clusters = jax.tree.map(lambda *rows: jnp.stack(rows), *draws)
    return IfcaState(clusters, assign(clusters, data), round_zero())

  def round_fn(state, data, key, hparams, release=PLAIN):
    lr = hparams["client_lr"]

    def start(j):
      return {"params": jax.tree.map(lambda a: a[j], state.clusters)}

    def step(carry, loss, grad):
      del loss
      params = jax.tree.map(lambda p, g: (p - lr * g).astype(p.dtype), carry["params"], grad)
      return {"params": params}

    update = stateful_local_round(
      model,
      settings,
      data,
      key,
      start=start,
      step=step,
      client_state=state.assignment,
      released=("params",),
      release=release,
    )  # the participants' theta~_i stacked (private: their clipped theta~_i - theta_{j_i})
    # [s, k] the cluster each participant chose
    chosen = jax.nn.one_hot(
      state.assignment[jnp.minimum(update.idx, data.num_clients - 1)],
      k,
      dtype=jnp.result_type(float),
    )
    clusters, metrics = release.group_means(
      update.carries["params"],
      state.clusters,
      chosen,
      aggregation_weights(settings, update.num_examples),
      update.present,
      key,
    )
    return finish(state, data, update, clusters, metrics)

  def finish(state, data, update, clusters, released):
    assignment = assign(clusters, data)
    metrics = {**stateful_round_metrics(update), **released}
    metrics["clusters_used"] = jnp.sum(
      jnp.any(assignment[:, None] == jnp.arange(k)[None, :], axis=0)
    ).astype(jnp.result_type(float))
    return IfcaState(clusters, assignment, state.round + 1), metrics

  def client_models(state):
    return jax.tree.map(lambda a: a[state.assignment], state.clusters)

  return build_algorithm(
    "ifca",
    model,
    settings,
    init,
    round_fn,
    HPARAMS,
    cost=local_training_costs(model, settings, scalars=1),  # theta~_i and j_i
    releases=RELEASES,
    client_models=client_models,
    personalized=True,
    num_clusters=num_clusters,
    init_scale=init_scale,
  )
