"""FGDRO-CVaR, FGDRO-KL, FGDRO-KL-Adam, LocalAdam and DR-DSGD (Guo and Yang 2024, Algorithms 1-4;
Issaid et al. 2022) against plain per-client numpy loops of the pseudo-code, and against closed
forms: the KL objective's optimum, the CVaR threshold's quantile, centralised Adam."""

import jax
import numpy as np
import pytest

from fedjax_dro import algorithms as A, cli, run
from fedjax_dro.core.sampling import sample_clients
from fedjax_dro.data import from_client_arrays
from tests.helpers import dataset, linreg, numpy_linreg_grad, regression_clients

L2 = 0.01
NAMES = ["fgdro_cvar", "fgdro_kl", "fgdro_kl_adam", "local_adam", "dr_dsgd"]
HP = {
  "fgdro_cvar": {"client_lr": 0.05, "threshold_lr": 0.3, "beta1": 0.4, "alpha": 0.4},
  "fgdro_kl": {"client_lr": 0.02, "lam": 3.0, "beta1": 0.3, "beta2": 0.2, "beta3": 0.5},
  "fgdro_kl_adam": {
    "client_lr": 0.01,
    "lam": 3.0,
    "beta1": 0.3,
    "beta2": 0.2,
    "beta3": 0.5,
    "beta4": 0.05,
    "tau": 1e-3,
  },
  "local_adam": {"client_lr": 0.01, "beta3": 0.5, "beta4": 0.05, "tau": 1e-3},
  "dr_dsgd": {"client_lr": 0.002, "lam": 20.0},
}


def _loss(w, b, x, y, l2):
  r = x @ w + b - y
  return 0.5 * np.mean(r * r) + 0.5 * l2 * (w @ w + b * b)


def _reference(name, data, rounds, seed, s, J, B, hp, fixed_after=None):
  """The paper's pseudo-code in numpy, one client at a time, with the simulator's key schedule.

  ``fixed_after``: from that round on, each client's gradient weight is the one its estimators
  give at that round's start (``exp(u_i / lambda) / v_bar``, ``1[u_i > s_bar]``), and u, v and s
  no longer move (FGDRO's Pile protocol: domain weights learned, then fixed)."""
  n, d = data.num_clients, data.x.shape[-1]
  x, y, nex = np.asarray(data.x), np.asarray(data.y), np.asarray(data.num_examples)
  _, _, run_key = jax.random.split(jax.random.PRNGKey(seed), 3)
  theta = np.zeros(d + 1)  # (w, b)
  m_bar, q_bar = np.zeros(d + 1), np.zeros(d + 1)
  v_bar, s_bar = 1.0, 0.0
  u = np.zeros(n)
  weight = None
  for r in range(rounds):
    if fixed_after is not None and r == fixed_after:  # the weights, computed once
      if name == "fgdro_cvar":
        weight = (u - s_bar > 0).astype(float)
      else:
        weight = np.exp(u / hp["lam"]) / v_bar
    key = jax.random.fold_in(run_key, r)
    sample_key, local_key = jax.random.split(key)
    idx = np.asarray(sample_clients(sample_key, n, s))
    client_keys = jax.random.split(local_key, s)
    out = []
    for k, i in enumerate(idx):
      w, m, q, v, thr = theta.copy(), m_bar.copy(), q_bar.copy(), v_bar, s_bar
      for step_key in jax.random.split(client_keys[k], J):
        if B is None:
          bx, by = x[i, : nex[i]], y[i, : nex[i]]
        else:
          rows = np.asarray(jax.random.randint(step_key, (B,), 0, nex[i]))
          bx, by = x[i, rows], y[i, rows]
        loss = _loss(w[:d], w[d], bx, by, L2)
        gw, gb = numpy_linreg_grad(w[:d], w[d], bx, by, L2)
        g = np.append(gw, gb)
        if weight is not None and name == "fgdro_cvar":
          w = w - hp["client_lr"] * weight[i] * g  # SGD on the fixed weights
        elif weight is not None:
          h = weight[i] * g
          m = (1 - hp["beta3"]) * m + hp["beta3"] * h
          if name == "fgdro_kl":
            w = w - hp["client_lr"] * m
          else:
            q = (1 - hp["beta4"]) * q + hp["beta4"] * h * h
            w = w - hp["client_lr"] * m / (np.sqrt(q) + hp["tau"])
        elif name == "fgdro_cvar":
          u[i] = (1 - hp["beta1"]) * u[i] + hp["beta1"] * loss
          df = 1.0 if u[i] - thr > 0 else 0.0
          v_i = -df + hp["alpha"]
          thr, w = thr - hp["threshold_lr"] * v_i, w - hp["client_lr"] * df * g
        elif name in ("fgdro_kl", "fgdro_kl_adam"):
          lam = hp["lam"]
          u[i] = (1 - hp["beta1"]) * u[i] + hp["beta1"] * loss
          v = (1 - hp["beta2"]) * v + hp["beta2"] * np.exp(u[i] / lam)
          h = np.exp(u[i] / lam) / v * g
          m = (1 - hp["beta3"]) * m + hp["beta3"] * h
          if name == "fgdro_kl":
            w = w - hp["client_lr"] * m
          else:
            q = (1 - hp["beta4"]) * q + hp["beta4"] * h * h
            w = w - hp["client_lr"] * m / (np.sqrt(q) + hp["tau"])
        elif name == "local_adam":
          m = (1 - hp["beta3"]) * m + hp["beta3"] * g
          q = (1 - hp["beta4"]) * q + hp["beta4"] * g * g
          w = w - hp["client_lr"] * m / (np.sqrt(q) + hp["tau"])
        elif name == "dr_dsgd":
          w = w - hp["client_lr"] * np.exp(loss / hp["lam"]) / hp["lam"] * g
      out.append((w, m, q, v, thr))
    theta = np.mean([o[0] for o in out], axis=0)
    m_bar, q_bar = np.mean([o[1] for o in out], axis=0), np.mean([o[2] for o in out], axis=0)
    v_bar, s_bar = float(np.mean([o[3] for o in out])), float(np.mean([o[4] for o in out]))
  return theta, dict(m=m_bar, q=q_bar, v=v_bar, s=s_bar, u=u)


def _flat(p):
  return np.append(np.asarray(p["w"]), float(p["b"]))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("s,batch_size", [(3, 4), (5, None)])
def test_matches_the_papers_pseudocode_in_a_numpy_loop(name, s, batch_size):
  data = regression_clients(n=5, d=3, seed=7, shift=0.5)
  alg = A.get_algorithm(name).factory(
    linreg(3, l2=L2), clients_per_round=s, local_steps=4, batch_size=batch_size, backend="vmap"
  )
  hist = run(alg, dataset(data), rounds=5, seed=2, hparams=HP[name], eval_every=5)
  theta, ref = _reference(name, data, 5, 2, s, 4, batch_size, HP[name])
  st = hist.final_state
  np.testing.assert_allclose(_flat(st.params), theta, rtol=0, atol=1e-10)
  if hasattr(st, "momentum"):
    np.testing.assert_allclose(
      np.append(np.asarray(st.momentum["w"]), st.momentum["b"]), ref["m"], rtol=0, atol=1e-10
    )
  if hasattr(st, "second_moment"):
    q = np.append(np.asarray(st.second_moment["w"]), st.second_moment["b"])
    np.testing.assert_allclose(q, ref["q"], rtol=0, atol=1e-10)
  if hasattr(st, "log_v"):
    np.testing.assert_allclose(float(np.exp(st.log_v)), ref["v"], rtol=1e-10)
  if hasattr(st, "threshold"):
    np.testing.assert_allclose(float(st.threshold), ref["s"], rtol=0, atol=1e-10)
  if hasattr(st, "loss_estimates"):  # u stays on the clients: non-participants keep theirs
    np.testing.assert_allclose(np.asarray(st.loss_estimates), ref["u"], rtol=0, atol=1e-10)


FROZEN = {
  "fgdro_cvar": ("beta1", "threshold_lr"),
  "fgdro_kl": ("beta1", "beta2"),
  "fgdro_kl_adam": ("beta1", "beta2"),
}


@pytest.mark.parametrize("name", sorted(FROZEN))
def test_domain_weights_fixed_after_a_first_phase_match_a_fixed_weight_loop(name):
  """FGDRO's Pile protocol: 3 rounds learning the weights, then 3 rounds of the same local
  optimizer on each client's gradient times its weight at the switch (a separate branch of the
  numpy loop: plain weighted SGD / momentum / Adam steps), u, v and s unchanged."""
  from fedjax_dro.algorithms.wrappers import with_fixed_domain_weights

  data = regression_clients(n=5, d=3, seed=7, shift=0.5)
  base = A.get_algorithm(name).factory(
    linreg(3, l2=L2), clients_per_round=3, local_steps=4, batch_size=4, backend="vmap"
  )
  alg = with_fixed_domain_weights(base, 3, FROZEN[name])
  hist = run(alg, dataset(data), rounds=6, seed=2, hparams=HP[name], eval_every=6)
  theta, ref = _reference(name, data, 6, 2, 3, 4, 4, HP[name], fixed_after=3)
  st = hist.final_state
  np.testing.assert_allclose(_flat(st.params), theta, rtol=0, atol=1e-10)
  np.testing.assert_allclose(np.asarray(st.loss_estimates), ref["u"], rtol=0, atol=1e-10)
  if name == "fgdro_cvar":
    np.testing.assert_allclose(float(st.threshold), ref["s"], rtol=0, atol=1e-10)
  else:
    np.testing.assert_allclose(float(np.exp(st.log_v)), ref["v"], rtol=1e-10)
  assert list(np.asarray(hist.train_metrics["weights_fixed"])) == [0, 0, 0, 1, 1, 1]
  # the first phase is the algorithm itself, and the phase matters
  early = run(alg, dataset(data), rounds=3, seed=2, hparams=HP[name], eval_every=3)
  plain3 = run(base, dataset(data), rounds=3, seed=2, hparams=HP[name], eval_every=3)
  assert np.array_equal(_flat(early.final_state.params), _flat(plain3.final_state.params))
  plain = run(base, dataset(data), rounds=6, seed=2, hparams=HP[name], eval_every=6)
  assert np.abs(_flat(plain.final_state.params) - theta).max() > 1e-6


def test_fixed_domain_weights_refuses_bad_arguments():
  from fedjax_dro.algorithms.wrappers import with_fixed_domain_weights

  alg = A.fgdro_kl(linreg(3), local_steps=2, batch_size=2)
  with pytest.raises(ValueError, match="weight_rounds"):
    with_fixed_domain_weights(alg, -1, ("beta1",))
  with pytest.raises(ValueError, match="'gamma'"):
    with_fixed_domain_weights(alg, 2, ("beta1", "gamma"))
  with pytest.raises(TypeError, match="estimators"):
    with_fixed_domain_weights(alg, 2, "beta1")
  with pytest.raises(TypeError, match="alg must be an Algorithm"):
    with_fixed_domain_weights(object(), 2, ("beta1",))


def _offset_clients(centers):
  """Client i has one example x = 0, y = c_i: its loss is 0.5 (b - c_i)^2 (plus 0 for w)."""
  xs = [np.zeros((1, 1)) for _ in centers]
  ys = [np.array([float(c)]) for c in centers]
  return from_client_arrays(xs, ys, dtype=np.float64)


def _kl_optimum(centers, lam):
  """argmin_b lambda log mean_i exp(0.5 (b - c_i)^2 / lambda), by bisection on the (monotone)
  derivative sum_i softmax_i(b) (b - c_i) of this convex function."""
  c = np.asarray(centers, float)

  def deriv(b):
    z = 0.5 * (b - c) ** 2 / lam
    p = np.exp(z - z.max())
    return np.sum(p / p.sum() * (b - c))

  lo, hi = c.min(), c.max()
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if deriv(mid) < 0 else (lo, mid)
  return 0.5 * (lo + hi)


def test_fgdro_kl_reaches_the_closed_form_optimum_of_the_kl_objective():
  centers, lam = [0.0, 1.0, 3.0], 5.0
  data = _offset_clients(centers)
  optimum = _kl_optimum(centers, lam)
  alg = A.fgdro_kl(linreg(1), local_steps=1, batch_size=None, backend="vmap")
  errors = []
  for beta2 in (0.03, 0.003):
    hp = {"client_lr": 0.05, "lam": lam, "beta1": 0.5, "beta2": beta2, "beta3": 0.5}
    hist = run(alg, dataset(data), rounds=2000, hparams=hp, eval_every=2000)
    errors.append(abs(float(hist.final_state.params["b"]) - optimum))
  # The fixed point is off by O(beta2) (each v_i is a local moving average between
  # communications); it shrinks with beta2 and is below 2e-4 at beta2 = 0.003.
  assert errors[1] < 2e-4 and errors[1] < errors[0] / 5, errors
  # The paper's printed exp(u) / v (no lambda) would settle at the lambda = 1 optimum instead,
  # hundreds of times farther away.
  assert abs(_kl_optimum(centers, 1.0) - optimum) > 0.05
  # The uniform (ERM) optimum is the mean of the centers: the KL solution leans to the worst.
  assert optimum > np.mean(centers) + 0.05


def test_fgdro_cvar_threshold_settles_between_the_k_th_and_k_plus_1_th_largest_loss():
  centers = np.arange(10.0)  # client losses 0.5 c_i^2 at b = 0, frozen by a negligible lr
  losses = 0.5 * centers**2
  alg = A.fgdro_cvar(linreg(1), local_steps=2, batch_size=None, backend="vmap")
  hp = {"client_lr": 1e-14, "threshold_lr": 0.05, "beta1": 0.5, "alpha": 0.3}
  hist = run(alg, dataset(_offset_clients(centers)), rounds=3000, hparams=hp, eval_every=3000)
  s = float(hist.final_state.threshold)
  top = np.sort(losses)[::-1]  # K = alpha N = 3 clients above the threshold
  assert top[3] < s < top[2], (s, top[:4])
  np.testing.assert_allclose(np.asarray(hist.final_state.loss_estimates), losses, atol=1e-9)


def test_local_adam_on_identical_clients_is_centralised_adam_on_the_pooled_objective():
  one = regression_clients(n=1, d=3, sizes=[12], seed=5)
  x1, y1 = np.asarray(one.x[0]), np.asarray(one.y[0])
  data = from_client_arrays([x1] * 4, [y1] * 4, dtype=np.float64)
  hp = {"client_lr": 0.05, "beta3": 0.1, "beta4": 0.001, "tau": 1e-8}
  alg = A.local_adam(linreg(3, l2=L2), local_steps=3, batch_size=None, backend="vmap")
  hist = run(alg, dataset(data), rounds=7, hparams=hp, eval_every=7)
  # centralised (uncorrected) Adam on the pooled data, 3 x 7 steps
  X, Y = np.concatenate([x1] * 4), np.concatenate([y1] * 4)
  w, m, q = np.zeros(4), np.zeros(4), np.zeros(4)
  for _ in range(21):
    g = np.append(*numpy_linreg_grad(w[:3], w[3], X, Y, L2))
    m, q = 0.9 * m + 0.1 * g, 0.999 * q + 0.001 * g * g
    w = w - 0.05 * m / (np.sqrt(q) + 1e-8)
  np.testing.assert_allclose(_flat(hist.final_state.params), w, rtol=0, atol=1e-10)


@pytest.mark.parametrize(
  "name,hparams,argument",
  [
    ("fgdro_kl", {"lam": 0.0}, "lam"),
    ("fgdro_kl", {"lam": -1.0}, "lam"),
    ("fgdro_kl_adam", {"lam": 0.0}, "lam"),
    ("dr_dsgd", {"lam": -2.0}, "lam"),
    ("fgdro_cvar", {"alpha": 1.5}, "alpha"),
    ("fgdro_cvar", {"alpha": 0.0}, "alpha"),
    ("fgdro_kl", {"beta2": 1.2}, "beta2"),
    ("local_adam", {"tau": 0.0}, "tau"),
    ("fgdro_kl", {"psi": 1.0}, "psi"),
  ],
)
def test_bad_hyper_parameters_are_refused_by_name(name, hparams, argument):
  alg = A.get_algorithm(name).factory(linreg(3))
  with pytest.raises(ValueError, match=argument):
    A.make_hparams(alg, hparams)


@pytest.mark.parametrize("name", NAMES)
def test_bad_settings_are_refused_by_name(name):
  factory = A.get_algorithm(name).factory
  with pytest.raises(ValueError, match="local_steps"):
    factory(linreg(3), local_steps=0)  # the communication interval I must be >= 1
  with pytest.raises(TypeError, match="psi"):
    factory(linreg(3), psi="kl")


@pytest.mark.parametrize("name", NAMES)
def test_runs_from_the_cli_run_and_sweep(name, tmp_path):
  out = str(tmp_path / name)
  common = ["--algorithm", name, "--dataset", "synthetic-classification", "--rounds", "2"]
  common += ["--option", "local_steps=2"]
  rc = cli.main(["run", *common, "--out", out, "--no-progress"])
  assert rc == 0
  rc = cli.main(
    ["sweep", *common, "--seeds", "0,1", "--grid", "client_lr=0.01,0.001", "--out", out + "-s"]
  )
  assert rc == 0
