"""Optimal-transport embeddings and client dissimilarities (ott-jax)."""

from fedjax_dro.ot.dissimilarity import dissimilarities, dissimilarity_matrix
from fedjax_dro.ot.embeddings import DissimilarityOutput, ot_embeddings, reference_set

__all__ = [
  "ot_embeddings",
  "dissimilarities",
  "dissimilarity_matrix",
  "reference_set",
  "DissimilarityOutput",
]
