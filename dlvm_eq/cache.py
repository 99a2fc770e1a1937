"""A small on-disk cache: one file per key, with a checksum, written atomically.

Kernels (dlvm_eq/codegen/kernel_cache.py) and compiled IR (dlvm_eq/ir_cache.py) use it.

    >>> cache = DiskCache()                     # $DLVM_EQ_CACHE_DIR, default ~/.cache/dlvm_eq
    >>> cache.put("cpu", key, object_code)
    >>> cache.get("cpu", key)                   # the bytes, or None if absent or corrupt

A file is MAGIC + sha256(payload) + payload. A corrupt or truncated file is reported as a
miss (and counted in `corrupt`), so the caller rebuilds and overwrites it.

`source_digest()` is a hash of the package's own source files (~2 ms, once per process). Keys of
entries that hold pickled compiler objects, or results of code that has no version number of
its own, include it: an edited (or reinstalled) dlvm_eq never reads a stale entry.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

MAGIC = b"DQK1"


def default_cache_dir() -> Path:
    return Path(os.environ.get("DLVM_EQ_CACHE_DIR") or Path.home() / ".cache" / "dlvm_eq")


class DiskCache:
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()
        self.corrupt = 0

    def path(self, kind: str, key: str) -> Path:
        return self.root / kind / key[:2] / f"{key}.bin"

    def get(self, kind: str, key: str) -> bytes | None:
        p = self.path(kind, key)
        try:
            data = p.read_bytes()
        except OSError:
            return None
        payload = data[len(MAGIC) + 32:]
        if data[:len(MAGIC)] != MAGIC or hashlib.sha256(payload).digest() != data[len(MAGIC):len(MAGIC) + 32]:
            self.corrupt += 1
            return None
        return payload

    def put(self, kind: str, key: str, payload: bytes) -> None:
        """Write atomically (temp file + rename); a cache that cannot be written is skipped."""
        p = self.path(kind, key)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + hashlib.sha256(payload).digest() + payload)
            os.replace(tmp, p)
        except OSError:
            pass


_SOURCE_DIGEST: str | None = None
_PACKAGE = Path(__file__).resolve().parent


def source_digest() -> str:
    """sha256 of every .py and .lark file of the dlvm_eq package (paths and contents)."""
    global _SOURCE_DIGEST
    if _SOURCE_DIGEST is None:
        _SOURCE_DIGEST = tree_digest(_PACKAGE)
    return _SOURCE_DIGEST


def tree_digest(root, suffixes=(".py", ".lark")) -> str:
    """sha256 of the files under `root` ending in `suffixes`: relative paths and contents, in
    a fixed order (__pycache__ skipped)."""
    h = hashlib.sha256()
    root = os.fspath(root)
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        prefix = directory[len(root):].lstrip(os.sep)
        for name in sorted(files):
            if name.endswith(suffixes):
                with open(os.path.join(directory, name), "rb") as f:
                    h.update(f"{prefix}/{name}".encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


_shared: DiskCache | None = None


def shared_cache() -> DiskCache:
    """The process's cache (kernels, compiled IR), at $DLVM_EQ_CACHE_DIR as read on first use."""
    global _shared
    if _shared is None:
        _shared = DiskCache()
    return _shared


def set_cache_dir(path) -> None:
    """Use another cache directory from now on (kernels already loaded stay loaded)."""
    global _shared
    _shared = DiskCache(path)
