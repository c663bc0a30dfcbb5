"""The tuning of a run: every performance choice that changes a compiled program, as one value.

A choice here changes how a round is computed, never what it computes: each form is tested
against the plain per-client reference loop. :class:`Tuning` holds them all; a field left
``None`` takes the platform's default (:func:`platform_defaults`, each rule with a link to the
measurement that set it, ``docs/benchmarks/tuning.md``). :func:`fedjax_dro.run`,
:func:`fedjax_dro.sweep` and :func:`fedjax_dro.compile_rounds` take ``tuning=``, resolve it once
per run (:func:`resolve`: the fields given there, then those of an enclosing :func:`tuned` block,
then the platform's defaults), key their program caches on the resolved value and trace their
programs inside :func:`scope` of it; the round mechanics read :func:`current` while they are
traced, so a compiled program is a function of the value its cache keys on.

:func:`tuned` (and the named shorthands built on it: ``core.ragged.local_folded_step``, ...) is
sugar over the one context variable that holds the requested tuning: programs traced inside the
block (and runs started inside it) use its fields unless their own ``tuning=`` says otherwise.

Example::

    fd.run(alg, data, rounds=100, tuning=fd.Tuning(folded_step=True))
    with fd.tuned(memory_budget=2**30):
      fd.sweep(alg, data, grid=..., rounds=100)
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import types
from typing import Optional

import jax

from fedjax_dro.common.checks import is_int

CONV_FORMS = ("lax", "patches")


def _check_flag(value, name):
  if value is not None and not isinstance(value, bool):
    raise ValueError(f"Tuning.{name} must be True, False or None (the platform's), got {value!r}")


def _check_count(value, name, *, minimum=1, optional=True):
  if value is None and optional:
    return
  ok = is_int(value) and value >= minimum
  if not ok:
    raise ValueError(
      f"Tuning.{name} must be an integer >= {minimum}"
      + (" or None" if optional else "")
      + f", got {value!r}"
    )


@dataclasses.dataclass(frozen=True)
class Tuning:
  """Every performance choice that changes a compiled program (None: the platform's default).

  Attributes:
    memory_budget: bytes the ``"auto"`` backend plans one round's client work into; None: half
      the device's free memory when the program is traced
      (:func:`fedjax_dro.core.clients.memory_budget`).
    folded_step: ``local_epochs`` local SGD with participants side by side masks the steps of
      the participants that are done by folding a zero step size into the loss (one exit test
      the chunk shares) instead of selecting between each client's old and new weights
      (:func:`fedjax_dro.core.ragged.epoch_loop`).
    step_block: local steps between two tests of the ``local_epochs`` loop's exit condition.
    epoch_groups: the sampled participants of a ``local_epochs`` round run sorted by their step
      counts in this many chunks (1: the backend's own plan, unsorted).
    epoch_chunk: instead of ``epoch_groups``, the participants per step-sorted chunk.
    conv: the built-in CNN's convolution form in float32 / float64 compute, ``"lax"`` or
      ``"patches"`` (``models.cnn(conv="auto")``).
    conv_bf16: the same in bfloat16 / float16 compute.
    head_transposed_max_classes: ``models.softmax_regression(head="auto")`` reads its weights
      transposed for at most this many classes (0: never).
    canonical_conv: a model's convolutions, forward and backward, computed on operands laid out
      explicitly in canonical layout (:mod:`fedjax_dro.common.conv`) wherever the simulator
      differentiates it: XLA:CPU then runs the gradients' convolutions inside loops at its
      top-level speed.
    factored_dense: experimental: local SGD keeps a model's wide dense layers as ``W_0 + A^T
      G`` over the local steps (:mod:`fedjax_dro.experimental.factored`); on no platform yet.
    memory_share: rows of a vmapped sweep that run side by side on each device (set by
      :func:`fedjax_dro.sweep`): each gets this share of the memory budget and cache target.
    client_shards: devices the client axis is split over (set by the engine from the mesh).
  """

  memory_budget: Optional[int] = None
  folded_step: Optional[bool] = None
  step_block: Optional[int] = None
  epoch_groups: Optional[int] = None
  epoch_chunk: Optional[int] = None
  conv: Optional[str] = None
  conv_bf16: Optional[str] = None
  head_transposed_max_classes: Optional[int] = None
  factored_dense: Optional[bool] = None
  canonical_conv: Optional[bool] = None
  memory_share: Optional[int] = None
  client_shards: Optional[int] = None

  def __post_init__(self):
    _check_count(self.memory_budget, "memory_budget", minimum=0)
    _check_flag(self.folded_step, "folded_step")
    _check_flag(self.factored_dense, "factored_dense")
    _check_flag(self.canonical_conv, "canonical_conv")
    for name in ("step_block", "epoch_groups", "epoch_chunk", "memory_share", "client_shards"):
      _check_count(getattr(self, name), name)
    _check_count(self.head_transposed_max_classes, "head_transposed_max_classes", minimum=0)
    for name in ("conv", "conv_bf16"):
      value = getattr(self, name)
      if value is not None and value not in CONV_FORMS:
        raise ValueError(f"Tuning.{name} must be one of {CONV_FORMS} or None, got {value!r}")

  def replace(self, **fields) -> "Tuning":
    """A copy with ``fields`` replaced."""
    return dataclasses.replace(self, **fields)


# The fields a platform decides; the others are None (no choice: memory_budget, epoch_chunk) or
# set by the engine (memory_share, client_shards: 1 by default).
PLATFORM_FIELDS = (
  "folded_step",
  "step_block",
  "epoch_groups",
  "conv",
  "conv_bf16",
  "head_transposed_max_classes",
  "factored_dense",
  "canonical_conv",
)


def _platform(*values) -> Tuning:
  """The tuning with the values of :data:`PLATFORM_FIELDS`, in its order."""
  return Tuning(**dict(zip(PLATFORM_FIELDS, values, strict=True)))


# The defaults of each platform; every row's measurement is on docs/benchmarks/tuning.md.
# folded_step: on where a masked step costs a full one (GPU: FEMNIST-sized round 18.7 -> 14.3 ms).
# step_block: 1 (a block of k steps costs more in masked steps than it saves in round trips).
# epoch_groups: 2 on GPU (step-sorted chunks: 22.8 -> 18.7 ms), 1 (the backend's plan) on CPU.
# conv / conv_bf16: the faster form of the built-in CNN with per-client weights under vmap.
# head_transposed_max_classes: the most classes for which the transposed head was faster.
# factored_dense: faster on no platform measured yet (experimental).
# canonical_conv: on the CPU, a ResNet-18-GN round 8-20x faster (benchmarks/conv_loops.py); XLA's
# GPU layouts are cuDNN's already (unmeasured there: off).
_DEFAULTS = types.MappingProxyType(
  {
    # folded_step, step_block, epoch_groups, conv, conv_bf16, head_transposed_max_classes,
    # factored_dense, canonical_conv
    "cpu": _platform(False, 1, 1, "patches", "patches", 16, False, True),
    "gpu": _platform(True, 1, 2, "patches", "lax", 0, False, False),
  }
)
# a platform without measurements (e.g. TPU): XLA's native forms, nothing folded or sorted
_UNMEASURED = _platform(False, 1, 1, "lax", "lax", 0, False, False)


def platform_name(platform: Optional[str] = None) -> str:
  """``platform`` (default ``jax.default_backend()``) with ``cuda`` and ``rocm`` named ``gpu``."""
  platform = platform or jax.default_backend()
  if not isinstance(platform, str):
    raise TypeError(f"platform must be a string such as 'cpu' or 'gpu', got {platform!r}")
  return "gpu" if platform in ("cuda", "rocm") else platform


def platform_defaults(platform: Optional[str] = None) -> Tuning:
  """The tuning of ``platform`` (default ``jax.default_backend()``), every platform field set."""
  return _DEFAULTS.get(platform_name(platform), _UNMEASURED)


def merge(*tunings: Optional[Tuning]) -> Tuning:
  """The fields set in any of ``tunings``, the later ones winning (None entries skipped)."""
  out = {}
  for t in tunings:
    if t is None:
      continue
    if not isinstance(t, Tuning):
      raise TypeError(f"tuning must be a fedjax_dro.Tuning or None, got {type(t).__name__}")
    out.update({f.name: v for f in dataclasses.fields(t) if (v := getattr(t, f.name)) is not None})
  return Tuning(**out)


def resolve(tuning: Optional[Tuning] = None, platform: Optional[str] = None) -> Tuning:
  """The tuning a run compiles with: ``tuning``'s fields over those of an enclosing
  :func:`tuned` block, the rest from :func:`platform_defaults`; ``memory_share`` and
  ``client_shards`` 1 unless set. Equal values compile equal programs (caches key on it)."""
  given = merge(_REQUESTED.get(), tuning)
  base = platform_defaults(platform)
  fields = {name: getattr(base, name) for name in PLATFORM_FIELDS}
  fields.update(memory_share=1, client_shards=1)
  return merge(Tuning(**fields), given)


# The one context variable: the tuning requested by the enclosing tuned() blocks, or inside an
# engine's scope() the resolved tuning of the program being traced.
_REQUESTED: contextvars.ContextVar = contextvars.ContextVar("fedjax_dro_tuning", default=None)


def current() -> Tuning:
  """The resolved tuning of the program being traced (:func:`scope`), else the resolution of the
  enclosing :func:`tuned` blocks on the default platform."""
  return resolve()


@contextlib.contextmanager
def scope(resolved: Tuning):
  """Programs traced inside read ``resolved`` (the engine's: :func:`resolve` of a run's
  ``tuning=``)."""
  if not isinstance(resolved, Tuning):
    raise TypeError(f"scope needs a Tuning, got {type(resolved).__name__}")
  token = _REQUESTED.set(resolved)
  try:
    yield resolved
  finally:
    _REQUESTED.reset(token)


@contextlib.contextmanager
def tuned(tuning: Optional[Tuning] = None, **fields):
  """Within the block, runs and programs traced use ``tuning``'s and ``fields``' choices (see
  :class:`Tuning`) over the enclosing ones, unless a run's own ``tuning=`` sets them. A field
  given as ``None`` here is left as the enclosing block has it."""
  requested = merge(_REQUESTED.get(), tuning, Tuning(**fields))
  with scope(requested):
    yield requested


@contextlib.contextmanager
def switched(shorthand: str, **field):
  """:func:`tuned` of one boolean field (``factored_dense=enabled``) for the named shorthand that
  sets it (``shorthand(enabled)``): a value other than True or False is refused, naming it."""
  (enabled,) = field.values()
  if not isinstance(enabled, bool):
    raise ValueError(f"{shorthand} needs True or False, got {enabled!r}")
  with tuned(**field):
    yield


@contextlib.contextmanager
def reset(*names: str):
  """Within the block, the fields ``names`` are unset (the platform's default again)."""
  known = {f.name for f in dataclasses.fields(Tuning)}
  unknown = [n for n in names if n not in known]
  if unknown:
    raise ValueError(f"unknown Tuning fields {unknown}; known: {sorted(known)}")
  value = _REQUESTED.get() or Tuning()
  with scope(dataclasses.replace(value, **{n: None for n in names})):
    yield
