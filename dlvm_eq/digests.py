"""Digests of source and rule files for cache keys, read once and then remembered under the
files' stat signature, so that a warm process reads none of the files it keys by.

    files = tree_files(package_dir)              # [(relative name, path)], a fixed order
    content_digest(files)                        # sha256 of names and contents (reads them)
    files_digest(files, shared_cache())          # the same digest; from the cache when the
                                                 # files' stat signature was hashed before

Shared state (threads): `digest_stats` is written under `_lock`.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading


def tree_files(root, suffixes=(".py", ".lark")) -> list[tuple[str, str]]:
    """(relative name, path) of the files under `root` ending in `suffixes`, in a fixed order
    (__pycache__ skipped)."""
    out = []
    root = os.fspath(root)
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        prefix = directory[len(root) :].lstrip(os.sep)
        out += [
            (f"{prefix}/{n}", os.path.join(directory, n))
            for n in sorted(files)
            if n.endswith(suffixes)
        ]
    return out


def tree_digest(root, suffixes=(".py", ".lark")) -> str:
    """sha256 of the files under `root` ending in `suffixes`: relative paths and contents, in
    a fixed order (__pycache__ skipped)."""
    return content_digest(tree_files(root, suffixes))


def content_digest(files: list[tuple[str, str]]) -> str:
    """sha256 of (name, contents) of each (name, path) of `files`, in their order."""
    h = hashlib.sha256()
    for name, path in files:
        with open(path, "rb") as f:
            h.update(name.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


# how digests were found this process: "stat" (from the cache, no file read), "read" (counts
# for tests; written under _lock)
digest_stats = {"stat": 0, "read": 0}
_lock = threading.Lock()


def _count(how: str) -> None:
    with _lock:
        digest_stats[how] += 1


_HEX64 = re.compile(rb"^[0-9a-f]{64}$")


def files_digest(files: list[tuple[str, str]], cache) -> str:
    """content_digest(files), remembered in `cache` (a cache.DiskCache) under the files' stat
    signature (name, size, mtime and ctime in ns, inode of each): a later process whose files
    have the same signature reads the digest instead of every file. An edit changes the ctime
    (no call sets it back) and so the signature; Python's own bytecode cache trusts less
    (mtime and size)."""
    h = hashlib.sha256(b"files-digest 1")
    try:
        for name, path in files:
            st = os.stat(path)
            sig = f"{name}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}\0"
            h.update(sig.encode())
    except OSError:
        _count("read")
        return content_digest(files)  # a file gone meanwhile: raises as reading would
    key = h.hexdigest()
    hit = cache.get("digest", key)
    if hit is not None and _HEX64.match(hit):
        _count("stat")
        return hit.decode()
    digest = content_digest(files)
    _count("read")
    cache.put("digest", key, digest.encode())
    return digest
