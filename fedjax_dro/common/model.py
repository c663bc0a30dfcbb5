"""The Model protocol and the masked per-client objective every algorithm uses.

A client's objective is the masked mean of the per-example loss over its valid rows plus an
optional ridge penalty: ``f_i(w) = (1/N_i) sum_{k valid} loss(apply(w, x_k), y_k) + l2/2 ||w||^2``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_dro.common import rows as client_rows

Array = Any
Params = Any


class Model(NamedTuple):
  """A model as pure functions.

  Attributes:
    init: ``key -> params``.
    apply: ``(params, x[m, *feature_shape]) -> outputs[m, ...]``.
    loss: ``(outputs, y) -> per-example loss [m]``.
    metrics: ``(outputs, y) -> dict of per-example metrics [m]`` (averaged with the mask).
    task: ``"regression"`` or ``"classification"``.
    l2: ridge penalty ``l2/2 ||w||^2`` added to every client objective.
    name: short description.
    identity: the builder and all its settings (what a resumed checkpoint must match; see
      :func:`model_identity`); empty: the name, task and l2 say it all.
    input_size: the number of features of one example (the product of its feature shape) the
      model is built for, checked against the data before anything is traced (a product that
      broadcasts a size-1 axis would otherwise train on data of the wrong shape); None: not
      declared (checked by applying the model abstractly only).
    dense_layers: the model's dense layers ``h = x W + b`` (each a
      :class:`~fedjax_dro.common.model.DenseLayer`: the kernel's path in the parameters and its
      shape) that local SGD may keep in factored form (:mod:`fedjax_dro.experimental.factored`); each is
      applied once per call, to a batch of vectors ``x [m, d_in]``.
    factored_apply: ``(params, x, corrections) -> outputs``: ``apply`` in which the output of
      each layer of ``dense_layers`` whose path is a key of ``corrections`` gains
      ``corrections[path](x_in)`` (``x_in`` the layer's input); None: no factored form.
    train_apply: ``(params, x, mask, rng) -> (outputs, state)``: the model in training mode
      (dropout drawn from the PRNG key ``rng``; batch statistics of the minibatch), returning
      with its outputs the new model state: a dict of the ``state_keys`` entries of ``params``
      (the running statistics after this minibatch; ``{}`` without state). ``mask [m]`` marks
      the minibatch's valid rows. ``apply`` is then the inference mode (running statistics, no
      dropout), the form every evaluation uses. None (default): training and inference are the
      same deterministic ``apply``.
    state_keys: the top-level keys of ``params`` (then a dict) holding model state rather than
      trainable weights (``("batch_stats",)``): never moved by a gradient (their gradient is
      zero, they are outside the ridge penalty), replaced after every local step by what
      ``train_apply`` returns, and handled by the federation as the algorithm's
      ``model_state`` setting says.
    state_masked: whether ``train_apply``'s batch statistics leave out the rows where ``mask`` is
      False; a model whose statistics would include padding rows is refused the local steps
      that contain them (full-batch steps and the last batch of an epoch).
  """

  init: Callable[[Array], Params]
  apply: Callable[[Params, Array], Array]
  loss: Callable[[Array, Array], Array]
  metrics: Callable[[Array, Array], dict]
  task: str = "classification"
  l2: float = 0.0
  name: str = "model"
  identity: str = ""
  input_size: Optional[int] = None
  dense_layers: tuple = ()
  factored_apply: Optional[Callable] = None
  train_apply: Optional[Callable] = None
  state_keys: tuple = ()
  state_masked: bool = False


def model_identity(model: Model) -> str:
  """The model's builder and settings (``linear_regression(10, ...); task=regression; l2=1.0``):
  two models of the same parameter shapes but other settings have different identities."""
  return f"{model.identity or model.name}; task={model.task}; l2={model.l2!r}"


def num_parameters(params) -> int:
  return int(sum(jnp.size(leaf) for leaf in jax.tree.leaves(params)))


def _sq_norm(tree) -> Array:
  return sum(jnp.vdot(leaf, leaf).real for leaf in jax.tree.leaves(tree))


DROPOUT_STREAM = 0x44524F50
"""The tag folded into a client's local-round key to derive its dropout keys: step ``j`` of a
client draws from ``fold_in(fold_in(client_key, DROPOUT_STREAM), j)``, a function of (run key,
round, client, step) only, so results do not depend on the backend or the chunking."""


def differentiated(fn: Callable) -> Callable:
  """``fn`` (the model's ``apply`` or ``train_apply``) as the simulator differentiates it: its
  convolutions in canonical layout where the traced program's tuning asks
  (``Tuning.canonical_conv``: the CPU's default; :mod:`fedjax_dro.common.conv`)."""
  from fedjax_dro.common.conv import canonical_convs
  from fedjax_dro.common.tuning import current

  return canonical_convs(fn) if current().canonical_conv else fn


def trainable(model: Model, params: Params) -> Params:
  """``params`` without the model's state entries (``Model.state_keys``)."""
  if not model.state_keys:
    return params
  return {k: v for k, v in params.items() if k not in model.state_keys}


def with_state(model: Model, params: Params, state) -> Params:
  """``params`` with its state entries replaced by ``state`` (None: unchanged)."""
  if state is None or not model.state_keys:
    return params
  return {**params, **{k: state[k] for k in model.state_keys}}


def step_rng(key: Array, j) -> Array:
  """The dropout key of local step ``j`` of the client whose local-round key is ``key``."""
  return jax.random.fold_in(jax.random.fold_in(key, DROPOUT_STREAM), j)


def train_loss(model: Model, params: Params, x: Array, y: Array, mask: Array, rng=None):
  """``(loss, state)``: the client objective of one minibatch in training mode.

  A model without ``train_apply`` gives :func:`client_loss` and no state (None). Otherwise the
  objective of ``train_apply`` (dropout from ``rng``) with the state entries held constant (no
  gradient reaches them) and outside the ridge penalty, and the new state it returns."""
  if model.train_apply is None:
    return client_loss(model, params, x, y, mask), None
  if model.state_keys:
    params = {
      k: jax.lax.stop_gradient(v) if k in model.state_keys else v for k, v in params.items()
    }
  out, state = differentiated(model.train_apply)(params, x, mask, rng)
  loss = masked_mean(model, out, y, mask)
  if model.l2:
    loss = loss + 0.5 * model.l2 * _sq_norm(trainable(model, params))
  return loss, state


def train_value_and_grad(model: Model, params: Params, x, y, mask, rng=None):
  """``(loss, grad, state)`` of :func:`train_loss` (the gradient of the state entries is 0)."""
  (loss, state), g = jax.value_and_grad(
    lambda p: train_loss(model, p, x, y, mask, rng), has_aux=True
  )(params)
  return loss, g, state


def masked_mean(model: Model, outputs: Array, y: Array, mask: Array) -> Array:
  """The mean of ``model.loss`` over the rows where ``mask`` is True (0 where none is)."""
  per_example = model.loss(outputs, y)
  w = mask.astype(per_example.dtype)
  return jnp.sum(per_example * w) / jnp.maximum(jnp.sum(w), 1.0)


def client_loss(model: Model, params: Params, x: Array, y: Array, mask: Array) -> Array:
  """Masked mean loss of one client plus the ridge penalty (padded rows contribute nothing)."""
  loss = masked_mean(model, differentiated(model.apply)(params, x), y, mask)
  if model.l2:
    loss = loss + 0.5 * model.l2 * _sq_norm(trainable(model, params))
  return loss


def sample_batch(key: Array, x: Array, y: Array, num_examples: Array, batch_size: Optional[int]):
  """A minibatch of one client: ``batch_size`` valid rows drawn uniformly with replacement.

  With ``batch_size=None`` the full (masked) client data is used. Only valid rows can be drawn:
  the data layout puts them first, so a draw in ``[0, num_examples)`` suffices, and the result does
  not depend on how much padding follows.
  """
  if batch_size is None:
    return client_rows.whole(x, y, num_examples)
  drawn = jax.random.randint(key, (batch_size,), 0, jnp.maximum(num_examples, 1))
  return (*client_rows.take(x, y, drawn), jnp.ones((batch_size,), bool))


def client_loss_and_grad(
  model: Model,
  params: Params,
  x: Array,
  y: Array,
  num_examples: Array,
  key: Array,
  batch_size: Optional[int],
):
  """``(loss, grad)`` of one client's objective on a sampled minibatch (or the full data).

  A model with a training mode (``Model.train_apply``) is trained in it, its dropout drawn from
  :func:`step_rng` of ``key`` (step 0) and its new state dropped: an algorithm built on this
  one-gradient form keeps the model state where it was (``model_state="frozen"``)."""
  bx, by, bmask = sample_batch(key, x, y, num_examples, batch_size)
  if model.train_apply is not None:
    loss, g, _ = train_value_and_grad(model, params, bx, by, bmask, step_rng(key, 0))
    return loss, g
  return jax.value_and_grad(lambda p: client_loss(model, p, bx, by, bmask))(params)


def per_client_eval(model: Model, params: Params, x: Array, y: Array, mask: Array) -> dict:
  """Masked evaluation metrics of one client: loss, the model's metrics, and R^2 for regression."""
  out = model.apply(params, x)
  w = mask.astype(jnp.result_type(float))
  count = jnp.maximum(jnp.sum(w), 1.0)
  result = {"loss": jnp.sum(model.loss(out, y) * w) / count}
  for name, values in model.metrics(out, y).items():
    result[name] = jnp.sum(values * w) / count
  if model.task == "regression":
    yy = y.reshape(y.shape[0], -1).astype(w.dtype)
    pred = out.reshape(out.shape[0], -1).astype(w.dtype)
    mean_y = jnp.sum(yy * w[:, None], 0) / count
    sse = jnp.sum(((pred - yy) ** 2) * w[:, None])
    sst = jnp.sum(((yy - mean_y) ** 2) * w[:, None])
    result["r2"] = 1.0 - sse / jnp.maximum(sst, 1e-30)
  return result


class DenseLayer(NamedTuple):
  """A dense layer ``h = x W + b`` of a model, as :attr:`Model.dense_layers` declares it.

  Attributes:
    path: the kernel's keys in the parameter tree (``("Dense_0", "kernel")``).
    d_in: rows of the kernel (the input width).
    d_out: columns of the kernel (the output width).
  """

  path: tuple
  d_in: int
  d_out: int
