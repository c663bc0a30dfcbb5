"""AFL, DRFA, q-FFL and AgnosticFedAvg against plain numpy per-client reference loops (float64,
the same keys, minibatches and sampled clients), q-FFL's q = 0 limit (FedAvg), bad inputs, and
``fedjax-dro run`` for every DRO algorithm (mean / worst-20% / per-client metrics)."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro import algorithms as A, cli, run
from fedjax_dro.core.sampling import sample_clients
from tests.algorithms.test_scaff_pd import (
  L2,
  np_batch,
  np_dual_prox,
  np_loss_grad,
  np_proj_simplex,
  run_keys,
)
from tests.helpers import dataset, linreg, regression_clients

N, D = 6, 3


def _data():
  return regression_clients(n=N, d=D, seed=5, shift=0.2)


def _full(data, i):
  return np_batch(data, i, None, None)


def ref_afl(data, rounds, seed, s, B, hp):
  n = data.num_clients
  w, b, lam = np.zeros(D), 0.0, np.full(n, 1.0 / n)
  for r in range(rounds):
    key = jax.random.fold_in(run_keys(seed), r)
    sample_key, local_key = jax.random.split(key)
    idx = np.asarray(sample_clients(sample_key, n, s))
    gw, gb, v = np.zeros(D), 0.0, np.zeros(n)
    for k, i in enumerate(idx):
      step_key = jax.random.split(jax.random.split(local_key, s)[k], 1)[0]
      loss, g1, g2 = np_loss_grad(w, b, *np_batch(data, i, step_key, B), L2)
      gw, gb = gw + n / s * lam[i] * g1, gb + n / s * lam[i] * g2
      v[i] = n / s * loss
    w, b = w - hp["lr_w"] * gw, b - hp["lr_w"] * gb
    lam = np_dual_prox("chi2", lam, v, hp["lr_lambda"], hp)
  return w, b, lam


def _local_sgd(data, i, w, b, client_key, J, B, lr):
  uw, ub = w.copy(), b
  for step_key in jax.random.split(client_key, J):
    _, gw, gb = np_loss_grad(uw, ub, *np_batch(data, i, step_key, B), L2)
    uw, ub = uw - lr * gw, ub - lr * gb
  return uw, ub


def ref_fedavg_family(name, data, rounds, seed, s, J, B, hp):
  """q-FFL, AgnosticFedAvg and uniform FedAvg share the sampling and local SGD of local_round."""
  n = data.num_clients
  w, b, lam = np.zeros(D), 0.0, np.full(n, 1.0 / n)
  for r in range(rounds):
    key = jax.random.fold_in(run_keys(seed), r)
    sample_key, local_key = jax.random.split(key)
    idx = np.asarray(sample_clients(sample_key, n, s))
    keys = jax.random.split(local_key, s)
    F, ws, bs = np.zeros(s), np.zeros((s, D)), np.zeros(s)
    for k, i in enumerate(idx):
      F[k] = np_loss_grad(w, b, *_full(data, i), L2)[0]
      ws[k], bs[k] = _local_sgd(data, i, w, b, keys[k], J, B, hp["client_lr"])
    if name == "qffl":
      q, L = hp["q"], hp["L"]
      f = F + 1e-10
      dw, db = L * (w - ws), L * (b - bs)
      h = q * f ** (q - 1) * (np.sum(dw**2, 1) + db**2) + L * f**q
      w, b = w - (f**q) @ dw / h.sum(), b - (f**q) @ db / h.sum()
      lam = np.zeros(n)
      lam[idx] = f**q / np.sum(f**q)
    elif name == "agnostic_fedavg":
      a = lam[idx] / lam[idx].sum()
      w, b = w + hp["server_lr"] * a @ (ws - w), b + hp["server_lr"] * a @ (bs - b)
      loss = np.zeros(n)
      loss[idx] = F
      lam = lam * np.exp(hp["domain_lr"] * loss)
      lam = lam / lam.sum()
    else:  # uniform FedAvg
      w, b = w + np.mean(ws - w, 0), b + np.mean(bs - b)
  return w, b, lam


def ref_drfa(data, rounds, seed, m, tau, B, hp, prox, sampling):
  n = data.num_clients
  w, b, lam = np.zeros(D), 0.0, np.full(n, 1.0 / n)
  for r in range(rounds):
    key = jax.random.fold_in(run_keys(seed), r)
    k_sample, k_snap, k_local, k_usample, k_eval = jax.random.split(key, 5)
    if sampling == "lambda":
      idx = np.asarray(sample_clients(k_sample, n, m, jnp.asarray(lam), replace=True))
      agg = np.full(m, 1.0 / m)
    else:
      idx, agg = np.arange(n), lam.copy()
    t_snap = int(jax.random.randint(k_snap, (), 0, tau))
    keys = jax.random.split(k_local, m)
    fw, fb, sw, sb = np.zeros((m, D)), np.zeros(m), np.zeros((m, D)), np.zeros(m)
    for k, i in enumerate(idx):
      uw, ub = w.copy(), b
      for j, step_key in enumerate(jax.random.split(keys[k], tau)):
        if j == t_snap:
          sw[k], sb[k] = uw, ub
        _, gw, gb = np_loss_grad(uw, ub, *np_batch(data, i, step_key, B), L2)
        uw, ub = uw - hp["client_lr"] * gw, ub - hp["client_lr"] * gb
      fw[k], fb[k] = uw, ub
    w, b = agg @ fw, agg @ fb
    snap_w, snap_b = agg @ sw, agg @ sb
    if sampling == "lambda":
      uidx, scale = np.asarray(sample_clients(k_usample, n, m)), n / m
    else:
      uidx, scale = np.arange(n), 1.0
    ekeys = jax.random.split(k_eval, len(uidx))
    v = np.zeros(n)
    for k, i in enumerate(uidx):
      v[i] = scale * np_loss_grad(snap_w, snap_b, *np_batch(data, i, ekeys[k], B), L2)[0]
    step = hp["gamma"] * tau
    if prox:
      lam = np_dual_prox("chi2", lam, v, step, hp)
    else:
      lam = np_proj_simplex(lam + step * (v - hp["rho"] * (n * lam - 1)))
  return w, b, lam


CASES = {
  "afl": (dict(clients_per_round=4, batch_size=4), {"lr_w": 0.1, "lr_lambda": 0.5, "rho": 0.1}),
  "qffl": (
    dict(clients_per_round=4, local_steps=3, batch_size=4),
    {"client_lr": 0.05, "q": 2.0, "L": 15.0},
  ),
  "agnostic_fedavg": (
    dict(clients_per_round=4, local_steps=3, batch_size=4),
    {"client_lr": 0.05, "server_lr": 0.8, "domain_lr": 2.0},
  ),
  "drfa": (
    dict(clients_per_round=4, local_steps=5, batch_size=4, prox=False),
    {"client_lr": 0.05, "gamma": 0.2, "rho": 0.1},
  ),
  "drfa_prox_full": (
    dict(local_steps=5, batch_size=None, prox=True, sampling="full"),
    {"client_lr": 0.05, "gamma": 0.2, "rho": 0.1},
  ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_numpy_reference(case):
  data = _data()
  options, hp = CASES[case]
  name = "drfa" if case.startswith("drfa") else case
  alg = A.get_algorithm(name).factory(linreg(D, l2=L2), backend="vmap", **options)
  rounds, seed = 3, 7
  hist = run(alg, dataset(data), rounds=rounds, seed=seed, hparams=hp, eval_every=rounds)
  if name == "afl":
    w, b, lam = ref_afl(data, rounds, seed, 4, 4, hp)
  elif name == "drfa":
    w, b, lam = ref_drfa(
      data,
      rounds,
      seed,
      options.get("clients_per_round") or N,
      options["local_steps"],
      options["batch_size"],
      hp,
      options["prox"],
      options.get("sampling", "lambda"),
    )
  else:
    w, b, lam = ref_fedavg_family(name, data, rounds, seed, 4, 3, 4, hp)
  st = hist.final_state
  np.testing.assert_allclose(np.asarray(st.params["w"]), w, rtol=0, atol=1e-10)
  np.testing.assert_allclose(float(st.params["b"]), b, rtol=0, atol=1e-10)
  np.testing.assert_allclose(np.asarray(st.lam), lam, rtol=0, atol=1e-10)
  for key in ("train_loss", "train_loss_max", "lambda_max"):
    assert hist.train_metrics[key].shape == (rounds,)
  assert np.all(hist.train_metrics["train_loss_max"] >= hist.train_metrics["train_loss"] - 1e-12)


def test_qffl_with_q_zero_is_uniform_fedavg():
  data = _data()
  model = linreg(D, l2=L2)
  common = dict(clients_per_round=4, local_steps=3, batch_size=4, backend="vmap")
  hq = run(
    A.qffl(model, **common),
    dataset(data),
    rounds=3,
    seed=2,
    hparams={"client_lr": 0.05, "q": 0.0, "L": 20.0},
    eval_every=3,
  )
  w, b, _ = ref_fedavg_family("fedavg", data, 3, 2, 4, 3, 4, {"client_lr": 0.05})
  np.testing.assert_allclose(np.asarray(hq.final_state.params["w"]), w, atol=1e-10)
  np.testing.assert_allclose(float(hq.final_state.params["b"]), b, atol=1e-10)


def test_bad_inputs():
  model = linreg(D)
  data = _data()
  key = jax.random.PRNGKey(0)
  params = model.init(key)
  with pytest.raises(ValueError, match="psi"):
    A.drfa(model, psi="qffl")
  with pytest.raises(ValueError, match="psi"):
    A.afl(model, psi="entropy")
  with pytest.raises(ValueError, match="sampling"):
    A.drfa(model, sampling="uniform")
  with pytest.raises(TypeError, match="prox"):
    A.drfa(model, prox="yes")
  with pytest.raises(TypeError, match="return_average"):
    A.afl(model, return_average=1)
  with pytest.raises(ValueError, match="sampling='full'"):
    A.drfa(model, sampling="full", clients_per_round=2).init(params, data, key)
  with pytest.raises(ValueError, match="clients_per_round"):
    A.qffl(model, clients_per_round=N + 1).init(params, data, key)
  with pytest.raises(ValueError, match="local_steps"):
    A.agnostic_fedavg(model, local_steps=0)
  checks = [
    (A.afl(model), {"lr_w": -0.1}),
    (A.afl(model), {"lr_lambda": 0.0}),
    (A.afl(model, psi="cvar"), {"alpha": 2.0}),
    (A.drfa(model), {"gamma": -1.0}),
    (A.drfa(model), {"rho": -0.5}),
    (A.drfa(model, psi="cvar"), {"alpha": 0.0}),
    (A.qffl(model), {"q": -1.0}),
    (A.qffl(model), {"L": 0.0}),
    (A.agnostic_fedavg(model), {"domain_lr": -0.1}),
    (A.agnostic_fedavg(model), {"server_lr": float("inf")}),
  ]
  for alg, bad in checks:
    with pytest.raises(ValueError, match=list(bad)[0]):
      A.make_hparams(alg, bad)


DRO_ALGORITHMS = ["scaff_pd", "afl", "drfa", "qffl", "agnostic_fedavg"]


def _cli_run(tmp_path, algorithm, dataset_name):
  out = os.path.join(tmp_path, f"{algorithm}-{dataset_name}")
  # AFL takes one gradient step per round: it has no local_steps option
  local = [] if algorithm == "afl" else ["--local-steps", "2"]
  rc = cli.main(
    [
      "run",
      "--algorithm",
      algorithm,
      "--dataset",
      dataset_name,
      "--rounds",
      "3",
      "--eval-every",
      "3",
      "--no-progress",
      "--out",
      out,
      *local,
    ]
  )
  assert rc == 0
  with open(os.path.join(out, "summary.json")) as f:
    final = json.load(f)["final"]
  with open(os.path.join(out, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  return final, records


@pytest.mark.parametrize("algorithm", DRO_ALGORITHMS)
def test_cli_run_synthetic_shift(tmp_path, algorithm):
  final, records = _cli_run(tmp_path, algorithm, "synthetic-shift")
  for stat in ("mean", "weighted_mean", "worst20", "best20", "worst"):
    assert np.isfinite(final["loss"][stat])
  assert final["loss"]["worst20"] >= final["loss"]["mean"]
  rounds = [r for r in records if r["type"] == "round"]
  assert len(rounds) == 3 and all("train_loss" in r and "train_loss_max" in r for r in rounds)
  ev = [r for r in records if r["type"] == "eval"][-1]
  assert len(ev["per_client"]["loss"]) == 5 and len(ev["per_client"]["r2"]) == 5


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", DRO_ALGORITHMS)
def test_cli_run_synthetic_classification(tmp_path, algorithm):
  final, _ = _cli_run(tmp_path, algorithm, "synthetic-classification")
  assert 0.0 <= final["accuracy"]["worst20"] <= final["accuracy"]["mean"] <= 1.0


def test_cli_option_and_unknown_option_errors(tmp_path, capsys):
  assert (
    cli.main(
      [
        "run",
        "--algorithm",
        "drfa",
        "--dataset",
        "synthetic-shift",
        "--rounds",
        "2",
        "--option",
        "psi=qffl",
        "--no-progress",
      ]
    )
    == 2
  )
  assert "psi" in capsys.readouterr().err
  assert (
    cli.main(
      [
        "run",
        "--algorithm",
        "afl",
        "--dataset",
        "synthetic-shift",
        "--rounds",
        "2",
        "--local-steps",
        "3",
        "--no-progress",
      ]
    )
    == 2
  )
