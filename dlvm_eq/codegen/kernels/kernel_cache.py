"""On-disk cache of compiled kernels, keyed by IR text, target and host (see dlvm_eq/cache.py).

>>> shared_cache().get("cpu", cache_key(ir_text, triple, cpu_name))
"""

from __future__ import annotations

import hashlib

from ...cache import MAGIC, DiskCache, default_cache_dir, set_cache_dir, shared_cache  # noqa: F401

# Bump when the code generator changes what a given IR/PTX key would produce.
CODEGEN_VERSION = "2"  # 2: entries carry a header (symbol, host, sha256) before the object


def cache_key(*parts: str) -> str:
    """sha256 of the parts (IR text, target triple, CPU name, llvmlite version, ...)."""
    h = hashlib.sha256(CODEGEN_VERSION.encode())
    for p in parts:
        h.update(b"\0" + p.encode())
    return h.hexdigest()
