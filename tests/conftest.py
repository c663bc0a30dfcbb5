"""Test configuration: float64 everywhere so that oracle comparisons can use tight tolerances."""

import jax

jax.config.update("jax_enable_x64", True)
