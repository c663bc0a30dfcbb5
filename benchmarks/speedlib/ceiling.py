"""The ``ceiling`` section of ``benchmarks/speed.py``: what XLA's own matmul kernels allow. The
matrix products one local step of ``c`` clients traces to, each timed alone in its fastest
layout and repeated inside one program, summed with everything else in a round taken as free,
best over ``c``, against the per-client loop and the ``auto`` backend measured beside them."""

from __future__ import annotations

import functools
import itertools
import json
import math

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np

from fedjax_dro.common.model import client_loss_and_grad
from fedjax_dro.core.precision import default_precision, with_precision
from speedlib.workloads import (
  BATCH,
  LOCAL_STEPS,
  MATMUL_PRECISION,
  backend_row,
  dense_rates,
  loop_rate,
  make_model,
  make_workload,
  plan_label,
  rounds_for,
  step_flops,
  time_calls,
)

# Clients side by side the ceiling is evaluated at, and the most operand bytes it times.
CEILING_CHUNKS = (1, 4, 10, 20, 40, 100, 250, 500, 1000, 2000)
CEILING_MAX_BYTES = 512 * 2**20
CEILING_LOOP_SECONDS = 2e-3  # a product is repeated in one program for about this long a call


def _dot_equations(jaxpr):
  """Every ``dot_general`` equation of ``jaxpr``, those of its sub-jaxprs included."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      yield eqn
    for sub in jex.core.jaxprs_in_params(eqn.params):
      yield from _dot_equations(sub)


def _precision_name(precision):
  """The name of a ``dot_general``'s explicit precision (``None`` when it has none)."""
  if precision is None:
    return None
  first = precision[0] if isinstance(precision, tuple) else precision
  return None if first is None else getattr(first, "name", str(first))


def step_products(model, params, x, y, clients):
  """The matrix products of one local step of ``clients`` clients side by side (``vmap``): one
  record per ``dot_general`` of the traced forward, backward and SGD update (the step of
  :func:`speed_workloads.loop_rate` and of every backend), with its batch size, its ``m x k`` by
  ``k x n`` shape (several contracting or free dimensions multiplied out), operand and result
  dtypes, and explicit precision."""
  nex = jnp.int32(x.shape[0])

  def step(w, key):
    _, g = client_loss_and_grad(model, w, x, y, nex, key, BATCH)
    return jax.tree.map(lambda a, b: a - 0.05 * b, w, g)

  def size(shape, dims):
    return int(np.prod([shape[d] for d in dims], dtype=np.int64))

  def free(shape, *taken):
    return [d for d in range(len(shape)) if all(d not in t for t in taken)]

  stacked = jax.tree.map(lambda a: jnp.broadcast_to(a, (clients,) + a.shape), params)
  keys = jax.random.split(jax.random.PRNGKey(0), clients)
  products = []
  for eqn in _dot_equations(jax.make_jaxpr(jax.vmap(step))(stacked, keys).jaxpr):
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = (v.aval.shape for v in eqn.invars)
    products.append(
      {
        "batch": size(lhs, lb),
        "m": size(lhs, free(lhs, lc, lb)),
        "k": size(lhs, lc),
        "n": size(rhs, free(rhs, rc, rb)),
        "dtype": str(eqn.invars[0].aval.dtype),
        "out_dtype": str(eqn.outvars[0].aval.dtype),
        "precision": _precision_name(eqn.params.get("precision")),
      }
    )
  return products


def time_in_loop(fn, lhs, rhs, repeats):
  """Seconds of one ``fn(lhs, rhs)`` without the cost of a call: ``fn`` repeated in a
  ``fori_loop`` inside one program (an optimization barrier on the loop's carry keeps XLA from
  hoisting the loop-invariant product out of it), enough times for ~``CEILING_LOOP_SECONDS`` a
  call, best of ``repeats`` calls after a warm-up, divided by the repetitions. A call's own cost
  (dispatch, ~5-20 us on CPU) would otherwise be counted once per product and understate the
  ceiling where products are small."""
  single = jax.jit(fn)
  jax.block_until_ready(single(lhs, rhs))
  reps = max(1, min(1000, int(CEILING_LOOP_SECONDS / time_calls(lambda: single(lhs, rhs), 2))))
  f = jax.jit(repeated(fn, reps))
  jax.block_until_ready(f(lhs, rhs))
  return time_calls(lambda: f(lhs, rhs), repeats) / reps


def repeated(fn, reps):
  """``(lhs, rhs) -> fn(lhs, rhs)`` computed ``reps`` times in a ``fori_loop``, each time on the
  operands passed through an optimization barrier, so that XLA cannot tell they are the same
  every iteration and compute the product once before the loop."""

  def looped(lhs, rhs):
    def body(_, carry):
      a, b, _ = jax.lax.optimization_barrier(carry)
      return a, b, fn(a, b)

    out = jax.eval_shape(fn, lhs, rhs)
    return jax.lax.fori_loop(0, reps, body, (lhs, rhs, jnp.zeros(out.shape, out.dtype)))[2]

  return looped


def time_product(product, matmul_precision, repeats, cache):
  """``(best seconds, layout)`` of one product over the eight layouts XLA can be handed: the
  left operand stored ``m x k`` or ``k x m``, the right ``k x n`` or ``n x k``, the result
  ``m x n`` or ``n x m`` (each compiled alone under ``jax.default_matmul_precision(
  matmul_precision)``, operands on the device, timed by :func:`time_in_loop`). Cached in
  ``cache`` by shape: ``m x k @ k x n`` and its transpose are one problem, since the eight
  layouts of one are those of the other."""
  b, m, k, n = product["batch"], product["m"], product["k"], product["n"]
  key = (b, k, min(m, n), max(m, n), product["dtype"], product["out_dtype"])
  key += (product["precision"], matmul_precision)
  if key in cache:
    return cache[key]
  dims = {"m": m, "k": k, "n": n}
  dtype = jnp.dtype(product["dtype"])
  explicit = product["precision"]
  batch = "z" if b > 1 else ""
  best = (math.inf, "")
  for left, right, out in itertools.product(("mk", "km"), ("kn", "nk"), ("mn", "nm")):

    def make(spec, seed):
      shape = ((b,) if b > 1 else ()) + tuple(dims[c] for c in spec)
      return jax.random.normal(jax.random.PRNGKey(seed), shape, dtype)

    fn = functools.partial(
      jnp.einsum,
      f"{batch}{left},{batch}{right}->{batch}{out}",
      precision=None if explicit is None else jax.lax.Precision[explicit],
      preferred_element_type=jnp.dtype(product["out_dtype"]),
    )
    with jax.default_matmul_precision(matmul_precision):
      t = time_in_loop(fn, make(left, 0), make(right, 1), repeats)
    if t < best[0]:
      best = (t, f"{left},{right}->{out}")
  cache[key] = best
  return best


def _ceiling_chunks(n, quick):
  """Clients side by side at which the ceiling is evaluated (``vmap`` chunk sizes up to ``n``)."""
  grid = (1, n) if quick else CEILING_CHUNKS
  return sorted({c for c in grid if c <= n} | ({n} if n <= max(grid) else set()))


def _loop_and_auto(kind, model, data, params, precision, quick):
  """``(loop updates/s, auto's backend_row)`` of a workload (``model`` with its precision)."""
  repeats = 2 if quick else 5
  loop, _ = loop_rate(model, data, params, 0.05, repeats)
  rounds = 1 if quick else rounds_for(data.num_clients / max(loop, 1.0) / 20)
  auto = backend_row(make_model(kind), data, params, "auto", precision, 0.05, repeats, rounds)
  return loop, auto


def softmax_product_chain(n, chunks, repeats):
  """The softmax round's matrix products alone, as the round runs them: ``LOCAL_STEPS``
  dependent steps (each step's weights come from the previous step's gradient) of the forward
  product and the weight gradient, in the layout measured fastest for this chain on the 2-core
  CPU (examples ``[c, B, d]`` as stored, weights carried ``[c, k, d]``, logits ``[c, k, B]``),
  over chunks of ``c`` clients (``lax.map``). No sampling, softmax or update beyond the
  product's own: a lower bound on the round that, unlike the ceiling, keeps the steps'
  dependence and the operands' trips through memory. Returns ``{"by_chunk": [...], "best_s",
  "chunk"}`` (seconds for ``n`` clients)."""
  d, k = 64, 10
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((n, BATCH, d), dtype=np.float32))
  w = jnp.zeros((n, k, d), jnp.float32)

  def steps(xc, wc):
    for _ in range(LOCAL_STEPS):
      logits = jnp.einsum("cbd,ckd->ckb", xc, wc, precision="highest")
      wc = wc - 1e-3 * jnp.einsum("cbd,ckb->ckd", xc, logits, precision="highest")
    return wc

  by_chunk = []
  for c in chunks:
    if n % c:
      continue
    fn = jax.jit(
      lambda x, w, c=c: jax.lax.map(
        lambda a: steps(*a), (x.reshape(n // c, c, BATCH, d), w.reshape(n // c, c, k, d))
      )
    )
    jax.block_until_ready(fn(x, w))
    by_chunk.append({"chunk": c, "s": time_calls(functools.partial(fn, x, w), repeats)})
  best = min(by_chunk, key=lambda r: r["s"])
  return {"by_chunk": by_chunk, "best_s": best["s"], "chunk": best["chunk"]}


# The rungs of the hand-written softmax round, each doing a subset of the previous one's work.
HAND_WRITTEN_RUNGS = (
  ("same computation", "FedAvg's round as fd.compile_rounds runs it, written by hand"),
  ("weight gradient only", "no loss value, no bias: the closed-form gradient of the weights"),
  ("no sampling", "each step's batch a contiguous slice of the client's rows (not a sampler)"),
  ("no softmax", "the gradient (logits - one_hot) / B: products, a subtraction, the update"),
  ("no softmax, weights [k, d]", "the same, weights carried transposed through the steps"),
)


def softmax_round_by_hand(rung, num_clients, chunk, lr):
  """A jitted FedAvg round of the softmax workload written by hand, ``(params, x, y,
  num_examples, key) -> params``, at one rung of :data:`HAND_WRITTEN_RUNGS`, over chunks of
  ``chunk`` clients (``lax.map``; ``vmap`` when ``chunk >= num_clients``).

  ``"same computation"`` is the round of ``fedavg(softmax_regression(64, 10), local_steps=4,
  batch_size=32)`` with full participation, its keys split as the simulator splits them, so it
  returns the simulator's round to float32 rounding (tested): ``LOCAL_STEPS`` steps of the
  gradient of the mean cross-entropy (``value_and_grad``, bias included) on ``BATCH`` rows drawn
  with replacement from the client's own, and the sample-weighted mean of the model differences.
  Each later rung drops work from the one before (the bias, when dropped, stays as received).
  """
  names = [r for r, _ in HAND_WRITTEN_RUNGS]
  if rung not in names:
    raise ValueError(f"rung must be one of {names}, got {rung!r}")
  level = names.index(rung)

  def client(params, x, y, nex, key):
    m = x.shape[0]
    w = params["w"].T if level >= 4 else params["w"]
    carry = {"w": w, "b": params["b"]} if level == 0 else {"w": w}

    def step(p, a):
      step_key, j = a
      if level >= 2:
        bx = jax.lax.dynamic_slice_in_dim(x, (j * BATCH) % m, BATCH)
        by = jax.lax.dynamic_slice_in_dim(y, (j * BATCH) % m, BATCH)
      else:
        rows = jax.random.randint(step_key, (BATCH,), 0, jnp.maximum(nex, 1))
        bx, by = x[rows], y[rows]
      if level == 0:

        def loss(p):
          logits = bx @ p["w"] + p["b"]
          picked = jnp.take_along_axis(logits, by[:, None], axis=-1)[:, 0]
          return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)

        g = jax.grad(loss)(p)
      else:
        logits = bx @ p["w"].T if level >= 4 else bx @ p["w"]
        probs = logits if level >= 3 else jax.nn.softmax(logits)
        err = (probs - jax.nn.one_hot(by, logits.shape[-1], dtype=logits.dtype)) / BATCH
        g = {"w": err.T @ bx if level >= 4 else bx.T @ err}
      return jax.tree.map(lambda a, b: a - lr * b, p, g), None

    steps = (jax.random.split(key, LOCAL_STEPS), jnp.arange(LOCAL_STEPS))
    carry, _ = jax.lax.scan(step, carry, steps)
    delta = {"w": carry["w"] - w}
    delta["w"] = delta["w"].T if level >= 4 else delta["w"]
    delta["b"] = carry["b"] - params["b"] if level == 0 else jnp.zeros_like(params["b"])
    return delta

  @jax.jit
  def round_fn(params, x, y, num_examples, key):
    _, local_key = jax.random.split(key)  # the simulator's: participants' key, local work's key
    keys = jax.random.split(local_key, num_clients)
    weights = num_examples.astype(jnp.float32)
    weights = weights / jnp.sum(weights)

    def weighted(a):
      xc, yc, nex, k, wt = a
      return jax.tree.map(lambda t: wt * t, client(params, xc, yc, nex, k))

    args = (x, y, num_examples, keys, weights)
    if chunk >= num_clients:
      deltas = jax.vmap(weighted)(args)
    else:
      deltas = jax.lax.map(weighted, args, batch_size=chunk)
    return jax.tree.map(lambda p, d: p + jnp.sum(d, 0), params, deltas)

  return round_fn


def softmax_hand_written(params, data, lr, chunks, repeats):
  """Each rung of :data:`HAND_WRITTEN_RUNGS` timed on the softmax workload's data over chunks of
  ``c`` clients: ``{rung: {"by_chunk": [{"chunk", "s"}], "best_s", "chunk"}}`` (seconds for
  all clients). What a round written by hand, with none of the simulator's generality, gives on
  this device, and how much of it each part of the work costs."""
  n = data.num_clients
  key = jax.random.PRNGKey(1)
  out = {}
  for rung, _ in HAND_WRITTEN_RUNGS:
    by_chunk = []
    for c in chunks:
      fn = softmax_round_by_hand(rung, n, c, lr)
      call = functools.partial(fn, params, data.x, data.y, data.num_examples, key)
      jax.block_until_ready(call())
      by_chunk.append({"chunk": c, "s": time_calls(call, repeats)})
    best = min(by_chunk, key=lambda r: r["s"])
    out[rung] = {"by_chunk": by_chunk, "best_s": best["s"], "chunk": best["chunk"]}
  return out


def matmul_ceiling(args, dense):
  """The most client updates per second that XLA's own matmul kernels allow on this device.

  For each workload, the matrix products of one local step of ``c`` clients side by side
  (:func:`step_products`: exactly the ``dot_general`` operations the simulator's step traces
  to) are timed alone, each in the fastest of its eight operand and result layouts
  (:func:`time_product`); ``local_steps`` times their sum is the least time ``c`` client
  updates can take if everything else in a round (minibatch sampling, softmax, the SGD update,
  aggregation, loop overhead) were free and every product ran at its best layout at once. The
  best over chunk sizes ``c`` is the ceiling; the section measures, side by side in the same
  process, the per-client loop and the ``auto`` backend of ``fd.compile_rounds`` on the same
  data, so a target can be compared with what the hardware and compiler can give at all. The
  loop and ``auto`` are timed before and after the products and the dense rate before and after
  the section, the best of each kept: like every best-of-several figure here, this takes each
  in the machine's fast regime (see speed.py's docstring), so no ratio divides a fast figure by
  a slow one.

  It is generous to the ceiling: each product runs alone with its operands hot in cache, and
  no step can store every operand in its own best layout at once. It bounds rounds whose
  products are those of the traced step; a round that folds clients sharing one model into one
  larger product (FedSGD's gradient, the evaluation of a global model: the ``folding`` section)
  is outside it.
  """
  precision = args.precision or default_precision()
  rate = dense.get(precision, {}).get("flops_per_s")
  repeats = 2 if args.quick else 7
  cache, rows = {}, []
  for kind, n in args.ceiling_workloads:
    n = min(n, args.max_clients)
    model, params, data = make_workload(kind, n)
    model = with_precision(model, precision)
    x0, y0 = data.x[0], data.y[0]
    flops = LOCAL_STEPS * step_flops(model, params, x0, y0)
    # before and after the products, the best of both: a CPU that switches between throughput
    # regimes while the products are timed would otherwise skew the ratios
    before = _loop_and_auto(kind, model, data, params, precision, args.quick)
    by_chunk, best = [], None
    for c in _ceiling_chunks(n, args.quick):
      products = step_products(model, params, x0, y0, c)
      operand_bytes = sum(
        p["batch"]
        * (p["m"] * p["k"] + p["k"] * p["n"] + p["m"] * p["n"])
        * jnp.dtype(p["dtype"]).itemsize
        for p in products
      )
      if by_chunk and operand_bytes > CEILING_MAX_BYTES:
        break  # larger chunks only hold more (one client is always timed)
      timed = [(p, *time_product(p, MATMUL_PRECISION[precision], repeats, cache)) for p in products]
      seconds = LOCAL_STEPS * sum(t for _, t, _ in timed) / c
      by_chunk.append({"chunk": c, "updates_per_s": 1.0 / seconds})
      if best is None or 1.0 / seconds > best["updates_per_s"]:
        step_s = sum(t for _, t, _ in timed)
        best = {
          "chunk": c,
          "updates_per_s": 1.0 / seconds,
          "products": [
            {
              **p,
              "layout": layout,
              "s": t,
              "gflop_per_s": 2 * p["batch"] * p["m"] * p["k"] * p["n"] / t / 1e9,
              "share": t / step_s,
            }
            for p, t, layout in timed
          ],
        }
    after = _loop_and_auto(kind, model, data, params, precision, args.quick)
    loop = max(before[0], after[0])
    auto = max(before[1], after[1], key=lambda r: r["updates_per_s"])
    product_flops = sum(2 * p["batch"] * p["m"] * p["k"] * p["n"] for p in best["products"])
    row = {
      "model": kind,
      "num_clients": n,
      "flops_per_update": flops,
      "product_flops_per_update": LOCAL_STEPS * product_flops / best["chunk"],
      "loop_updates_per_s": loop,
      "auto": {
        "updates_per_s": auto["updates_per_s"],
        "speedup_vs_loop": auto["updates_per_s"] / loop,
        "plan": plan_label(auto),
      },
      "ceiling": {**best, "speedup_vs_loop": best["updates_per_s"] / loop},
      "by_chunk": by_chunk,
      "auto_of_ceiling": auto["updates_per_s"] / best["updates_per_s"],
    }
    if kind == "softmax":
      chain = softmax_product_chain(n, _ceiling_chunks(n, args.quick), 3 if args.quick else 15)
      ceiling_s = n / best["updates_per_s"]
      row["product_chain"] = {**chain, "of_ceiling_time": chain["best_s"] / ceiling_s}
      by_hand = softmax_hand_written(
        params, data, 0.05, _ceiling_chunks(n, args.quick), 3 if args.quick else 15
      )
      for r in by_hand.values():
        r["updates_per_s"] = n / r["best_s"]
        r["of_ceiling"] = r["updates_per_s"] / best["updates_per_s"]
        r["auto_of_this"] = auto["updates_per_s"] / r["updates_per_s"]
      row["hand_written"] = by_hand
    rows.append(row)
  # the yardstick again, after the products: the best of the two
  again = dense_rates(args.quick).get(precision, {}).get("flops_per_s")
  rate = max((r for r in (rate, again) if r), default=None)
  for row in rows:
    if rate:
      for part in (row["auto"], row["ceiling"]):
        part["fraction_of_dense"] = part["updates_per_s"] * row["flops_per_update"] / rate
    print(
      json.dumps({k: v for k, v in row.items() if k not in ("by_chunk",)}, default=str), flush=True
    )
  return {"precision": precision, "dense_flops_per_s": rate, "rows": rows}
