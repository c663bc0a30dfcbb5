"""Built-in models: ridge / linear regression, logistic and softmax regression, MLP, small CNN,
and an adapter for any user flax (linen) module."""

from __future__ import annotations

import math
import re
from typing import Callable, Optional, Sequence, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dro.common.checks import integer, is_real
from fedjax_dro.common.model import Model
from fedjax_dro.common.tuning import current, platform_defaults
from fedjax_dro.models.dense_layers import dense_layers, factored_apply
from fedjax_dro.models.linen_modes import draws_dropout, flax_train_apply, mode_flag


def _check_shape(shape, name, ndims=None):
  if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
    shape = (int(shape),)
  try:
    shape = tuple(shape)
  except TypeError:
    raise TypeError(f"{name} must be a tuple of positive integers, got {shape!r}") from None
  for d in shape:
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
      raise ValueError(f"{name} must be a tuple of positive integers, got {shape!r}")
  if ndims is not None and len(shape) not in ndims:
    raise ValueError(f"{name} must have {' or '.join(map(str, ndims))} dimensions, got {shape!r}")
  return tuple(int(d) for d in shape)


def check_l2(l2) -> float:
  """``l2`` as a Python float (NumPy scalars accepted), checked finite, non-negative and
  representable in the parameters' dtype."""
  if not is_real(l2) or not l2 >= 0 or l2 == float("inf"):
    raise ValueError(f"l2 must be a finite non-negative float, got {l2!r}")
  l2 = l2 if isinstance(l2, (int, float)) else float(l2)  # a NumPy scalar as a Python float
  finfo = jnp.finfo(_dtype())  # the dtype the penalty is computed in
  if 0 < l2 < float(finfo.tiny) or l2 > float(finfo.max):
    raise ValueError(
      f"l2 = {l2!r} is not representable in {finfo.dtype}, the models' parameter dtype "
      f"(normal values in [{float(finfo.tiny):.3g}, {float(finfo.max):.3g}], or 0)"
    )
  return l2


def _dtype():
  return jnp.float64 if jax.config.jax_enable_x64 else jnp.float32


def squared_error(out, y):
  """Per-example ``0.5 * ||out - y||^2`` (outputs and labels flattened per example)."""
  return 0.5 * jnp.sum((out.reshape(out.shape[0], -1) - y.reshape(y.shape[0], -1)) ** 2, axis=-1)


def _regression_metrics(out, y):
  return {"mse": 2.0 * squared_error(out, y)}


def linear_regression(
  num_features: int,
  *,
  l2: float = 0.0,
  fit_intercept: bool = True,
  num_outputs: Optional[int] = None,
  init_scale: float = 0.0,
) -> Model:
  """Linear regression with squared loss ``0.5 (x.w + b - y)^2`` (ridge when ``l2 > 0``).

  Args:
    num_features: ``d``, the length of each example's feature vector.
    l2: ridge coefficient: every client objective gains ``l2/2 ||params||^2`` (all parameters,
      the intercept included); default 0.
    fit_intercept: whether the model has an intercept ``b`` (default True).
    num_outputs: ``None`` (default): a scalar output, ``params = {"w": [d], "b": []}``; an integer
      ``k``: ``k`` outputs, ``params = {"w": [d, k], "b": [k]}``.
    init_scale: standard deviation of the normal initial weights (default 0: zeros).

  Returns:
    A regression :class:`~fedjax_dro.common.model.Model` (per-example metric ``mse``).
  """
  integer(num_features, "num_features")
  l2 = check_l2(l2)
  if num_outputs is not None:
    integer(num_outputs, "num_outputs")
  if not isinstance(fit_intercept, bool):
    raise TypeError(f"fit_intercept must be a bool, got {fit_intercept!r}")
  if not is_real(init_scale) or not (0 <= init_scale < float("inf")):
    raise ValueError(f"init_scale must be a finite non-negative float, got {init_scale!r}")
  init_scale = init_scale if isinstance(init_scale, (int, float)) else float(init_scale)

  def init(key):
    shape = (num_features,) if num_outputs is None else (num_features, num_outputs)
    params = {"w": init_scale * jax.random.normal(key, shape, _dtype())}
    if fit_intercept:
      params["b"] = jnp.zeros(() if num_outputs is None else (num_outputs,), _dtype())
    return params

  def apply(params, x):
    out = x.reshape(x.shape[0], -1) @ params["w"]
    return out + params["b"] if fit_intercept else out

  return Model(
    init,
    apply,
    squared_error,
    _regression_metrics,
    task="regression",
    l2=float(l2),
    name=f"linear_regression(d={num_features}, l2={l2})",
    identity=f"linear_regression({num_features}, fit_intercept={fit_intercept}, "
    f"num_outputs={num_outputs}, init_scale={init_scale!r})",
    input_size=int(num_features),
  )


def _binary_loss(logits, y):
  return optax.sigmoid_binary_cross_entropy(logits, y.astype(logits.dtype))


def _binary_metrics(logits, y):
  return {"accuracy": ((logits > 0).astype(jnp.int32) == y.astype(jnp.int32)).astype(logits.dtype)}


def logistic_regression(num_features: int, *, l2: float = 0.0) -> Model:
  """Binary logistic regression; labels in {0, 1}.

  Args:
    num_features: ``d``, the length of each example's feature vector.
    l2: coefficient of ``l2/2 ||params||^2`` added to every client objective (default 0).

  Returns:
    A classification :class:`~fedjax_dro.common.model.Model` (one logit, sigmoid cross-entropy).
  """
  integer(num_features, "num_features")
  l2 = check_l2(l2)

  def init(key):
    del key
    return {"w": jnp.zeros((num_features,), _dtype()), "b": jnp.zeros((), _dtype())}

  def apply(params, x):
    return x.reshape(x.shape[0], -1) @ params["w"] + params["b"]

  return Model(
    init,
    apply,
    _binary_loss,
    _binary_metrics,
    task="classification",
    l2=float(l2),
    name=f"logistic_regression(d={num_features}, l2={l2})",
    input_size=int(num_features),
  )


def _softmax_loss(logits, y):
  """Cross-entropy with integer labels: ``logsumexp(logits) - logits[y]`` (stable; the same value
  as optax's ``softmax_cross_entropy_with_integer_labels``, ~15% cheaper under vmap on CPU)."""
  picked = jnp.take_along_axis(logits, y.astype(jnp.int32)[..., None], axis=-1)[..., 0]
  return jax.nn.logsumexp(logits, axis=-1) - picked


def _softmax_metrics(logits, y):
  return {"accuracy": (jnp.argmax(logits, -1) == y.astype(jnp.int32)).astype(logits.dtype)}


def head_form(num_classes: int, platform: Optional[str] = None) -> str:
  """How ``models.softmax_regression(..., head="auto")`` reads its weights: ``"transposed"`` or
  ``"plain"``.

  ``"transposed"`` computes the logits from a transposed copy of ``w`` (``[k, d]``) held behind
  ``lax.optimization_barrier``: the model, its parameters and its results are the same, but
  the weight gradient of the backward pass comes out as ``(g^T x)^T``, with the class dimension
  leading, which XLA's CPU backend runs faster under ``vmap`` when ``k`` is small (without the
  barrier its simplifier folds the transposes away). It is chosen for at most
  ``Tuning.head_transposed_max_classes`` classes: the traced program's tuning, or with
  ``platform`` given that platform's default (measured: ``docs/benchmarks/head.md``).

  Args:
    num_classes: ``k``.
    platform: ``"cpu"``, ``"gpu"``, ... (default: the traced program's tuning).
  """
  tuning = current() if platform is None else platform_defaults(platform)
  return "transposed" if num_classes <= tuning.head_transposed_max_classes else "plain"


HEAD_FORMS = ("auto", "plain", "transposed")


def softmax_regression(
  num_features: int, num_classes: int, *, l2: float = 0.0, head: str = "auto"
) -> Model:
  """Multinomial logistic regression; integer labels in ``[0, num_classes)``.

  Args:
    num_features: ``d``, the length of each example's feature vector.
    num_classes: ``k``, the number of classes (outputs).
    l2: coefficient of ``l2/2 ||params||^2`` added to every client objective (default 0).
    head: how the product with ``w`` (``[d, k]``) is computed, with identical parameters and
      results: ``"plain"`` (``x @ w``), ``"transposed"`` (from a transposed copy of ``w`` behind
      an optimization barrier; see :func:`head_form`) or ``"auto"`` (default): the form measured
      faster on the platform for ``k`` classes, chosen when the model is traced.

  Returns:
    A classification :class:`~fedjax_dro.common.model.Model` (softmax cross-entropy).
  """
  integer(num_features, "num_features")
  integer(num_classes, "num_classes")
  l2 = check_l2(l2)
  if not isinstance(head, str) or head not in HEAD_FORMS:
    raise ValueError(f"head must be one of {HEAD_FORMS}, got {head!r}")

  def init(key):
    del key
    return {
      "w": jnp.zeros((num_features, num_classes), _dtype()),
      "b": jnp.zeros((num_classes,), _dtype()),
    }

  def apply(params, x):
    x = x.reshape(x.shape[0], -1)
    form = head_form(num_classes) if head == "auto" else head  # resolved when traced
    if form == "transposed":
      w_t = jax.lax.optimization_barrier(params["w"].T)
      return jnp.einsum("nd,kd->nk", x, w_t) + params["b"]
    return x @ params["w"] + params["b"]

  return Model(
    init,
    apply,
    _softmax_loss,
    _softmax_metrics,
    task="classification",
    l2=float(l2),
    name=f"softmax_regression(d={num_features}, k={num_classes}"
    + ("" if head == "auto" else f", head={head}")
    + ")",
    input_size=int(num_features),
  )


class _MLP(nn.Module):
  hidden: Sequence[int]
  num_outputs: int

  @nn.compact
  def __call__(self, x):
    x = x.reshape(x.shape[0], -1)
    for width in self.hidden:
      x = nn.relu(nn.Dense(width, param_dtype=_dtype())(x))
    return nn.Dense(self.num_outputs, param_dtype=_dtype())(x)


class _PatchConv(nn.Module):
  """3x3 'SAME' convolution written as 9 shifted slices and one contraction (im2col).

  The parameters are those of ``nn.Conv(features, (3, 3))`` (``kernel [3, 3, c, f]``, ``bias
  [f]``). Under ``vmap`` over clients with per-client weights the contraction is a batched
  matmul, where ``lax.conv`` becomes a grouped convolution that CPUs run far slower.
  """

  features: int

  @nn.compact
  def __call__(self, x):
    c = x.shape[-1]
    kernel = self.param(
      "kernel", nn.initializers.lecun_normal(), (3, 3, c, self.features), _dtype()
    )
    bias = self.param("bias", nn.initializers.zeros_init(), (self.features,), _dtype())
    b, h, w = x.shape[:3]
    xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    patches = jnp.stack([xp[:, i : i + h, j : j + w, :] for i in range(3) for j in range(3)], 3)
    out = patches.reshape(b * h * w, 9 * c) @ kernel.reshape(9 * c, self.features)
    return out.reshape(b, h, w, self.features) + bias


def _max_pool2(x):
  """2x2 max-pool with stride 2 ('VALID', as ``nn.max_pool``) as a reshape and a max: the same
  values, and under ``vmap`` cheaper than ``reduce_window`` on CPU."""
  b, h, w, f = x.shape
  x = x[:, : h // 2 * 2, : w // 2 * 2]
  return x.reshape(b, h // 2, 2, w // 2, 2, f).max(axis=(2, 4))


CONV_FORMS = ("auto", "lax", "patches")


def conv_form(platform: Optional[str] = None, dtype=None) -> str:
  """The convolution form ``models.cnn(..., conv="auto")`` computes with, ``"lax"`` or
  ``"patches"``: ``Tuning.conv`` (``conv_bf16`` for bfloat16 and float16 compute) of the traced
  program's tuning, or with ``platform`` given that platform's default (the faster form with
  per-client weights side by side under ``vmap``, measured: ``docs/benchmarks/conv.md``;
  platforms without measurements, e.g. TPU, get ``"lax"``, XLA's native convolution).

  Args:
    platform: ``"cpu"``, ``"gpu"``, ... (default: the traced program's tuning; ``"cuda"`` and
      ``"rocm"`` count as ``"gpu"``).
    dtype: the compute dtype (default: the default float dtype).
  """
  tuning = current() if platform is None else platform_defaults(platform)
  dtype = jnp.dtype(_dtype() if dtype is None else dtype)
  low = dtype in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
  return tuning.conv_bf16 if low else tuning.conv


class _CNN(nn.Module):
  num_outputs: int
  features: Sequence[int] = (32, 64)
  dense: Optional[int] = 128
  conv: str = "auto"

  @nn.compact
  def __call__(self, x):
    if x.ndim == 3:
      x = x[..., None]
    form = self.conv
    if form == "auto":  # resolved when traced: the platform and the dtype computed in
      floating = jnp.issubdtype(x.dtype, jnp.floating)
      form = conv_form(dtype=x.dtype if floating else None)
    for k, f in enumerate(self.features):
      if form == "patches":
        x = _PatchConv(f, name=f"Conv_{k}")(x)
      else:
        x = nn.Conv(f, (3, 3), param_dtype=_dtype(), name=f"Conv_{k}")(x)
      x = _max_pool2(nn.relu(x))
    x = x.reshape(x.shape[0], -1)
    if self.dense:
      x = nn.relu(nn.Dense(self.dense, param_dtype=_dtype(), name="Dense_0")(x))
    return nn.Dense(self.num_outputs, param_dtype=_dtype(), name="Dense_1")(x)


_LOSSES = {
  "softmax_cross_entropy": (_softmax_loss, _softmax_metrics, "classification"),
  "sigmoid_cross_entropy": (_binary_loss, _binary_metrics, "classification"),
  "squared_error": (squared_error, _regression_metrics, "regression"),
}


def loss_and_task(loss, metrics, task):
  """``(loss_fn, metrics_fn, task)`` of an adapter's ``loss`` (a name of ``_LOSSES`` or a
  callable), ``metrics`` (None: the loss's defaults) and ``task`` (None: the loss's)."""
  if isinstance(loss, str):
    if loss not in _LOSSES:
      raise ValueError(f"loss must be one of {sorted(_LOSSES)} or a callable, got {loss!r}")
    loss_fn, default_metrics, default_task = _LOSSES[loss]
  elif callable(loss):
    loss_fn, default_metrics, default_task = loss, (lambda o, y: {}), "regression"
  else:
    raise TypeError(f"loss must be a string or a callable, got {type(loss).__name__}")
  task = task or default_task
  if task not in ("classification", "regression"):
    raise ValueError(f"task must be 'classification' or 'regression', got {task!r}")
  return loss_fn, metrics or default_metrics, task


def from_flax(
  module: nn.Module,
  sample_input,
  *,
  loss: Union[str, Callable] = "softmax_cross_entropy",
  metrics: Optional[Callable] = None,
  task: Optional[str] = None,
  l2: float = 0.0,
  name: Optional[str] = None,
) -> Model:
  """Adapts a flax.linen module to a :class:`Model`.

  Training mode (dropout, batch statistics) follows Flax's ImageNet example: ``__call__`` takes a
  ``train`` keyword (``nn.BatchNorm(use_running_average=not train)``,
  ``nn.Dropout(rate, deterministic=not train)``), or a ``deterministic`` keyword (False in
  training, as the zoo's GPT-2 and DistilBERT). ``Model.apply`` is then the inference mode
  (``train=False``) and ``Model.train_apply(params, x, mask, rng)`` the training mode
  (``train=True``, dropout from ``rngs={"dropout": rng}``, ``batch_stats`` mutable): its
  outputs and the updated ``{"batch_stats": ...}`` (``{}`` without batch statistics). A module
  with batch statistics has the parameters ``{"params": ..., "batch_stats": ...}`` and
  ``Model.state_keys == ("batch_stats",)``; when its ``__call__`` also takes a ``mask`` keyword
  it is passed the minibatch's valid rows ``[m]`` in training (for
  ``nn.BatchNorm(...)(x, mask=...)``: statistics of the valid rows only, ``Model.state_masked``).
  A module whose training mode neither draws dropout nor holds batch statistics, or that has no
  such keyword, is adapted as a deterministic function (no ``train_apply``; its dense layers
  may then be kept in factored form, :mod:`fedjax_dro.experimental.factored`). Variable
  collections other than ``params`` and ``batch_stats`` are refused, and so are batch
  statistics without a ``train`` (or ``deterministic``) keyword.

  Args:
    module: a ``flax.linen.Module`` whose ``__call__(x)`` maps a batch of inputs to outputs.
    sample_input: a batch ``[m, *feature_shape]`` used to initialise parameters.
    loss: ``"softmax_cross_entropy"`` (integer labels), ``"sigmoid_cross_entropy"``,
      ``"squared_error"`` or a callable ``(outputs, y) -> per-example loss``.
    metrics: callable ``(outputs, y) -> dict of per-example metrics`` (defaults follow ``loss``).
    task: "classification" or "regression" (defaults follow ``loss``).
    l2: coefficient of ``l2/2 ||params||^2`` added to every client objective (default 0).
    name: the model's name in results (default: the module's class name).

  Returns:
    A :class:`~fedjax_dro.common.model.Model` whose parameters are the module's ``params``
    (with batch statistics: ``{"params": ..., "batch_stats": ...}``).
  """
  if not isinstance(module, nn.Module):
    raise TypeError(f"module must be a flax.linen.Module, got {type(module).__name__}")
  loss_fn, metrics_fn, task = loss_and_task(loss, metrics, task)
  l2 = check_l2(l2)
  sample = np.asarray(sample_input)
  if sample.dtype.kind not in "biuf":
    raise TypeError(f"sample_input must be a real numeric array, got dtype {sample.dtype}")
  if sample.ndim < 1 or sample.shape[0] < 1:
    raise ValueError(f"sample_input must be a batch [m >= 1, *feature_shape], got {sample.shape}")
  sample_input = jnp.asarray(sample_input)
  flag, takes_mask = mode_flag(module)
  eval_mode = {} if flag is None else {flag: flag == "deterministic"}
  shapes = jax.eval_shape(
    lambda k: module.init(k, sample_input, **eval_mode), jax.random.PRNGKey(0)
  )
  collections = sorted(shapes)
  other = [c for c in collections if c not in ("params", "batch_stats")]
  if other:
    raise ValueError(
      f"from_flax: the module {type(module).__name__} holds the variable collections {other} "
      "beside 'params' and 'batch_stats'; the simulator's models carry trainable parameters and "
      "batch statistics only (drop the variables of these collections, or sow them only in a "
      "call the model does not make)"
    )
  stateful = "batch_stats" in collections
  if stateful and flag is None:
    raise ValueError(
      f"from_flax: the module {type(module).__name__} holds batch statistics ('batch_stats') but "
      "its __call__ takes no `train` keyword: write it as Flax's ImageNet example does, "
      "`__call__(self, x, train: bool = False)` with `nn.BatchNorm(use_running_average=not "
      "train)` (and `nn.Dropout(rate, deterministic=not train)`), so that the model can run in "
      "training mode (batch statistics of the minibatch, updated running averages) and in "
      "inference mode (the running averages)"
    )
  if not stateful and flag is not None and not draws_dropout(module, flag, shapes, sample_input):
    flag = None  # a training mode that is the inference mode: the stateless form below
  if flag is None:
    # Compiled as one program: run op by op, every initializer of another shape compiles its own
    # random-number program (the digits CNN: 2.1 s on first use, 1.4 s as one program; the values
    # are bit for bit those of the op-by-op init, tested).
    @jax.jit
    def init(key):
      return module.init(key, sample_input)["params"]

    def apply(params, x):
      return module.apply({"params": params}, x)

    layers = dense_layers(module, init, sample_input)
    train_apply = None
  else:
    train_apply, layers = flax_train_apply(module, flag, stateful, takes_mask), ()
    keys = ("params", "batch_stats") if stateful else ("params",)

    @jax.jit
    def init(key):
      variables = module.init(key, sample_input, **eval_mode)
      return {k: variables[k] for k in keys} if stateful else variables["params"]

    def apply(params, x):
      return module.apply(params if stateful else {"params": params}, x, **eval_mode)

  return Model(
    init,
    apply,
    loss_fn,
    metrics_fn,
    task=task,
    l2=float(l2),
    name=name or type(module).__name__,
    identity=_flax_identity(module, sample_input, loss, metrics),
    dense_layers=layers,
    factored_apply=factored_apply(module) if layers else None,
    train_apply=train_apply,
    state_keys=("batch_stats",) if stateful else (),
    state_masked=bool(stateful and takes_mask),
  )


def _flax_identity(module, sample_input, loss, metrics) -> str:
  """``from_flax(<module and its attributes>, ...)`` without memory addresses."""

  def shown(obj):
    text = obj if isinstance(obj, str) else getattr(obj, "__qualname__", None) or repr(obj)
    return re.sub(r" at 0x[0-9a-fA-F]+", "", " ".join(str(text).split()))

  where = f"{sample_input.dtype}{list(sample_input.shape[1:])}"
  return f"from_flax({shown(repr(module))}, {where}, loss={shown(loss)}, metrics={shown(metrics)})"


def mlp(
  input_shape: Sequence[int],
  num_classes: int,
  hidden: Sequence[int] = (200, 200),
  *,
  l2: float = 0.0,
) -> Model:
  """Fully connected ReLU network (e.g. the EMNIST-sized 784-200-200-62).

  Args:
    input_shape: the shape of one example (flattened before the first layer).
    num_classes: ``k``, the number of classes (outputs).
    hidden: widths of the hidden ReLU layers (default ``(200, 200)``).
    l2: coefficient of ``l2/2 ||params||^2`` added to every client objective (default 0).

  Returns:
    A classification :class:`~fedjax_dro.common.model.Model` (softmax cross-entropy).
  """
  integer(num_classes, "num_classes")
  input_shape = _check_shape(input_shape, "input_shape")
  hidden = _check_shape(hidden, "hidden")
  return from_flax(
    _MLP(tuple(hidden), num_classes),
    jnp.zeros((1,) + tuple(input_shape), _dtype()),
    l2=l2,
    name=f"mlp({tuple(input_shape)}-{'-'.join(map(str, hidden))}-{num_classes})",
  )._replace(input_size=math.prod(input_shape))


def cnn(
  input_shape: Sequence[int],
  num_classes: int,
  *,
  features: Sequence[int] = (32, 64),
  dense: Optional[int] = 128,
  l2: float = 0.0,
  conv: str = "auto",
) -> Model:
  """Small CNN: 3x3 conv + ReLU + 2x2 max-pool blocks, an optional dense layer, a linear head.

  ``input_shape`` is ``(height, width)`` or ``(height, width, channels)``; ``dense=None`` puts the
  head right after the last block (``features=(c1, c2), dense=None`` is the "two-layer CNN" of
  the FGDRO reproduction). ``conv`` picks how the convolutions are computed, with identical
  parameters and results: ``"lax"`` (``lax.conv``; under ``vmap`` over clients with per-client
  weights a grouped convolution), ``"patches"`` (9 shifted slices and a matmul: under ``vmap``
  a batched matmul) or ``"auto"`` (default): the form measured faster on the platform and in the
  compute dtype, chosen when the model is traced (:func:`conv_form`; e.g. on an H100, patches in
  float32 and ``lax.conv`` in bf16). The model's name records ``auto`` and what it resolves to on
  the platform it was built on.

  Args:
    input_shape: ``(height, width)`` or ``(height, width, channels)`` of one image; height and
      width must be at least ``2 ** len(features)``.
    num_classes: ``k``, the number of classes (outputs).
    features: output channels of each conv block (default ``(32, 64)``).
    dense: width of the dense ReLU layer before the head, or ``None`` for none (default 128).
    l2: coefficient of ``l2/2 ||params||^2`` added to every client objective (default 0).
    conv: ``"auto"`` (default), ``"lax"`` or ``"patches"``, as above.

  Returns:
    A classification :class:`~fedjax_dro.common.model.Model` (softmax cross-entropy).
  """
  integer(num_classes, "num_classes")
  input_shape = _check_shape(input_shape, "input_shape", ndims=(2, 3))
  features = _check_shape(features, "features")
  smallest = 2 ** len(features)
  if min(input_shape[:2]) < smallest:
    raise ValueError(
      f"input_shape {input_shape} is too small for {len(features)} conv + 2x2 max-pool blocks "
      f"(each halves height and width): height and width must be >= {smallest}"
    )
  if dense is not None:
    integer(dense, "dense")
  if not isinstance(conv, str) or conv not in CONV_FORMS:
    raise ValueError(f"conv must be one of {CONV_FORMS}, got {conv!r}")
  form = conv
  if conv == "auto":
    platform = jax.default_backend()
    f32, bf16 = conv_form(platform), conv_form(platform, jnp.bfloat16)
    form = f"auto: {f32}" if f32 == bf16 else f"auto: {f32}, {bf16} in bf16"
    form += f" on {platform}"
  return from_flax(
    _CNN(num_classes, tuple(features), dense, conv),
    jnp.zeros((1,) + tuple(input_shape), _dtype()),
    l2=l2,
    name=f"cnn({tuple(input_shape)}, k={num_classes}, {form})",
  )._replace(input_size=math.prod(input_shape))
