"""DRO problems: the dual regularizer psi and its set Lambda, one object (a pytree) each.

The distributionally robust problem of SCAFF-PD (Yu, Karimireddy, Ma, Jordan, "Scaff-PD:
Communication Efficient Fair and Robust Federated Learning", arXiv:2307.13381, eq. (1.1))::

    min_x max_{lambda in Lambda}  sum_i lambda_i f_i(x) - psi(lambda)

is fixed by the pair (psi, Lambda). Following the split of problems and solvers of OTT-JAX
(Cuturi, Meng-Papaxanthos, Tian, Bunne, Davis, Teboul, "Optimal Transport Tools (OTT): A JAX
Toolbox for all things Wasserstein", arXiv:2201.12324), each pair is one class here, and the
federated algorithms (SCAFF-PD, AFL, DRFA) and the centralized saddle-point solver
(:mod:`fedjax_dro.solvers.saddle`) only call its methods:

``value(lam)``
    psi(lambda) (the set constraint is not part of it).
``best_response(losses)``
    a maximizer of ``<lambda, losses> - psi(lambda)`` over Lambda.
``robust_objective(losses)``
    that maximum, ``max_{lambda in Lambda} <lambda, losses> - psi(lambda)``.
``prox(lam, s, sigma)``
    the dual prox step ``argmin_{l in Lambda} psi(l) - <s, l> + ||l - lam||^2 / (2 sigma)`` of
    SCAFF-PD (Algorithm 1, eq. (4.1)), computed by the exact routines of
    :mod:`fedjax_dro.solvers.simplex`.
``projected_ascent(lam, s, sigma)``
    DRFA's dual step ``Proj_Lambda(lam + sigma (s - grad psi(lam)))`` (Deng, Kamani, Mahdavi,
    "Distributionally Robust Federated Averaging", arXiv:2102.12660, Algorithm 1), for a psi
    that is smooth on a Lambda inside the simplex.

The problems (each with its factory):

:func:`chi2` ``(rho)``
    psi = (rho / (2n)) sum_i (n lambda_i - 1)^2 on the simplex (SCAFF-PD eq. (3.3); rho = 0 is
    the minimax problem of Mohri, Sivek, Suresh, "Agnostic Federated Learning",
    arXiv:1902.00146).
:func:`cvar` ``(alpha)``
    psi = 0 on the capped simplex {lambda_i <= 1 / (alpha n)}: the conditional value-at-risk of
    the losses at level alpha (Rockafellar, Uryasev, "Optimization of conditional
    value-at-risk", Journal of Risk 2000).
:func:`qffl` ``(q, norm="lp")``
    Lambda = R^n, psi = sum_i |lambda_i|^(1 + 1/q) (``norm="l2"``: ||lambda||_2^(1 + 1/q));
    its robust objective is the q-FFL loss of Li, Sanjabi, Beirami, Smith, "Fair Resource
    Allocation in Federated Learning", arXiv:1905.10497, up to a constant
    (:mod:`fedjax_dro.solvers.simplex` derives it).
:func:`kl` ``(lam)``
    psi = lam sum_i lambda_i log(n lambda_i) = lam KL(lambda || uniform) on the simplex, whose
    robust objective is ``lam log((1/n) sum_i exp(f_i / lam))`` and best response the softmax
    weights ``softmax(f / lam)``: the KL-regularized group DRO problem of Guo, Yang,
    "Communication-Efficient Federated Group Distributionally Robust Optimization",
    arXiv:2410.06369, eq. (5) (FGDRO-KL; also DR-DSGD's, Ben Issaid, Elgabli, Bennis,
    arXiv:2208.13810). It has no closed-form Euclidean prox, so the algorithms built on
    :meth:`~DROProblem.prox` refuse it; the saddle-point solver takes it.

The problem's parameter (``rho``, ``alpha``, ``q``, ``lam``) is a pytree leaf: it may be a traced
array, so ``jax.jit`` and ``jax.vmap`` over it work (a sweep of an algorithm's hyper-parameter
rebuilds the problem inside the round with :meth:`~DROProblem.from_hparams`). ``norm`` is static.
A concrete parameter is checked by the factories and by every method (``ValueError`` naming it).
Strings are still accepted where a problem is expected: :func:`as_problem` (the name and its
parameter) and :func:`resolve` (the name at the algorithm's default parameter) convert them once.
"""

from __future__ import annotations

from typing import Any, ClassVar, Dict, Optional, Tuple

import flax.struct
import jax
import jax.numpy as jnp

from fedjax_dro.core.hparams import HParam
from fedjax_dro.solvers import simplex as _sx
from fedjax_dro.solvers.validation import concrete_or_none as _concrete_or_none


class DROProblem:
  """The base of the DRO problems (see the module docstring). A subclass is a
  ``flax.struct.dataclass`` whose field ``param_name`` holds the problem's one parameter (the
  built-in ones are declared with ``_problem``, which sets the class attributes below)."""

  name: ClassVar[str]  # the string form ("chi2", ...), recorded in Algorithm.config
  param_name: ClassVar[str]  # the parameter's field and hyper-parameter name
  default: ClassVar[float]  # the parameter's default
  doc: ClassVar[str]  # one-line description of the parameter
  minimum: ClassVar[Optional[float]] = 0.0
  strict: ClassVar[bool] = False  # parameter > minimum (True) or >= minimum (False)
  maximum: ClassVar[Optional[float]] = None
  in_simplex: ClassVar[bool] = True  # Lambda is a subset of the probability simplex
  has_prox: ClassVar[bool] = True  # prox (and the algorithms built on it) is available

  @property
  def param(self):
    """The value of the problem's parameter (``rho``, ``alpha``, ``q`` or ``lam``)."""
    return getattr(self, self.param_name)

  def check(self, batched: bool = False) -> "DROProblem":
    """``self``, after checking a concrete parameter (``ValueError`` naming it); ``batched``: the
    parameter may also be an array of values (a batch of problems for ``jax.vmap``), each checked."""
    c = _concrete_or_none(self.param) if batched else None
    values = [self.param] if c is None or c.ndim == 0 else list(c.reshape(-1))
    for value in values:
      _sx.check_scalar(value, self.param_name, self._valid, self._requirement())
    return self

  def _valid(self, c) -> bool:
    ok = c > self.minimum if self.strict else c >= self.minimum
    return bool(ok and (self.maximum is None or c <= self.maximum))

  def _requirement(self) -> str:
    low = ("> " if self.strict else ">= ") + f"{self.minimum:g}"
    if self.maximum is None:
      return low
    opening = "(" if self.strict else "["
    return f"in {opening}{self.minimum:g}, {self.maximum:g}]"

  # -- the problem -----------------------------------------------------------------------------
  def value(self, lam) -> jax.Array:
    """psi(lambda) for a 1-D ``lam`` (the set constraint is not part of it)."""
    raise NotImplementedError

  def best_response(self, losses) -> jax.Array:
    """A maximizer of ``<lambda, losses> - psi(lambda)`` over Lambda (1-D ``losses``)."""
    raise NotImplementedError

  def robust_objective(self, losses) -> jax.Array:
    """``max_{lambda in Lambda} <lambda, losses> - psi(lambda)``."""
    lam = self.best_response(losses)
    f = jnp.asarray(losses, lam.dtype)
    return jnp.dot(lam, f) - self.value(lam)

  def prox(self, lam, s, sigma) -> jax.Array:
    """``argmin_{l in Lambda} psi(l) - <s, l> + ||l - lam||^2 / (2 sigma)``."""
    raise NotImplementedError(
      f"psi {self.name!r} has no dual prox step: use chi2, cvar or qffl for the algorithms "
      "built on it"
    )

  def projected_ascent(self, lam, s, sigma) -> jax.Array:
    """``Proj_Lambda(lam + sigma (s - grad psi(lam)))``: DRFA's dual step."""
    raise ValueError(
      f"psi {self.name!r} has no projected gradient step: its Lambda is not a subset of the "
      "simplex or its psi is not smooth there"
    )

  # -- the hyper-parameter ---------------------------------------------------------------------
  def hparams(self, doc: Optional[str] = None) -> Dict[str, HParam]:
    """``{param_name: HParam}``: the parameter as a hyper-parameter, its default the problem's
    (concrete) parameter; ``doc`` replaces the description."""
    c = _concrete_or_none(self.param)
    if c is None or c.ndim != 0:
      raise ValueError(
        f"the default of `{self.param_name}` must be a concrete scalar, got {self.param!r}"
      )
    self.check()
    spec = HParam(float(c), doc or self.doc, self.minimum, self.strict, self.maximum)
    return {self.param_name: spec}

  def from_hparams(self, hparams) -> "DROProblem":
    """The same problem with its parameter taken from a round's ``hparams`` dict (possibly
    traced: this is how a round rebuilds it under a sweep)."""
    if self.param_name not in hparams:
      raise ValueError(
        f"`hparams` has no {self.param_name!r}, the parameter of psi {self.name!r}; "
        f"got {sorted(hparams)}"
      )
    return self.replace(**{self.param_name: hparams[self.param_name]})

  def config(self) -> Dict[str, Any]:
    """The ``Algorithm.config`` entries of the problem besides ``psi`` (its static options
    away from their defaults)."""
    return {}

  # -- for the saddle-point solver -------------------------------------------------------------
  def strongly_concave(self) -> bool:
    """Whether the inner maximum is strongly concave (unique, smooth best response), for a
    concrete parameter."""
    return False

  def quadratic_form(self, n: int) -> Optional[Tuple[float, Optional[float]]]:
    """``(kappa, cap)`` when Lambda is the simplex with ``lambda_i <= cap`` (``cap`` None: no cap)
    and psi is ``kappa / 2 ||lambda||^2`` plus an affine function on it; None otherwise."""
    return None

  def uniform_only(self, n: int) -> bool:
    """Whether Lambda is the single point ``1 / n`` (then the problem is ERM)."""
    return False


def _losses(losses):
  return _sx.check_vector(losses, "losses")


_OVERRIDABLE = ("minimum", "strict", "maximum", "in_simplex", "has_prox")


def _problem(name: str, doc: str, **options):
  """Declares a subclass of :class:`DROProblem` as a ``flax.struct.dataclass``: its first field
  is the problem's parameter (``param_name``, and its default the problem's ``default``),
  ``name`` its string form, ``doc`` the parameter's description and ``options`` the class
  attributes it overrides (``minimum``, ``strict``, ``maximum``, ``in_simplex``, ``has_prox``)."""
  unknown = sorted(set(options) - set(_OVERRIDABLE))
  if unknown:
    raise TypeError(f"unknown DRO problem options {unknown}; known: {list(_OVERRIDABLE)}")

  def declare(cls):
    param_name = next(iter(cls.__annotations__))
    cls.name, cls.param_name, cls.default, cls.doc = name, param_name, cls.__dict__[param_name], doc
    for key, value in options.items():
      setattr(cls, key, value)
    return flax.struct.dataclass(cls)

  return declare


@_problem("chi2", "chi^2 penalty strength rho (0 = AFL, large = ERM)")
class Chi2(DROProblem):
  """psi = (rho / (2n)) sum_i (n lambda_i - 1)^2 on the simplex (rho = 0: AFL's minimax)."""

  rho: Any = 0.1

  def value(self, lam):
    lam = _sx.check_vector(lam, "lam")
    n = lam.shape[0]
    dtype = lam.dtype
    self.check()
    rho = jnp.asarray(self.rho, dtype)
    return rho / (2.0 * n) * jnp.sum((n * lam - 1.0) ** 2)

  def best_response(self, losses):
    """rho > 0: P_simplex(f / (rho n) + 1/n) (unique); rho = 0: one-hot on the first argmax."""
    self.check()
    f = _losses(losses)
    n = f.shape[0]
    dtype = f.dtype
    rho = jnp.asarray(self.rho, dtype)
    pos = rho > 0
    smooth = _sx.project_simplex_unchecked(
      f / (jnp.where(pos, rho, 1.0) * n) + 1.0 / n, jnp.asarray(1.0, dtype)
    )
    onehot = jax.nn.one_hot(jnp.argmax(f), n, dtype=dtype)
    return jnp.where(pos, smooth, onehot)

  def prox(self, lam, s, sigma):
    """:func:`fedjax_dro.solvers.simplex.prox_chi2`."""
    return _sx.prox_chi2(lam, s, sigma, self.rho)

  def projected_ascent(self, lam, s, sigma):
    """``P_simplex(lam + sigma (s - rho (n lam - 1)))``, grad psi = rho (n lam - 1)."""
    n = lam.shape[0]
    grad_psi = self.rho * (n * lam - 1.0)
    return _sx.prox_chi2(lam, s - grad_psi, sigma, jnp.zeros((), lam.dtype))

  def strongly_concave(self):
    self.check()
    return float(self.rho) > 0

  def quadratic_form(self, n):
    self.check()
    return float(self.rho) * n, None


@_problem(
  "cvar", "CVaR level alpha: Lambda = {simplex, lambda_i <= 1/(alpha n)}", strict=True, maximum=1.0
)
class CVaR(DROProblem):
  """psi = 0 on the capped simplex {lambda in simplex, lambda_i <= 1 / (alpha n)}."""

  alpha: Any = 0.5

  def value(self, lam):
    lam = _sx.check_vector(lam, "lam")
    self.check()
    return jnp.zeros((), lam.dtype)

  def best_response(self, losses):
    """cap = 1/(alpha n) on the floor(1/cap) largest losses and the remainder on the next one
    (ties broken by index)."""
    self.check()
    f = _losses(losses)
    n = f.shape[0]
    dtype = f.dtype
    cap = 1.0 / (jnp.asarray(self.alpha, dtype) * n)
    order = jnp.argsort(-f, stable=True)
    k = jnp.arange(n, dtype=dtype)
    lam_sorted = jnp.clip(1.0 - k * cap, 0.0, cap)
    return jnp.zeros_like(f).at[order].set(lam_sorted)

  def prox(self, lam, s, sigma):
    """:func:`fedjax_dro.solvers.simplex.prox_cvar`."""
    return _sx.prox_cvar(lam, s, sigma, self.alpha)

  def projected_ascent(self, lam, s, sigma):
    """psi = 0 on Lambda: the projection of ``lam + sigma s``, i.e. :meth:`prox`."""
    return self.prox(lam, s, sigma)

  def quadratic_form(self, n):
    self.check()
    return 0.0, 1.0 / (float(self.alpha) * n)

  def uniform_only(self, n):
    self.check()
    return 1.0 / (float(self.alpha) * n) * n <= 1.0 + 1e-12


@_problem("qffl", "q-FFL exponent: psi = sum |lambda_i|^(1+1/q)", in_simplex=False)
class QFFL(DROProblem):
  """Lambda = R^n, psi = sum_i |lambda_i|^p (``norm="lp"``) or ||lambda||_2^p (``"l2"``),
  p = 1 + 1/q; q = 0: the indicator of the unit l_inf (lp) or l2 (l2) ball."""

  q: Any = 1.0
  norm: str = flax.struct.field(pytree_node=False, default="lp")

  def check(self, batched=False):
    _sx.check_norm(self.norm)
    return super().check(batched)

  def _exponents(self, dtype):
    """``(q > 0, q_safe, p)``: ``q_safe`` is q with 1 for q = 0 (the q = 0 branch stays finite)
    and ``p = 1 + 1/q_safe``."""
    q = jnp.asarray(self.q, dtype)
    q_pos = q > 0
    q_safe = jnp.where(q_pos, q, 1.0)
    return q_pos, q_safe, 1.0 + 1.0 / q_safe

  def value(self, lam):
    lam = _sx.check_vector(lam, "lam")
    self.check()
    q_pos, _, p = self._exponents(lam.dtype)
    if self.norm == "lp":
      general = jnp.sum(jnp.abs(lam) ** p)
      inside = jnp.max(jnp.abs(lam)) <= 1.0
    else:
      nrm = jnp.linalg.norm(lam)
      general = nrm**p
      inside = nrm <= 1.0
    limit = jnp.where(inside, 0.0, jnp.inf).astype(lam.dtype)
    return jnp.where(q_pos, general, limit)

  def best_response(self, losses):
    """sign(f) (|f|/p)^q (lp) or f/||f|| (||f||/p)^q (l2), p = 1 + 1/q; q = 0: sign(f) (lp)
    or f/||f|| (l2)."""
    self.check()
    f = _losses(losses)
    q_pos, q_safe, p = self._exponents(f.dtype)
    if self.norm == "lp":
      return jnp.where(q_pos, jnp.sign(f) * (jnp.abs(f) / p) ** q_safe, jnp.sign(f))
    nrm = jnp.linalg.norm(f)
    unit = f / jnp.where(nrm > 0, nrm, 1.0)
    return jnp.where(q_pos, unit * (nrm / p) ** q_safe, unit)

  def robust_objective(self, losses):
    """p^(-q) / (q + 1) sum_i |f_i|^(q+1) (lp) or p^(-q) / (q + 1) ||f||^(q+1) (l2); q = 0:
    ||f||_1 (lp) or ||f||_2 (l2). In closed form (no 0 * inf for q = 0)."""
    lam = self.best_response(losses)
    f = jnp.asarray(losses, lam.dtype)
    q_pos, q_safe, p = self._exponents(lam.dtype)
    if self.norm == "lp":
      val = jnp.sum(jnp.abs(f) ** (q_safe + 1.0)) * p ** (-q_safe) / (q_safe + 1.0)
      lim = jnp.sum(jnp.abs(f))
    else:
      nrm = jnp.linalg.norm(f)
      val = nrm ** (q_safe + 1.0) * p ** (-q_safe) / (q_safe + 1.0)
      lim = nrm
    return jnp.where(q_pos, val, lim)

  def prox(self, lam, s, sigma):
    """:func:`fedjax_dro.solvers.simplex.prox_qffl`."""
    return _sx.prox_qffl(lam, s, sigma, self.q, self.norm)

  def hparams(self, doc=None):
    if doc is None and self.norm == "l2":
      doc = "q-FFL exponent: psi = ||lambda||_2^(1+1/q)"
    return super().hparams(doc)

  def config(self):
    return {} if self.norm == "lp" else {"psi_norm": self.norm}

  def strongly_concave(self):
    self.check()
    return True


@_problem(
  "kl",
  "KL regularisation lambda (smaller = closer to the worst client)",
  strict=True,
  has_prox=False,
)
class KL(DROProblem):
  """psi = lam sum_i lambda_i log(n lambda_i) (lam times KL(lambda || uniform)) on the simplex."""

  lam: Any = 1.0

  def value(self, lam):
    lam = _sx.check_vector(lam, "lam")
    n = lam.shape[0]
    self.check()
    t = jnp.asarray(self.lam, lam.dtype)
    return t * jnp.sum(jax.scipy.special.xlogy(lam, n * lam))

  def best_response(self, losses):
    """The softmax weights ``softmax(f / lam)``."""
    self.check()
    f = _losses(losses)
    return jax.nn.softmax(f / jnp.asarray(self.lam, f.dtype))

  def robust_objective(self, losses):
    """``lam log((1/n) sum_i exp(f_i / lam))``, in the log domain."""
    self.check()
    f = _losses(losses)
    t = jnp.asarray(self.lam, f.dtype)
    return t * (jax.nn.logsumexp(f / t) - jnp.log(f.shape[0]))

  def strongly_concave(self):
    self.check()
    return True


_CLASSES = {cls.name: cls for cls in (Chi2, CVaR, QFFL, KL)}
PSI_NAMES = tuple(_CLASSES)
_OPTIONS = {"qffl": ("norm",)}  # the static options a name takes besides its parameter


def chi2(rho=Chi2.default) -> Chi2:
  """The chi^2-penalized problem on the simplex, ``rho >= 0`` (0: AFL's minimax problem)."""
  return Chi2(rho).check(batched=True)


def cvar(alpha=CVaR.default) -> CVaR:
  """The CVaR problem at level ``alpha`` in ``(0, 1]`` (1: ERM; ``<= 1/n``: AFL)."""
  return CVaR(alpha).check(batched=True)


def qffl(q=QFFL.default, norm: str = "lp") -> QFFL:
  """The q-FFL problem, ``q >= 0``, ``norm`` ``"lp"`` (default) or ``"l2"``."""
  return QFFL(q, norm).check(batched=True)


def kl(lam=KL.default) -> KL:
  """The KL-regularized problem on the simplex, ``lam > 0``."""
  return KL(lam).check(batched=True)


def _check_name(psi):
  if not isinstance(psi, str) or psi not in _CLASSES:
    raise ValueError(
      f"`psi` must be a DRO problem (fedjax_dro.solvers.chi2(...), cvar, qffl, kl) or one of "
      f"{PSI_NAMES}, got {psi!r}"
    )
  return _CLASSES[psi]


def as_problem(psi, **params) -> DROProblem:
  """The :class:`DROProblem` of ``psi``: a problem is returned as is (``params`` must be empty); a
  name of :data:`PSI_NAMES` is built with its parameter from ``params`` (required: ``rho``,
  ``alpha``, ``q`` or ``lam``; ``qffl`` also takes ``norm``)."""
  if isinstance(psi, DROProblem):
    if params:
      raise ValueError(
        f"`psi` is already a problem ({psi!r}): pass no parameters, got {sorted(params)}"
      )
    return psi.check()
  cls = _check_name(psi)
  required, optional = {cls.param_name}, set(_OPTIONS.get(psi, ()))
  missing = required - set(params)
  if missing:
    raise ValueError(f"psi {psi!r} requires parameter(s) {sorted(missing)}")
  extra = set(params) - required - optional
  if extra:
    raise ValueError(
      f"psi {psi!r} got unexpected parameter(s) {sorted(extra)}; "
      f"expected {sorted(required | optional)}"
    )
  return cls(**params).check()


def resolve(psi, **defaults) -> DROProblem:
  """The problem of an algorithm factory's ``psi`` option: a problem as is; a name at its default
  parameter, ``defaults[param_name]`` where given (e.g. ``rho=0.0``: AFL's and DRFA's), the class
  default otherwise (chi2 0.1, cvar 0.5, qffl 1.0, kl 1.0)."""
  if isinstance(psi, DROProblem):
    return psi.check()
  cls = _check_name(psi)
  return cls(defaults.get(cls.param_name, cls.default)).check()


def initial_lambda(num_clients: int, dtype=None) -> jax.Array:
  """The uniform dual weights ``1 / n`` the DRO algorithms start from."""
  dtype = dtype or jnp.result_type(float)
  return jnp.full((num_clients,), 1.0 / num_clients, dtype)
