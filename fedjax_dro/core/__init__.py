"""Shared mechanics: sampling, local training, aggregation, projections, metrics."""
