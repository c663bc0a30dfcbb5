"""An algorithm a user writes and registers is made private by its declaration: ``fd.private``
reads ``Algorithm.releases`` and passes the round a release mechanism, never looking at the
algorithm's name. Against its plain form at noise 0 and a huge clip, and its epsilon against
``dp-accounting`` called directly."""

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting import rdp

import fedjax_dro as fd
from fedjax_dro.algorithms import base
from fedjax_dro.algorithms.base import HParam, build_algorithm, register, with_settings
from fedjax_dro.core.aggregation import tree_add
from fedjax_dro.core.local import local_round_and_losses, round_metrics
from fedjax_dro.core.precision import float64
from fedjax_dro.core.release import PLAIN
from fedjax_dro.core.settings import LOCAL_TRAINING, state_init
from fedjax_dro.privacy import Refused, Releases
from tests.helpers import dataset, linreg, regression_clients

HPARAMS = {"client_lr": HParam(0.05, "local SGD step size")}


def _user_mean(model, settings, *, releases):
  """A user's FedAvg that also tracks the participants' mean loss as a server estimate: its
  participants release their model deltas (local_round) and their losses (release.losses)."""

  def round_fn(state, data, key, hparams, release=PLAIN):
    update, losses = local_round_and_losses(
      model, settings, state["params"], data, key, hparams["client_lr"], release
    )
    present = release.present(update.weights)
    mean = release.weighted_average(
      update.deltas, jnp.full(update.weights.shape, 1.0 / data.num_clients), present,
      1.0 / data.num_clients, data.num_clients, key,
    )  # fmt: skip
    reported = release.losses(losses, key)
    new = {"params": tree_add(state["params"], mean), "loss": jnp.mean(reported)}
    return new, {**round_metrics(update), "reported_loss": jnp.mean(reported)}

  init = state_init(settings, lambda params, n: {"params": params, "loss": jnp.zeros(())})
  return build_algorithm(
    "user_mean",
    model,
    settings,
    init,
    round_fn,
    HPARAMS,
    client_models=lambda state: state["params"],
    releases=releases,
  )


@pytest.fixture()
def registered(monkeypatch):
  """``user_mean`` registered for the test only (the registry restored after it)."""
  monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))

  @register("user_mean")
  @with_settings((*LOCAL_TRAINING, "weighting"), defaults={"weighting": "uniform"})
  def user_mean(model, settings, *, declared: bool = True):
    """A user's FedAvg with a reported loss."""
    releases = Releases("each participant's model delta and its loss", losses="loss")
    return _user_mean(model, settings, releases=releases if declared else None)

  return user_mean


@pytest.fixture(scope="module")
def task():
  return dataset(regression_clients(n=8, d=4, seed=0)), linreg(4)


def _diff(a, b):
  return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_a_user_algorithm_made_private_equals_its_plain_form_at_no_noise(task, registered):
  ds, model = task
  with float64():
    factory = fd.get_algorithm("user_mean").factory
    alg = factory(model, clients_per_round=8, local_steps=3, batch_size=4)
    plain = fd.run(alg, ds, rounds=3, seed=2)
    priv = fd.private(alg, 1e10, 0.0, sampling="fixed", loss_bound=1e10)
    private = fd.run(priv, ds, rounds=3, seed=2)
  assert _diff(plain.final_state, private.final_state) < 1e-10
  assert float(jnp.abs(plain.final_state["loss"])) > 0  # something was reported
  # the round's privacy metrics come back with its own
  m = private.train_metrics
  assert np.all(m["dp_participants"] == 8) and np.all(m["dp_unclipped"] == 8)
  assert "dp_participants" not in plain.train_metrics
  # its settings record carries the declaration; the accountant reads the private algorithm
  assert priv.privacy.releases.losses == "loss"
  assert priv.config["privacy"]["releases_losses"] is True


def test_a_user_algorithm_clips_what_it_releases(task, registered):
  """A tiny clip bounds one round's move of the model by C (the mean of deltas clipped to C,
  over the expected participants), where the plain round moves it much further; the losses are
  clipped to [0, B]."""
  ds, model = task
  with float64():
    alg = fd.get_algorithm("user_mean").factory(model, local_steps=3, batch_size=4)
    params = alg.model.init(jax.random.PRNGKey(0))
    clip = 1e-3
    priv = fd.private(alg, clip, 0.0, sampling="fixed", loss_bound=0.5)
    hist = fd.run(priv, ds, rounds=1, seed=0, init_params=params)
    plain = fd.run(alg, ds, rounds=1, seed=0, init_params=params)

  def moved(h):
    leaves = zip(jax.tree.leaves(h.final_state["params"]), jax.tree.leaves(params))
    return float(jnp.sqrt(sum(jnp.sum((a - b) ** 2) for a, b in leaves)))

  assert 0 < moved(hist) <= clip * (1 + 1e-12) and moved(plain) > 10 * clip
  assert float(hist.final_state["loss"]) <= 0.5 < float(plain.final_state["loss"])


def test_the_epsilon_of_a_user_algorithm_is_dp_accountings(task, registered):
  """Poisson at q, the model deltas at z and the losses at z_l on the same participants: one
  sampled Gaussian of multiplier (z^-2 + z_l^-2)^(-1/2) a round, composed by dp-accounting's RDP
  accountant directly."""
  ds, model = task
  q, z, zl, rounds, delta = 0.5, 1.3, 2.0, 4, 1e-5
  alg = fd.get_algorithm("user_mean").factory(model, local_steps=2)
  priv = fd.private(alg, 1.0, z, rate=q, delta=delta, loss_bound=1.0, loss_noise_multiplier=zl)
  hist = fd.run(priv, ds, rounds=rounds, seed=0)
  record = hist.evaluations[-1]["privacy"]
  combined = (z**-2 + zl**-2) ** -0.5
  event = dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(combined))
  accountant = rdp.RdpAccountant()
  accountant.compose(event, rounds)
  assert record["epsilon"] == pytest.approx(accountant.get_epsilon(delta), rel=1e-9)
  assert record["noise_multiplier"] == pytest.approx(combined)


def test_a_user_algorithm_that_declares_nothing_or_refuses_is_refused(task, registered):
  ds, model = task
  undeclared = fd.get_algorithm("user_mean").factory(model, declared=False)
  with pytest.raises(ValueError, match="'user_mean' declares no releases: build it with"):
    fd.private(undeclared, 1.0, 1.0, rate=0.5)
  refused = undeclared._replace(releases=Refused("it keeps a secret"))
  with pytest.raises(ValueError, match="cannot be made client-level private: it keeps a secret"):
    fd.private(refused, 1.0, 1.0, rate=0.5)
  # the declaration says it releases losses: the bound is required
  declared = fd.get_algorithm("user_mean").factory(model)
  with pytest.raises(ValueError, match="loss_bound: 'user_mean' releases each participant's loss"):
    fd.private(declared, 1.0, 1.0, rate=0.5)
