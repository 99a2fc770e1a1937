"""The package version, in one place: the root package, the caches' keys and the wheel's
metadata (pyproject.toml reads it through hatch) all take it from here, so that no layer
imports the root package for it."""

__version__ = "0.1.0"
