"""Bundled models: the MLP classifier that `dlvm-eq demo` and the benchmarks train (mlp.py),
and the digits demo itself (demo.py).

May import: pipeline, dsl and the layers below them (never cli, nor the root package).
"""
