"""UCI heart disease, four hospitals as four clients (ships with the package; see
``heart_disease/ATTRIBUTION.md``). Preprocessing as FLamby's Fed-Heart-Disease."""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

from fedjax_dro.data.federated import FederatedDataset, from_client_arrays

CENTERS = ("cleveland", "hungarian", "switzerland", "va")
DATA_DIR = os.path.join(os.path.dirname(__file__), "heart_disease")


def _read_center(path: str) -> np.ndarray:
  rows = []
  with open(path) as f:
    for line in f:
      fields = line.strip().split(",")
      if len(fields) != 14:
        continue
      fields = fields[:10] + fields[13:]  # drop columns 10-12 (slope, ca, thal)
      if "?" in fields:
        continue  # drop rows with missing values
      rows.append([float(v) for v in fields])
  return np.array(rows)


def _encode(raw: np.ndarray):
  """13 features: one-hot of column 2 (chest pain, 4 levels) and 6 (rest ECG, 3 levels), first
  level dropped; label > 0 -> 1."""
  cp = raw[:, 2].astype(int)
  ecg = raw[:, 6].astype(int)
  others = np.delete(raw[:, :10], [2, 6], axis=1)
  cp_onehot = np.stack([cp == level for level in (2, 3, 4)], 1).astype(float)
  ecg_onehot = np.stack([ecg == level for level in (1, 2)], 1).astype(float)
  x = np.concatenate([others, cp_onehot, ecg_onehot], axis=1)
  y = (raw[:, 10] > 0).astype(np.int32)
  return x, y


def heart_disease(
  seed: int = 0,
  *,
  data_dir: Optional[str] = None,
  test_fraction: float = 0.34,
  standardize: bool = True,
) -> FederatedDataset:
  """The four-hospital heart disease task (binary classification, 13 features, 740 rows).

  Args:
    seed: seed of the per-center stratified train/test split.
    data_dir: directory with the four ``processed.*.data`` files (default: the shipped copy).
    standardize: standardize features with the pooled *training* mean and std.
  """
  data_dir = data_dir or DATA_DIR
  rng = np.random.default_rng(seed)
  splits = {"train": ([], []), "test": ([], [])}
  for center in CENTERS:
    path = os.path.join(data_dir, f"processed.{center}.data")
    if not os.path.exists(path):
      raise ValueError(f"data_dir {data_dir!r} has no file processed.{center}.data")
    x, y = _encode(_read_center(path))
    test = np.zeros(len(y), bool)
    for label in (0, 1):
      rows = np.flatnonzero(y == label)
      test[rng.choice(rows, int(round(test_fraction * len(rows))), replace=False)] = True
    for name, sel in (("train", ~test), ("test", test)):
      splits[name][0].append(x[sel])
      splits[name][1].append(y[sel])
  if standardize:
    pooled = np.concatenate(splits["train"][0])
    mean, std = pooled.mean(0), pooled.std(0)
    std[std == 0] = 1.0
    for name in splits:
      splits[name] = ([(x - mean) / std for x in splits[name][0]], splits[name][1])
  return FederatedDataset(
    train=from_client_arrays(*splits["train"]),
    test=from_client_arrays(*splits["test"]),
    task="classification",
    num_classes=2,
    name="heart-disease",
    client_names=list(CENTERS),
    description="UCI heart disease, 4 hospitals (FLamby preprocessing), logistic regression",
  )
