"""The package's version, in the lowest layer so that any module may record it (run records,
tracked parameters) without importing the package's public face."""

__version__ = "0.1.0"
