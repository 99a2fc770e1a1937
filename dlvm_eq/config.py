"""Every `DLVM_EQ_*` setting, read from the environment once, into one frozen `Settings`.

    from dlvm_eq import config
    config.settings().cache_dir        # read on first call, then the same object every time
    config.reload()                    # re-read os.environ (for in-process tests that change it)

Nothing else in dlvm_eq reads the environment, and nothing reads it on a hot path: a
subprocess reads its own environment when it first asks. Some values are used once per process
where they are used (the thread count, the spin budget, the GEMM switch: see the settings
page, docs/guide/settings.md); `reload()` changes what later readers see, not what was
already built from it.
The rule files' directory is found here too, so that the caches need not import the e-graph.

Shared state (threads): `_current` is replaced whole (a frozen object) under `_lock`; readers
take a reference without locking.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

from .errors import DlvmError


@dataclass(frozen=True)
class Setting:
    """One environment variable: its name, default (as text) and what it does."""

    name: str
    default: str
    help: str


# The table (the settings table, docs/guide/settings.md, is checked against it, tests/test_config.py).
SETTINGS = (
    Setting(
        "DLVM_EQ_CACHE_DIR",
        "~/.cache/dlvm_eq",
        "where compiled kernels, optimized programs, adjoints and plans are cached (a "
        "directory private to the user; another owner's is not used)",
    ),
    Setting(
        "DLVM_EQ_NO_IR_CACHE",
        "",
        "any non-empty value: do not read or write optimized programs, adjoints and plans "
        "on disk (kernel object code is still cached)",
    ),
    Setting(
        "DLVM_EQ_NUM_THREADS",
        "",
        "threads for parallel kernels, the caller's included (a whole number >= 1); unset: "
        "the CPUs of the affinity mask, capped by the cgroup CPU quota",
    ),
    Setting(
        "DLVM_EQ_NATIVE_POOL",
        "1",
        "0: run parallel kernels on Python threads instead of the native worker pool",
    ),
    Setting(
        "DLVM_EQ_BLAS_POOL",
        "0",
        "1: run OpenBLAS's threaded calls (numpy's matmul) on the native worker pool instead "
        "of OpenBLAS's own threads (OpenBLAS 0.3.27 or later)",
    ),
    Setting(
        "DLVM_EQ_SPIN_US",
        "300",
        "microseconds an idle native worker spins before it sleeps on a futex",
    ),
    Setting(
        "DLVM_EQ_GEMM",
        "auto",
        "1: always use our float32 GEMM for large products (and fuse epilogues into it); 0, "
        "unset or anything else: never (numpy's BLAS, faster on idle hosts)",
    ),
    Setting(
        "DLVM_EQ_EPILOGUES",
        "1",
        "0: do not fuse elementwise consumers of a matmul into our GEMM's tiles",
    ),
)


@dataclass(frozen=True)
class Settings:
    """The settings of this process, parsed (see SETTINGS for what each one does)."""

    cache_dir: Path
    ir_cache: bool  # DLVM_EQ_NO_IR_CACHE unset or empty
    num_threads: str  # as written ("" when unset); codegen/runtime/cpu_count.py parses it
    native_pool: bool
    blas_pool: bool
    spin_us: float
    gemm: str  # "0", "1" or "auto"
    epilogues: bool


def read(environ=None) -> Settings:
    """Settings parsed from `environ` (default os.environ); a DlvmError names a bad value."""
    env = os.environ if environ is None else environ

    def text(name: str) -> str:
        return env.get(name, "")

    gemm = text("DLVM_EQ_GEMM").strip()
    gemm = (
        gemm if gemm in ("0", "1") else "auto"
    )  # anything else: the default (gemm_runtime.DEFAULT_ENABLED)
    spin = text("DLVM_EQ_SPIN_US").strip() or "300"
    try:
        spin_us = float(spin)
    except ValueError:
        raise DlvmError(f"DLVM_EQ_SPIN_US={spin!r}: expected a number of microseconds") from None
    return Settings(
        cache_dir=Path(text("DLVM_EQ_CACHE_DIR") or Path.home() / ".cache" / "dlvm_eq"),
        ir_cache=text("DLVM_EQ_NO_IR_CACHE") == "",
        num_threads=text("DLVM_EQ_NUM_THREADS"),
        native_pool=(text("DLVM_EQ_NATIVE_POOL") or "1") != "0",
        blas_pool=text("DLVM_EQ_BLAS_POOL").strip() == "1",
        spin_us=spin_us,
        gemm=gemm,
        epilogues=(text("DLVM_EQ_EPILOGUES") or "1") != "0",
    )


_lock = threading.Lock()
_current: Settings | None = None


def settings() -> Settings:
    """This process's settings, read from the environment on the first call."""
    current = _current
    return current if current is not None else reload()


def reload(environ=None) -> Settings:
    """Re-read the environment (or `environ`): later `settings()` calls see the new values."""
    global _current
    new = read(environ)
    with _lock:
        _current = new
    return new


# ------------------------------------------------------------------ the rule files

_PACKAGE = Path(__file__).resolve().parent


def rules_dir() -> Path:
    """The shipped rule files' directory: the repository's rules/ first (an editable install
    has no package copy), then the copy force-included in the wheel at dlvm_eq/rules."""
    for candidate in (_PACKAGE.parent / "rules", _PACKAGE / "rules"):
        if (candidate / "schema.egg").is_file():
            return candidate
    raise DlvmError(
        "cannot find the rule files (rules/schema.egg); is dlvm_eq installed correctly?"
    )


__all__ = ["SETTINGS", "Setting", "Settings", "read", "reload", "rules_dir", "settings"]


def default_for_libraries(name: str, value: str) -> None:
    """Set an environment variable that a library we start reads (e.g. Ray's
    RAY_USAGE_STATS_ENABLED, read by ray.init), unless the user set it: this module is the one
    place that touches the environment."""
    os.environ.setdefault(name, value)
