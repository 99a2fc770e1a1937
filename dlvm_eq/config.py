"""Every `DLVM_EQ_*` setting, read from the environment once, into one frozen `Settings`.

    from dlvm_eq import config
    config.settings().cache_dir        # read on first call, then the same object every time
    config.reload()                    # re-read os.environ (for in-process tests that change it)

Every value is checked here, by its row of SETTINGS: a bad one is a DlvmError that names the
variable and what it accepts (`DLVM_EQ_SPIN_US='1e99': expected a number of microseconds from
0 to 1,000,000`), on the first call, not where the value is first used.

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

import math
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .errors import DlvmError
from .records import dataclass

# Caps: past them a value is a mistake, not a machine (100,000 threads took 9.6 s to fail
# with "can't start new thread"; a spin of 1e99 us overflowed the pool's cycle counter).
MAX_THREADS = 1024
MAX_SPIN_US = 1_000_000.0  # one second: an idle worker that spins longer only burns a CPU


def process_environment() -> Mapping[str, str]:
    """The process's environment, for the variables other libraries define that dlvm_eq
    follows without owning them (OpenBLAS's thread counts: extract/machine.blas_threads).
    Environment reads stay in this module (tests/test_config.py)."""
    return os.environ


def _path(name: str, text: str) -> Path:
    return Path(text) if text else Path.home() / ".cache" / "dlvm_eq"


def _any_value(name: str, text: str) -> bool:
    return text == ""  # DLVM_EQ_NO_IR_CACHE: set to anything, the IR cache is off


def _switch(default: bool):
    def parse(name: str, text: str) -> bool:
        if text == "":
            return default
        if text not in ("0", "1"):
            raise _bad(name, text, "0 or 1")
        return text == "1"

    return parse


def _gemm(name: str, text: str) -> str:
    if text not in ("", "auto", "0", "1"):
        raise _bad(name, text, "0 (never), 1 (always), auto or unset (the host decides)")
    return text or "auto"


def _threads(name: str, text: str) -> int | None:
    if text == "":
        return None  # the CPUs of the affinity mask and the cgroup quota (cpu_count.py)
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_THREADS:
        raise _bad(name, text, f"a whole number of threads from 1 to {MAX_THREADS}, or unset")
    return n


def _spin(name: str, text: str) -> float:
    try:
        us = float(text) if text else 300.0
    except ValueError:
        us = math.nan
    if not 0.0 <= us <= MAX_SPIN_US:  # nan and inf fail too
        raise _bad(name, text, f"a number of microseconds from 0 to {MAX_SPIN_US:,.0f}")
    return us


def _bad(name: str, text: str, accepted: str) -> DlvmError:
    return DlvmError(f"{name}={text!r}: expected {accepted}")


@dataclass(frozen=True)
class Setting:
    """One environment variable: its name, default (as text), what it does, the `Settings`
    field it fills and its parser ((name, text stripped) -> value, or a DlvmError that names
    the variable and the values it accepts)."""

    name: str
    default: str
    help: str
    field: str
    parse: Callable[[str, str], Any]


# The table (the settings table, docs/guide/settings.md, is checked against it, tests/test_config.py).
SETTINGS = (
    Setting(
        "DLVM_EQ_CACHE_DIR",
        "~/.cache/dlvm_eq",
        "where compiled kernels, optimized programs, adjoints and plans are cached (a "
        "directory private to the user; another owner's is not used)",
        "cache_dir",
        _path,
    ),
    Setting(
        "DLVM_EQ_NO_IR_CACHE",
        "",
        "any non-empty value: do not read or write optimized programs, adjoints and plans "
        "on disk (kernel object code is still cached)",
        "ir_cache",
        _any_value,
    ),
    Setting(
        "DLVM_EQ_NUM_THREADS",
        "",
        f"threads for parallel kernels, the caller's included (a whole number from 1 to "
        f"{MAX_THREADS}); unset: the CPUs of the affinity mask, capped by the cgroup CPU quota",
        "num_threads",
        _threads,
    ),
    Setting(
        "DLVM_EQ_NATIVE_POOL",
        "1",
        "0: run parallel kernels on Python threads instead of the native worker pool",
        "native_pool",
        _switch(True),
    ),
    Setting(
        "DLVM_EQ_BLAS_POOL",
        "0",
        "1: run OpenBLAS's threaded calls (numpy's matmul) on the native worker pool instead "
        "of OpenBLAS's own threads (OpenBLAS 0.3.27 or later)",
        "blas_pool",
        _switch(False),
    ),
    Setting(
        "DLVM_EQ_SPIN_US",
        "300",
        f"microseconds an idle native worker spins before it sleeps on a futex (0 to "
        f"{MAX_SPIN_US:,.0f})",
        "spin_us",
        _spin,
    ),
    Setting(
        "DLVM_EQ_GEMM",
        "auto",
        "1: always use our float32 GEMM for large products (and fuse epilogues into it); 0: "
        "never (numpy's BLAS, measured faster on idle hosts); auto or unset: the default, never",
        "gemm",
        _gemm,
    ),
    Setting(
        "DLVM_EQ_EPILOGUES",
        "1",
        "0: do not fuse elementwise consumers of a matmul into our GEMM's tiles",
        "epilogues",
        _switch(True),
    ),
    Setting(
        "DLVM_EQ_MULTI_OUTPUT",
        "1",
        "0: reductions never share a pass with the maps of their iteration space (multi-output "
        "fusion on the CPU, planning/map_reduce.py)",
        "multi_output",
        _switch(True),
    ),
)


@dataclass(frozen=True)
class Settings:
    """The settings of this process, parsed (see SETTINGS for what each one does)."""

    cache_dir: Path
    ir_cache: bool  # DLVM_EQ_NO_IR_CACHE unset or empty
    num_threads: int | None  # None: unset (codegen/runtime/cpu_count.py counts the CPUs)
    native_pool: bool
    blas_pool: bool
    spin_us: float
    gemm: str  # "0", "1" or "auto"
    epilogues: bool
    multi_output: bool


def read(environ=None) -> Settings:
    """Settings parsed from `environ` (default os.environ); a DlvmError names a bad value (the
    first, in the table's order) and the values its variable accepts."""
    env = os.environ if environ is None else environ
    values = {}
    for s in SETTINGS:
        text = env.get(s.name, "")
        # blanks around a number or switch are a typing accident (" 1 " is 1); a path is kept
        values[s.field] = s.parse(s.name, text if s.parse is _path else text.strip())
    return Settings(**values)


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
