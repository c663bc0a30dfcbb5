"""Split-level metrics from sufficient statistics, so that evaluation can stream over batches.

Each metric is split in two: a *statistics* function turns one batch into a fixed-shape array
(or a tuple of them) whose sum over batches is the statistics of the whole split, and a *metric*
function turns the summed statistics into the number the papers report. Evaluating a split batch
by batch (padded batches included: ``weights`` / ``mask`` 0 drops a padding row) and adding the
statistics gives the same metric as one pass over all rows: exactly for the counts (integers when
no weights are given), to rounding for the float sums of :func:`moments`.

=================================  ===============================  ============================
statistics (per batch, add them)   metric                           used by
=================================  ===============================  ============================
:func:`confusion_counts` [C, C]    :func:`macro_f1`,                iWildCam (macro-F1 over the
                                   :func:`accuracy_from_confusion`  labels present)
:func:`moments` [G, 6]             :func:`pearson_r`,               PovertyMap (Pearson r,
                                   :func:`overall_pearson_r`,       worst of urban / rural)
                                   :func:`worst_group_pearson_r`
:func:`group_accuracy`,            :func:`worst_group_accuracy`,    CivilComments, Waterbirds-
:func:`group_accuracy_multi`       :func:`group_accuracies`         style worst-group accuracy
:func:`token_nll_stats`            :func:`log_perplexity`,          the Pile / language models
                                   :func:`worst_log_perplexity`,    per domain
                                   :func:`average_log_perplexity`
=================================  ===============================  ============================

The functions take NumPy or JAX arrays and compute in NumPy on the host (float64 sums; int64
counts), where the summaries are made; an undefined value (a group without rows, a constant
variable) is NaN, and the worst-of helpers leave NaNs out.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

MOMENT_NAMES = ("count", "sum_t", "sum_p", "sum_tt", "sum_pp", "sum_tp")


def _weights(weights, n: int) -> Optional[np.ndarray]:
  if weights is None:
    return None
  w = np.asarray(weights, np.float64).reshape(-1)
  if w.shape[0] != n:
    raise ValueError(f"weights has {w.shape[0]} entries, the batch {n}")
  return w


def _check_index(name: str, values: np.ndarray, size: int) -> None:
  if values.size and (values.min() < 0 or values.max() >= size):
    raise ValueError(f"{name} must lie in [0, {size}), got {values.min()}..{values.max()}")


def _bincount(index: np.ndarray, size: int, w: Optional[np.ndarray]) -> np.ndarray:
  if w is None:
    return np.bincount(index, minlength=size).astype(np.int64)
  return np.bincount(index, weights=w, minlength=size)


def confusion_counts(labels, predictions, num_classes: int, weights=None) -> np.ndarray:
  """The confusion matrix of a batch: ``[C, C]`` counts, rows the true label, columns the
  prediction (int64; float64 weighted sums when ``weights`` are given). A row of weight 0 (a
  padding row) is left out whatever its label; the others must lie in ``[0, num_classes)``."""
  labels = np.asarray(labels).reshape(-1)
  predictions = np.asarray(predictions).reshape(-1)
  if labels.shape != predictions.shape:
    raise ValueError(f"labels {labels.shape} and predictions {predictions.shape} differ")
  w = _weights(weights, labels.shape[0])
  if w is not None:
    keep = w != 0
    labels, predictions, w = labels[keep], predictions[keep], w[keep]
  labels = labels.astype(np.int64)
  predictions = predictions.astype(np.int64)
  _check_index("labels", labels, num_classes)
  _check_index("predictions", predictions, num_classes)
  flat = _bincount(labels * num_classes + predictions, num_classes * num_classes, w)
  return flat.reshape(num_classes, num_classes)


def accuracy_from_confusion(confusion) -> float:
  """The accuracy the confusion matrix holds (NaN when it is empty)."""
  confusion = np.asarray(confusion, np.float64)
  total = confusion.sum()
  return float(np.trace(confusion) / total) if total > 0 else float("nan")


def macro_f1(confusion) -> float:
  """Macro-F1 over the labels *present* in the evaluated split (the rows with a nonzero sum),
  WILDS' iWildCam metric: ``sklearn.metrics.f1_score(y, p, average="macro", labels=present)``.
  A predicted label absent from the split counts against the true labels' recall but gets no F1
  of its own. NaN for an empty matrix."""
  confusion = np.asarray(confusion, np.float64)
  if confusion.ndim != 2 or confusion.shape[0] != confusion.shape[1]:
    raise ValueError(f"confusion must be [C, C], got {confusion.shape}")
  support = confusion.sum(axis=1)
  present = support > 0
  if not present.any():
    return float("nan")
  tp = np.diag(confusion)
  fp = confusion.sum(axis=0) - tp
  fn = support - tp
  f1 = 2 * tp[present] / (2 * tp[present] + fp[present] + fn[present])
  return float(f1.mean())


def moments(targets, predictions, groups, num_groups: int, weights=None) -> np.ndarray:
  """Per-group sums ``[G, 6]`` for Pearson r: (count, sum t, sum p, sum t^2, sum p^2, sum t p)
  (:data:`MOMENT_NAMES`), float64; ``weights`` weigh each row (0 drops a padding row)."""
  t = np.asarray(targets, np.float64).reshape(-1)
  p = np.asarray(predictions, np.float64).reshape(-1)
  g = np.asarray(groups).reshape(-1)
  if not t.shape == p.shape == g.shape:
    raise ValueError(f"targets {t.shape}, predictions {p.shape} and groups {g.shape} differ")
  w = _weights(weights, t.shape[0])
  if w is None:
    w = np.ones_like(t)
  keep = w != 0
  t, p, g, w = t[keep], p[keep], g[keep].astype(np.int64), w[keep]
  _check_index("groups", g, num_groups)
  columns = (w, w * t, w * p, w * t * t, w * p * p, w * t * p)
  return np.stack([np.bincount(g, weights=c, minlength=num_groups) for c in columns], axis=1)


def pearson_r(moments_) -> np.ndarray:
  """Pearson's r per group ``[G]`` from :func:`moments` (NaN where undefined: fewer than two
  rows, or a constant target or prediction). Computed from raw sums in float64: exact enough for
  targets and predictions of moderate mean / spread (WILDS' wealth indices); centre them first
  for data with a huge mean."""
  m = np.atleast_2d(np.asarray(moments_, np.float64))
  n, st, sp, stt, spp, stp = m.T
  with np.errstate(divide="ignore", invalid="ignore"):
    cov = stp - st * sp / n
    vt = stt - st * st / n
    vp = spp - sp * sp / n
    r = cov / np.sqrt(vt * vp)
  eps = 1e-12
  undefined = (n <= 1) | (vt <= eps * np.maximum(stt, 1)) | (vp <= eps * np.maximum(spp, 1))
  return np.where(undefined, np.nan, np.clip(r, -1.0, 1.0))


def overall_pearson_r(moments_) -> float:
  """Pearson's r over all groups pooled (the groups' sums added)."""
  m = np.atleast_2d(np.asarray(moments_, np.float64))
  return float(pearson_r(m.sum(axis=0, keepdims=True))[0])


def worst_group_pearson_r(moments_) -> float:
  """The lowest per-group r, groups where r is undefined left out (NaN when all are)."""
  r = pearson_r(moments_)
  return float(np.nanmin(r)) if np.isfinite(r).any() else float("nan")


def group_accuracy(correct, groups, num_groups: int, weights=None) -> Tuple[np.ndarray, np.ndarray]:
  """Per-group (correct counts ``[G]``, counts ``[G]``) of a batch with one group a row (int64;
  float64 weighted sums with ``weights``; weight 0 drops a padding row)."""
  c = np.asarray(correct).reshape(-1).astype(bool)
  g = np.asarray(groups).reshape(-1)
  if c.shape != g.shape:
    raise ValueError(f"correct {c.shape} and groups {g.shape} differ")
  w = _weights(weights, c.shape[0])
  if w is not None:
    keep = w != 0
    c, g, w = c[keep], g[keep], w[keep]
  g = g.astype(np.int64)
  _check_index("groups", g, num_groups)
  counts = _bincount(g, num_groups, w)
  hits = _bincount(g[c], num_groups, None if w is None else w[c])
  return hits, counts


def group_accuracy_multi(correct, membership, weights=None) -> Tuple[np.ndarray, np.ndarray]:
  """Per-group (correct counts ``[G]``, counts ``[G]``) when a row may belong to several groups
  (CivilComments: a comment mentioning two identities, each crossed with its label):
  ``membership`` is a boolean ``[k, G]`` matrix; a row counts once in every group it belongs to
  (and in none when its row is all False)."""
  c = np.asarray(correct).reshape(-1).astype(bool)
  member = np.asarray(membership).astype(bool)
  if member.ndim != 2 or member.shape[0] != c.shape[0]:
    raise ValueError(f"membership must be [k, G] with k={c.shape[0]}, got {member.shape}")
  w = _weights(weights, c.shape[0])
  if w is None:
    return (member & c[:, None]).sum(axis=0).astype(np.int64), member.sum(axis=0).astype(np.int64)
  mw = member * w[:, None]
  return (mw * c[:, None]).sum(axis=0), mw.sum(axis=0)


def group_accuracies(correct_counts, counts) -> np.ndarray:
  """Accuracy per group ``[G]`` (NaN for a group without rows)."""
  hits = np.asarray(correct_counts, np.float64)
  n = np.asarray(counts, np.float64)
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(n > 0, hits / n, np.nan)


def worst_group_accuracy(correct_counts, counts) -> float:
  """The lowest accuracy over the groups with rows (groups of count 0 ignored; NaN when none has
  rows)."""
  acc = group_accuracies(correct_counts, counts)
  return float(np.nanmin(acc)) if np.isfinite(acc).any() else float("nan")


def token_nll_stats(
  token_nll, domains, num_domains: int, mask=None
) -> Tuple[np.ndarray, np.ndarray]:
  """Per-domain (sum of token negative log-likelihoods ``[D]`` float64, token counts ``[D]``) of a
  batch: ``token_nll`` ``[k, T]`` (nats), ``domains`` ``[k]`` (the row's domain), ``mask``
  ``[k, T]`` (1 for a real target token, 0 for padding; default all 1)."""
  nll = np.asarray(token_nll, np.float64)
  if nll.ndim == 1:
    nll = nll[:, None]
  d = np.asarray(domains).reshape(-1).astype(np.int64)
  if d.shape[0] != nll.shape[0]:
    raise ValueError(f"domains has {d.shape[0]} rows, token_nll {nll.shape[0]}")
  m = np.ones_like(nll) if mask is None else np.asarray(mask, np.float64).reshape(nll.shape)
  rows = m.sum(axis=1)
  keep = rows > 0
  _check_index("domains", d[keep], num_domains)
  sums = np.bincount(d[keep], weights=(nll * m).sum(axis=1)[keep], minlength=num_domains)
  tokens = np.bincount(d[keep], weights=rows[keep], minlength=num_domains)
  return sums, (tokens.astype(np.int64) if mask is None or _is_binary(m) else tokens)


def _is_binary(m: np.ndarray) -> bool:
  return bool(np.all((m == 0) | (m == 1)))


def log_perplexity(sum_token_nll, num_tokens) -> np.ndarray:
  """Log-perplexity per domain ``[D]``: mean token NLL (nats; ``exp`` of it is the perplexity),
  NaN for a domain without tokens."""
  s = np.asarray(sum_token_nll, np.float64)
  n = np.asarray(num_tokens, np.float64)
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(n > 0, s / n, np.nan)


def worst_log_perplexity(sum_token_nll, num_tokens) -> float:
  """The highest per-domain log-perplexity (domains without tokens ignored; NaN when none)."""
  lp = log_perplexity(sum_token_nll, num_tokens)
  return float(np.nanmax(lp)) if np.isfinite(lp).any() else float("nan")


def average_log_perplexity(sum_token_nll, num_tokens, pooled: bool = False) -> float:
  """The unweighted mean of the per-domain log-perplexities over the domains with tokens (every
  domain counts alike), or with ``pooled`` the log-perplexity of all tokens together (domains
  weighted by their token counts). NaN when no domain has tokens."""
  if pooled:
    s, n = float(np.sum(sum_token_nll)), float(np.sum(num_tokens))
    return s / n if n > 0 else float("nan")
  lp = log_perplexity(sum_token_nll, num_tokens)
  return float(np.nanmean(lp)) if np.isfinite(lp).any() else float("nan")
