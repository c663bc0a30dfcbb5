"""Optimal-transport embeddings and client dissimilarities (ott-jax)."""

from fedjax_dro.ot.dissimilarity import (
  PRESET_OPTIONS,
  PRESETS,
  dissimilarities,
  dissimilarity_matrix,
  pairwise_embedding_distances,
  validate_dissimilarity,
)
from fedjax_dro.ot.embeddings import (
  COSTS,
  NORMS,
  SOLVERS,
  ConvergenceReport,
  DissimilarityOutput,
  SinkhornConvergenceError,
  SinkhornConvergenceWarning,
  client_point_clouds,
  ot_embeddings,
  reference_set,
)

__all__ = [
  "COSTS",
  "NORMS",
  "PRESETS",
  "PRESET_OPTIONS",
  "SOLVERS",
  "ConvergenceReport",
  "DissimilarityOutput",
  "SinkhornConvergenceError",
  "SinkhornConvergenceWarning",
  "client_point_clouds",
  "dissimilarities",
  "dissimilarity_matrix",
  "ot_embeddings",
  "pairwise_embedding_distances",
  "reference_set",
  "validate_dissimilarity",
]
