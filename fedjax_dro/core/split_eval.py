"""A model evaluated on a streamed split, batch by batch: per client (domain), per group, and the
metrics its dataset is judged on.

:func:`evaluate_split` reads each client's rows of a
:class:`~fedjax_dro.data.streamed.StreamedFederatedData` in batches of ``batch_size`` (one
compiled batch shape; the last batch of a client padded and masked), applies the model in its
inference mode and adds up sufficient statistics (:mod:`fedjax_dro.core.split_metrics`), so a
split of any size is evaluated in the memory of one batch. It serves held-out rows of the
training clients and held-out domains alike (WILDS' out-of-distribution splits: other clients
than training's, evaluated with the global model).

Returned: ``per_client`` (``loss`` and the model's metrics, e.g. ``accuracy``, means over each
client's rows, and ``rows``), ``per_group`` (the same per evaluation group of the dataset:
PovertyMap's rural / urban, the Pile's domains, CivilComments' 16 overlapping identity x label
groups) and ``summary``: the row-weighted means, ``worst_client_*`` / ``mean_client_*`` of each
per-client metric, and the dataset's own metrics from the manifest's ``info["metrics"]``:
``macro_f1`` (over the labels present in the split), ``pearson_r`` and
``worst_group_pearson_r``, ``worst_group_accuracy``, ``log_perplexity`` (worst and average over
domains: the per-domain mean token loss of a language model's fixed-length sequences).
"""

from __future__ import annotations

from typing import Any, Dict

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.core import split_metrics as sm


def _batch_fn(model):
  """``(params, x, y) -> (loss [B], metrics {name: [B]}, prediction [B])`` (jitted)."""

  def fn(params, x, y):
    out = model.apply(params, x)
    loss = model.loss(out, y)
    metrics = model.metrics(out, y)
    if model.task == "classification" and out.ndim == 2:
      pred = jnp.argmax(out, axis=-1) if out.shape[-1] > 1 else (out[:, 0] > 0).astype(jnp.int32)
    elif out.ndim >= 1 and out.size == out.shape[0]:
      pred = out.reshape(out.shape[0])
    else:
      pred = jnp.zeros(out.shape[:1])
    return loss, metrics, pred

  return jax.jit(fn)


def evaluate_split(
  model, params, data, *, batch_size: int = 256, personalized: bool = False
) -> Dict[str, Any]:
  """Evaluates ``params`` on every row of the streamed split ``data`` (see the module docstring).

  Args:
    model: the :class:`~fedjax_dro.common.model.Model`.
    params: one model for every client, or with ``personalized`` ``[n, ...]`` per-client models
      (client ``i`` evaluated with its own: the training clients' held-out rows).
    data: a :class:`~fedjax_dro.data.streamed.StreamedFederatedData`.
    batch_size: rows per compiled batch.
  """
  if not getattr(data, "streamed", False):
    raise TypeError(f"data must be streamed (load_prepared), got {type(data).__name__}")
  if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
    raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
  store = data.store
  n, num_groups = data.num_clients, len(store.groups)
  fn = _batch_fn(model)
  info = store.manifest.get("info", {})
  classes = info.get("num_classes")
  sums: Dict[str, np.ndarray] = {}
  group_sums: Dict[str, np.ndarray] = {}
  rows_c = np.zeros(n, np.int64)
  rows_g = np.zeros(num_groups, np.int64)
  confusion = np.zeros((classes, classes), np.int64) if classes else None
  moment = np.zeros((num_groups, 6))
  correct_g = np.zeros(num_groups, np.int64)
  for i in range(n):
    count = int(store.counts[i])
    p = jax.tree.map(lambda a, i=i: a[i], params) if personalized else params
    for start in range(0, count, batch_size):
      rows = np.arange(start, start + batch_size)
      valid = rows < count
      x, y = store.gather(np.array([i]), rows[None])
      group = np.asarray(store.group[store.global_rows(np.array([i]), rows[None])[0]])
      loss, metrics, pred = jax.device_get(fn(p, x[0], y[0]))
      values = {"loss": loss, **metrics}
      for name, v in values.items():
        v = np.where(valid, np.asarray(v, np.float64).reshape(batch_size, -1).mean(axis=1), 0.0)
        sums.setdefault(name, np.zeros(n))[i] += v.sum()
        group_sums.setdefault(name, np.zeros(num_groups))
        np.add.at(group_sums[name], group[valid], v[valid])
      rows_c[i] += int(valid.sum())
      np.add.at(rows_g, group[valid], 1)
      label = np.asarray(y[0])
      if confusion is not None and label.shape == (batch_size,):
        confusion += sm.confusion_counts(label[valid], pred[valid], classes)
        np.add.at(correct_g, group[valid], (pred == label)[valid].astype(np.int64))
      if info.get("task") == "regression" and label.shape == (batch_size,):
        moment += sm.moments(label[valid], pred[valid], group[valid], num_groups)
  with np.errstate(divide="ignore", invalid="ignore"):
    per_client = {k: v / np.maximum(rows_c, 1) for k, v in sums.items()}
    per_group = {
      k: np.where(rows_g > 0, v / np.maximum(rows_g, 1), np.nan) for k, v in group_sums.items()
    }
  per_client["rows"], per_group["rows"] = rows_c, rows_g
  total = max(int(rows_c.sum()), 1)
  summary: Dict[str, float] = {k: float(v.sum() / total) for k, v in sums.items()}
  for k, v in per_client.items():
    if k != "rows":
      summary[f"mean_client_{k}"] = float(np.mean(v[rows_c > 0]))
      worst = np.max if k == "loss" else np.min
      summary[f"worst_client_{k}"] = float(worst(v[rows_c > 0]))
  wanted = set(info.get("metrics", ()))
  if confusion is not None and "macro_f1" in wanted:
    summary["macro_f1"] = sm.macro_f1(confusion)
  if info.get("task") == "regression":
    summary["pearson_r"] = sm.overall_pearson_r(moment)
    summary["worst_group_pearson_r"] = sm.worst_group_pearson_r(moment)
  if confusion is not None and num_groups > 1:
    member = store.eval_membership()
    if member is not None:  # rows in several groups (CivilComments)
      hits, counts = correct_g @ member, rows_g @ member
      per_group["eval_groups"] = list(info["eval_groups"])
      per_group["eval_accuracy"] = sm.group_accuracies(hits, counts)
    else:
      hits, counts = correct_g, rows_g
    summary["worst_group_accuracy"] = sm.worst_group_accuracy(hits, counts)
  if "log_perplexity" in wanted:  # the per-domain mean token loss (the clients are the domains)
    present = rows_c > 0
    summary["worst_log_perplexity"] = float(per_client["loss"][present].max())
    summary["average_log_perplexity"] = float(per_client["loss"][present].mean())
  return {"per_client": per_client, "per_group": per_group, "summary": summary}
