"""Bundled models: the MLP classifier that `dlvm-eq demo` and the benchmarks train."""
