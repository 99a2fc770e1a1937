"""A small on-disk cache: one file per key, with a checksum, written atomically, in a private
directory.

Kernels (dlvm_eq/codegen/kernels/kernel_cache.py), kernel plans, compiled IR (dlvm_eq/ir/function_cache.py) and
the IR parser's tables use it.

    >>> cache = DiskCache()                     # $DLVM_EQ_CACHE_DIR, default ~/.cache/dlvm_eq
    >>> cache.put("cpu", key, object_code)
    >>> cache.get("cpu", key)                   # the bytes, or None if absent, corrupt or untrusted

A file is MAGIC + sha256(payload) + payload. A corrupt or truncated file is reported as a
miss (and counted in `corrupt`), so the caller rebuilds and overwrites it. The checksum finds
damage, not tampering; what keeps others' bytes out is where the files are:

- Entries hold data (JSON, IR, PTX text), never pickles. The one executable kind is the CPU
  kernels' object code, which is also checked for a well-formed ELF object before loading.
- The directory and its subdirectories are created 0700, entries 0600. A directory or entry
  that is group- or world-writable, or owned by another user, is not used: a warning
  (`UntrustedCache`) says so once, and the compiler works without the cache.

`source_digest()` is a hash of the package's own source files (~2 ms, once per process). Keys of
entries that hold results of code that has no version number of its own include it: an
edited (or reinstalled) dlvm_eq never reads a stale entry.

Results cut short by a wall-clock budget (saturation stopped by "seconds", an extraction or
fusion search past its time limit) depend on the machine's speed and load at that moment:
stored, one busy process's worse program would be every later process's (and a CI cache's).
The code that cuts calls `note_time_cut(what)`; a caller that stores a result builds it inside
`watching_time_cuts()` and does not store it when the list it yields is not empty.

    >>> with watching_time_cuts() as cuts:
    ...     fn = build()
    >>> if not cuts: cache.put(...)

`dlvm-eq cache info` prints `DiskCache.info()`, `dlvm-eq cache clear` runs `DiskCache.clear()`.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import shutil
import stat
import tempfile
import threading
import warnings
from pathlib import Path

from .config import settings
from .errors import DlvmError

# 2: entries are data (DQK1 entries held pickles; they are never read, only cleared)
MAGIC = b"DQK2"
_OLD_MAGICS = (b"DQK1",)


class UntrustedCache(UserWarning):
    """The cache directory (or an entry) could be written by someone else: it is not used."""


def default_cache_dir() -> Path:
    return settings().cache_dir  # $DLVM_EQ_CACHE_DIR, default ~/.cache/dlvm_eq


def _owned_by_another(st: os.stat_result) -> bool:
    return hasattr(os, "getuid") and st.st_uid != os.getuid()


def _problem(st: os.stat_result, what: str, path: Path) -> str | None:
    """Why a file or directory with this stat must not be trusted, or None."""
    if _owned_by_another(st):
        return f"{what} {path} is owned by another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{what} {path} is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


_warned: set[str] = set()
_warn_lock = threading.Lock()


def _warn_once(message: str, key: str | None = None) -> None:
    """Warn with `message` unless one with the same `key` (default: the message) was given."""
    key = message if key is None else key
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(
        f"dlvm_eq: not using the compile cache: {message}; compiling without it "
        "(fix the permissions, or set DLVM_EQ_CACHE_DIR to a private directory)",
        UntrustedCache,
        stacklevel=3,
    )


class DiskCache:
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()
        self.corrupt = 0
        self._trusted_dirs: set[Path] = set()
        self._root_problem: str | None = None
        self._root_checked = False
        self._lock = threading.Lock()

    def path(self, kind: str, key: str) -> Path:
        return self.root / kind / key[:2] / f"{key}.bin"

    # ---------------------------------------------------------------- trust

    def _root_ok(self, create: bool, fresh: bool = False) -> bool:
        """The root exists (created 0700 if `create`), is a directory and is private to us;
        checked once per process unless `fresh`."""
        with self._lock:
            if self._root_checked and not fresh:
                return self._root_problem is None
        try:
            if create:
                self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.stat(self.root)
        except OSError:
            return False  # absent (reading) or not creatable: no cache, no warning
        problem = (
            f"{self.root} is not a directory"
            if not stat.S_ISDIR(st.st_mode)
            else _problem(st, "cache directory", self.root)
        )
        with self._lock:
            self._root_checked, self._root_problem = True, problem
        if problem:
            _warn_once(problem)
        return problem is None

    def trust_problem(self) -> str | None:
        """Why the cache is not used (None: it is, or it does not exist yet), as of now."""
        self._root_ok(create=False, fresh=True)
        return self._root_problem

    def _dir_ok(self, d: Path, create: bool) -> bool:
        """`d` (below the root) exists, created 0700, and is private to us; checked once."""
        if d in self._trusted_dirs:
            return True
        try:
            if create:
                d.mkdir(mode=0o700, exist_ok=True)
            st = os.lstat(d)
        except OSError:
            return False
        problem = (
            f"{d} is not a directory"
            if not stat.S_ISDIR(st.st_mode)
            else _problem(st, "cache directory", d)
        )
        if problem:
            _warn_once(problem)
            return False
        self._trusted_dirs.add(d)
        return True

    def _dirs_ok(self, p: Path, create: bool) -> bool:
        return (
            self._root_ok(create)
            and self._dir_ok(p.parent.parent, create)
            and self._dir_ok(p.parent, create)
        )

    # ---------------------------------------------------------------- entries

    def get(self, kind: str, key: str) -> bytes | None:
        p = self.path(kind, key)
        if not self._dirs_ok(p, create=False):
            return None
        try:
            fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            problem = (
                f"{p} is not a regular file"
                if not stat.S_ISREG(st.st_mode)
                else _problem(st, "cache entry", p)
            )
            if problem:  # one warning per cache, however many such entries
                _warn_once(problem + " (and maybe others)", key=f"entry {self.root}")
                return None
            try:
                data = f.read()
            except OSError:
                return None
        payload = data[len(MAGIC) + 32 :]
        if (
            data[: len(MAGIC)] != MAGIC
            or hashlib.sha256(payload).digest() != data[len(MAGIC) : len(MAGIC) + 32]
        ):
            self.corrupt += 1
            return None
        return payload

    def put(self, kind: str, key: str, payload: bytes) -> None:
        """Write atomically (temp file + rename, mode 0600); a cache that cannot be written,
        or is not private, is skipped."""
        p = self.path(kind, key)
        if not self._dirs_ok(p, create=True):
            return
        try:
            fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-")  # mkstemp: mode 0600
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + hashlib.sha256(payload).digest() + payload)
            os.replace(tmp, p)
        except OSError:
            pass

    # ---------------------------------------------------------------- info and clear

    def info(self) -> dict:
        """{path, exists, trusted, problem, bytes, entries: {kind: n}, stale: n}; `stale`
        counts entries of an older format (never read; `clear` removes them)."""
        out = {
            "path": str(self.root),
            "exists": self.root.is_dir(),
            "trusted": False,
            "problem": None,
            "bytes": 0,
            "entries": {},
            "stale": 0,
        }
        if not out["exists"]:
            out["trusted"] = True  # created private on first use
            return out
        out["problem"] = self.trust_problem()
        out["trusted"] = out["problem"] is None
        for kind_dir in sorted(self.root.iterdir()):
            if not kind_dir.is_dir() or kind_dir.is_symlink():
                continue
            n = 0
            for f in kind_dir.rglob("*"):
                if f.is_symlink() or not f.is_file():
                    continue
                try:
                    size = f.stat().st_size
                    with open(f, "rb") as fh:
                        head = fh.read(len(MAGIC))
                except OSError:
                    continue
                out["bytes"] += size
                if f.name.endswith(".bin") and head == MAGIC:
                    n += 1
                elif head in _OLD_MAGICS or f.name.endswith(".pickle"):
                    out["stale"] += 1
            out["entries"][kind_dir.name] = n
        return out

    def clear(self) -> int:
        """Remove every entry (the directory stays); the number of files removed. Refuses a
        directory owned by another user."""
        if not self.root.exists():
            return 0
        if _owned_by_another(os.stat(self.root)):
            raise DlvmError(f"{self.root} is owned by another user; not clearing it")
        removed = 0
        for child in self.root.iterdir():
            if child.is_dir() and not child.is_symlink():
                removed += sum(1 for f in child.rglob("*") if not f.is_dir())
                shutil.rmtree(child)  # does not follow symbolic links
            else:
                child.unlink()
                removed += 1
        self._trusted_dirs.clear()
        return removed


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
        prefix = directory[len(root) :].lstrip(os.sep)
        for name in sorted(files):
            if name.endswith(suffixes):
                with open(os.path.join(directory, name), "rb") as f:
                    h.update(f"{prefix}/{name}".encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


_shared: DiskCache | None = None
# the recorders of the builds in progress in this context (nested builds each get every cut)
_time_cut_recorders: contextvars.ContextVar[tuple[list, ...]] = contextvars.ContextVar(
    "dlvm_eq_time_cut_recorders", default=()
)


@contextlib.contextmanager
def watching_time_cuts():
    """Yields a list that receives what `note_time_cut` is told inside the block (this thread
    or task only: contextvars)."""
    cuts: list[str] = []
    token = _time_cut_recorders.set(_time_cut_recorders.get() + (cuts,))
    try:
        yield cuts
    finally:
        _time_cut_recorders.reset(token)


def note_time_cut(what: str) -> None:
    """A wall-clock budget cut the result being built short (`what`: which and where)."""
    for cuts in _time_cut_recorders.get():
        cuts.append(what)


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
