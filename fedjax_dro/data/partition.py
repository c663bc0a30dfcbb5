"""Partitioners that split pooled labelled arrays into clients."""

from __future__ import annotations

from typing import List

import numpy as np


def dirichlet_partition(
  labels,
  num_clients: int,
  alpha: float,
  *,
  seed: int = 0,
  min_examples: int = 1,
  max_tries: int = 100,
) -> List[np.ndarray]:
  """Label-skew partition (Hsu et al. 2019): for every class, its rows are split among clients in
  proportions drawn from ``Dirichlet(alpha * 1_n)``. Small ``alpha`` gives few classes per client.

  Redraws (up to ``max_tries``) until every client has at least ``min_examples`` rows.
  Returns one index array per client.
  """
  labels = np.asarray(labels)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise TypeError(
      f"labels must be a 1-D integer array, got shape {labels.shape} dtype {labels.dtype}"
    )
  if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
    raise ValueError(f"num_clients must be a positive integer, got {num_clients!r}")
  if not alpha > 0:
    raise ValueError(f"alpha must be > 0, got {alpha!r}")
  if num_clients * min_examples > labels.size:
    raise ValueError(
      f"cannot give {num_clients} clients {min_examples} rows each from {labels.size} rows"
    )
  rng = np.random.default_rng(seed)
  for _ in range(max_tries):
    parts = [[] for _ in range(num_clients)]
    for c in np.unique(labels):
      rows = rng.permutation(np.flatnonzero(labels == c))
      p = rng.dirichlet(alpha * np.ones(num_clients))
      cuts = (np.cumsum(p) * rows.size).astype(int)[:-1]
      for i, chunk in enumerate(np.split(rows, cuts)):
        parts[i].extend(chunk.tolist())
    if min(len(p) for p in parts) >= min_examples:
      return [np.sort(np.array(p, int)) for p in parts]
  raise ValueError(
    f"could not draw a Dirichlet({alpha}) partition with >= {min_examples} rows per "
    f"client in {max_tries} tries; raise alpha or lower num_clients"
  )
