"""A small on-disk cache: one file per key, with a checksum, written atomically, in a private
directory.

Kernels (dlvm_eq/codegen/kernels/kernel_cache.py), kernel plans, compiled IR (dlvm_eq/ir/function_cache.py) and
the IR parser's tables use it.

    >>> cache = DiskCache()                     # $DLVM_EQ_CACHE_DIR, default ~/.cache/dlvm_eq
    >>> cache.put("cpu", key, object_code)
    >>> cache.get("cpu", key)                   # the bytes, or None if absent, corrupt or untrusted

A file is MAGIC + sha256(body) + body, where body is "kind/key\n" + payload. A corrupt or
truncated file, or one whose recorded kind/key is not the one asked for (an entry copied or
renamed over another's, with a valid checksum), is reported as a miss (and counted in
`corrupt`), so the caller rebuilds and overwrites it. The checksum finds damage, not
tampering; what keeps others' bytes out is where the files are:

- Entries hold data (JSON, IR, PTX text), never pickles. The one executable kind is the CPU
  kernels' object code, which is also checked for a well-formed ELF object before loading.
- The directory and its subdirectories are created 0700, entries 0600. A directory or entry
  that is group- or world-writable, or owned by another user, is not used: a warning
  (`UntrustedCache`) says so once, and the compiler works without the cache.

The cache owns its directory, and says so in it: a CACHEDIR.TAG marker (the cachedir.tag
convention, so backup tools skip it) that names dlvm_eq and the entry format. The marker is
written when the cache creates the directory or first writes to it. A directory that is a
symbolic link, or that has no marker and holds anything but the cache's own layout (a home
directory: dotfiles), is not used, and `clear` refuses it. `clear` removes only what it can
tell is its own: files of its format (a MAGIC header) at an entry's place
(kind/xx/<key>.bin), its temporary files, and its old formats' files; it follows no link and
reports what it kept.

`source_digest()` is a hash of the package's own source files (once per process; a process
after the first reads it from the cache under the files' stat signature, `files_digest`). Keys
of entries that hold results of code that has no version number of its own include it: an
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
import re
import stat
import threading
import warnings
from dataclasses import field
from pathlib import Path

from .config import settings
from .digests import files_digest, tree_digest, tree_files  # noqa: F401  (tree_digest: API)
from .errors import DlvmError
from .records import dataclass

# 3: the body records the entry's kind and key; 2: entries are data (DQK1 entries held pickles)
# Old formats' entries are never read, only cleared.
FORMAT = 3
MAGIC = b"DQK3"
_OLD_MAGICS = (b"DQK1", b"DQK2")

MARKER = "CACHEDIR.TAG"
_SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"  # https://bford.info/cachedir/
_FORMAT_LINE = re.compile(r"^dlvm_eq-cache-format: (\d+)$", re.M)
_MARKER_TEXT = (
    f"{_SIGNATURE}\n"
    "# This directory is dlvm_eq's compile cache: `dlvm-eq cache clear` empties it.\n"
    f"dlvm_eq-cache-format: {FORMAT}\n"
)
# the layout: <kind>/<first two hex digits of the key>/<key>.bin
_KIND = re.compile(r"^[a-z][a-z0-9_]*(-[a-z0-9_]+)*$")
_KEY = re.compile(r"^[0-9a-f]{16,128}$")
_SHARD = re.compile(r"^[0-9a-f]{2}$")
# files of ours directly in a kind directory: an old version's pickled parser tables (lark's
# own cache; stale), and the machine profiles `dlvm-eq calibrate` measured (kept by `clear`:
# measurements, not cached results)
_KIND_FILES = {
    "lark": (re.compile(r"^dlvm-grammar-[0-9a-f]+\.lark\.pickle$"), "stale"),
    "profiles": (re.compile(r"^[a-z0-9_-]+\.json$"), "profile"),
}


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
        self._marked = False  # the marker is there, of this format
        self._lock = threading.Lock()

    def path(self, kind: str, key: str) -> Path:
        # a fixed layout: `clear` recognizes every file the cache writes by its place
        if not (_KIND.match(kind) and _KEY.match(key)):
            raise ValueError(f"cache kind {kind!r} or key {key!r} outside the cache's layout")
        return self.root / kind / key[:2] / f"{key}.bin"

    # ---------------------------------------------------------------- trust

    def _root_ok(self, create: bool, fresh: bool = False) -> bool:
        """The root exists (created 0700 if `create`), is a directory (not a link to one), is
        private to us and is marked as ours (marked now if `create` and it holds only our
        layout); checked once per process unless `fresh` (and once more to mark it)."""
        with self._lock:
            if (
                self._root_checked
                and not fresh
                and (self._marked or not create or self._root_problem)
            ):
                return self._root_problem is None
        try:
            if create:
                self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.lstat(self.root)
        except OSError:
            return False  # absent (reading) or not creatable: no cache, no warning
        problem = _root_problem(self.root, st)
        marked = False
        if problem is None:
            fmt, problem = _marker(self.root)
            marked = fmt == FORMAT
            if problem is None and create and not marked:
                marked = _write_marker(self.root)
        with self._lock:
            self._root_checked, self._root_problem, self._marked = True, problem, marked
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
        body = data[len(MAGIC) + 32 :]
        label, _, payload = body.partition(b"\n")
        if (
            data[: len(MAGIC)] != MAGIC
            or hashlib.sha256(body).digest() != data[len(MAGIC) : len(MAGIC) + 32]
            or label != _label(kind, key)  # another key's entry, copied or renamed here
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
        import tempfile  # on a write only: its imports (shutil, random) cost a warm process ~3 ms

        try:
            fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-")  # mkstemp: mode 0600
            with os.fdopen(fd, "wb") as f:
                body = _label(kind, key) + b"\n" + payload
                f.write(MAGIC + hashlib.sha256(body).digest() + body)
            os.replace(tmp, p)
        except OSError:
            pass

    # ---------------------------------------------------------------- info and clear

    def info(self) -> dict:
        """{path, exists, trusted, problem, bytes, entries: {kind: n}, stale: n, other: n};
        `stale` counts entries of an older format (never read; `clear` removes them), `other`
        the files that are not the cache's (`clear` keeps them)."""
        out = {
            "path": str(self.root),
            "exists": os.path.lexists(self.root),
            "trusted": False,
            "problem": None,
            "bytes": 0,
            "entries": {},
            "stale": 0,
            "other": 0,
        }
        if not out["exists"]:
            out["trusted"] = True  # created private on first use
            return out
        out["problem"] = self.trust_problem()
        out["trusted"] = out["problem"] is None
        if not out["trusted"]:
            return out  # a link or someone else's directory: not ours to describe
        for path, kind, what, size in _walk(self.root):
            out["bytes"] += size
            if what == "entry":
                out["entries"][kind] = out["entries"].get(kind, 0) + 1
            elif what == "stale":
                out["stale"] += 1
            elif what == "other":
                out["other"] += 1
        out["entries"] = dict(sorted(out["entries"].items()))
        return out

    def clear(self) -> Cleared:
        """Remove the cache's own files (entries of any format, temporary files), and the
        directories they leave empty; keep everything else (machine profiles included) and
        say what. Refuses a root that is a symbolic link, not a directory, another user's, or
        neither marked nor holding only the cache's layout."""
        try:
            st = os.lstat(self.root)
        except FileNotFoundError:
            return Cleared(self.root)
        problem = _root_problem(self.root, st, writable_ok=True)
        if problem is None:  # unmarked, it must hold nothing but the cache's layout
            _, problem = _marker(self.root)
        if problem:
            raise DlvmError(f"not clearing it: {problem}")
        out = Cleared(self.root)
        emptied = set()
        for path, _, what, _ in _walk(self.root):
            if what in ("entry", "stale", "temporary"):
                try:
                    os.unlink(path)
                    out.removed += 1
                    emptied.add(os.path.dirname(path))
                except OSError:
                    out.kept.append(path)
            elif what == "profile":
                out.profiles.append(path)
            elif what != "marker":
                out.kept.append(path)
        # directories of ours left empty go (rmdir removes nothing else, and no link); a
        # kind-named directory only when it held ours (an empty `data/` is someone's)
        for kind_dir in _scan(self.root):
            if _KIND.match(kind_dir.name) and kind_dir.is_dir(follow_symlinks=False):
                held_ours = kind_dir.path in emptied
                for shard in _scan(kind_dir):
                    if _SHARD.match(shard.name) and shard.is_dir(follow_symlinks=False):
                        held_ours = True
                        _rmdir(shard.path)
                if held_ours:
                    _rmdir(kind_dir.path)
        self._trusted_dirs.clear()
        return out


@dataclass
class Cleared:
    """What `DiskCache.clear` did: how many files it removed, the paths of the files it kept
    because they are not the cache's, and of the machine profiles it kept."""

    root: Path
    removed: int = 0
    kept: list[str] = field(default_factory=list)
    profiles: list[str] = field(default_factory=list)


def _label(kind: str, key: str) -> bytes:
    return f"{kind}/{key}".encode()


def _root_problem(root: Path, st: os.stat_result, writable_ok: bool = False) -> str | None:
    """Why the root (lstat'ed) is not a cache directory for us to use, or None."""
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(root)
        except OSError:
            target = "?"
        return (
            f"{root} is a symbolic link (to {target}); set DLVM_EQ_CACHE_DIR to a directory "
            "of its own"
        )
    if not stat.S_ISDIR(st.st_mode):
        return f"{root} is not a directory"
    if writable_ok:  # clearing: a directory others could write is still ours to empty
        return (
            f"{root} is owned by another user (uid {st.st_uid})" if _owned_by_another(st) else None
        )
    return _problem(st, "cache directory", root)


def _marker(root: Path) -> tuple[int | None, str | None]:
    """(the format the marker names, or None when there is none; why the directory is not
    ours, or None). Without a marker, a directory that holds nothing but the cache's layout
    (an empty one, or a cache from before markers) is ours; anything else (a file, a link, a
    dotfile: a home directory) is not."""
    try:
        fd = os.open(root / MARKER, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        foreign = [e.name for e in _scan(root) if not _layout_dir(e)]
        if not foreign:
            return None, None
        shown = ", ".join(sorted(foreign)[:3]) + (", ..." if len(foreign) > 3 else "")
        return None, (
            f"{root} is not a dlvm_eq cache: it has no {MARKER} and holds other files "
            f"({shown}); set DLVM_EQ_CACHE_DIR to a new or empty directory"
        )
    except OSError as e:  # a link (ELOOP) or unreadable
        return None, f"{root / MARKER} cannot be read ({e.strerror or e})"
    with os.fdopen(fd, "rb") as f:
        text = f.read(4096).decode("utf-8", "replace")
    m = _FORMAT_LINE.search(text)
    if not text.startswith(_SIGNATURE) or m is None:
        return None, f"{root / MARKER} is not dlvm_eq's (another program's cache directory?)"
    return int(m.group(1)), None


def _layout_dir(e: os.DirEntry) -> bool:
    """`e` is a kind directory holding only key-prefix directories (and old formats' files)."""
    if not (_KIND.match(e.name) and e.is_dir(follow_symlinks=False)):
        return False
    files = _KIND_FILES.get(e.name, (None,))[0]
    return all(
        (_SHARD.match(c.name) and c.is_dir(follow_symlinks=False))
        or (files and files.match(c.name) and c.is_file(follow_symlinks=False))
        for c in _scan(e.path)
    )


def _write_marker(root: Path) -> bool:
    import tempfile  # as in put

    try:
        fd, tmp = tempfile.mkstemp(dir=root, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            f.write(_MARKER_TEXT)
        os.replace(tmp, root / MARKER)
        return True
    except OSError:
        return False


def _scan(d) -> list[os.DirEntry]:
    try:
        with os.scandir(d) as it:
            return list(it)
    except OSError:
        return []


def _rmdir(path: str) -> None:
    with contextlib.suppress(OSError):  # not empty: it holds what was kept
        os.rmdir(path)


def _walk(root: Path):
    """(path, kind, what, bytes) for every file and link below root, without following links;
    what: "marker", "entry" (this format), "stale" (an older one), "temporary" (a write in
    progress or cut short), "profile" (a machine profile) or "other" (not the cache's)."""
    for top in _scan(root):
        if top.name == MARKER and top.is_file(follow_symlinks=False):
            yield top.path, None, "marker", 0
        elif _KIND.match(top.name) and top.is_dir(follow_symlinks=False):
            yield from _walk_kind(top)
        elif top.name.startswith(".tmp-") and top.is_file(follow_symlinks=False):
            yield top.path, None, _classify(top, marker=True), 0
        else:
            yield from _others(top)


def _walk_kind(kind_dir: os.DirEntry):
    files, what = _KIND_FILES.get(kind_dir.name, (None, None))
    children = _scan(kind_dir)
    if not children:  # nothing of ours in it: someone's empty folder, kept and shown
        yield kind_dir.path + os.sep, None, "other", 0
    for shard in children:
        if _SHARD.match(shard.name) and shard.is_dir(follow_symlinks=False):
            for f in _scan(shard):
                if not f.is_file(follow_symlinks=False):
                    yield from _others(f)
                elif f.name.startswith(".tmp-") or (
                    f.name.endswith(".bin")
                    and _KEY.match(f.name[:-4])
                    and f.name.startswith(shard.name)
                ):
                    yield f.path, kind_dir.name, _classify(f), _size(f)
                else:
                    yield f.path, kind_dir.name, "other", _size(f)
        elif files and files.match(shard.name) and shard.is_file(follow_symlinks=False):
            yield shard.path, kind_dir.name, what, _size(shard)
        else:
            yield from _others(shard)


def _classify(f: os.DirEntry, marker: bool = False) -> str:
    """An entry's file by its header: this format, an older one, or not the cache's."""
    try:
        st = f.stat(follow_symlinks=False)
        if _owned_by_another(st):
            return "other"
        with open(f.path, "rb") as fh:  # a regular file (checked above): no link followed
            head = fh.read(len(MAGIC) if not marker else 64)
    except OSError:
        return "other"
    temporary = f.name.startswith(".tmp-")
    if marker:  # a marker being written: the signature, or nothing yet
        sig = _SIGNATURE.encode()
        return "temporary" if head.startswith(sig) or sig.startswith(head) else "other"
    if head == MAGIC:
        return "temporary" if temporary else "entry"
    if head in _OLD_MAGICS:
        return "temporary" if temporary else "stale"
    # a temporary file cut short before its header was written
    return "temporary" if temporary and MAGIC.startswith(head) else "other"


def _size(f: os.DirEntry) -> int:
    try:
        return f.stat(follow_symlinks=False).st_size
    except OSError:
        return 0


def _others(e: os.DirEntry):
    """Everything at and below `e`, none of it the cache's (a directory is listed by its
    files; links are not followed)."""
    if e.is_dir(follow_symlinks=False):
        children = _scan(e.path)
        if not children:
            yield e.path + os.sep, None, "other", 0
        for c in children:
            yield from _others(c)
    else:
        yield e.path, None, "other", _size(e)


_SOURCE_DIGEST: str | None = None
_PACKAGE = Path(__file__).resolve().parent


def source_digest() -> str:
    """sha256 of every .py and .lark file of the dlvm_eq package (paths and contents), once per
    process, and read from the cache where the files' stat signature is one already hashed
    (`files_digest`): a warm process reads no source file."""
    global _SOURCE_DIGEST
    if _SOURCE_DIGEST is None:
        _SOURCE_DIGEST = files_digest(tree_files(_PACKAGE), shared_cache())
    return _SOURCE_DIGEST


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
