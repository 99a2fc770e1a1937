"""The process's kernel loader (`JIT`): compile or load kernels' object code, memory + disk cache.

    >>> code = JIT.kernel("map", spec, lambda: cpu_ir(spec), spec_layout(spec))
    >>> code.address                                  # the kernel's entry point
    >>> stats()                                       # {'compiled': 1, 'loaded_from_disk': 0, ...}

Object code is cached under $DLVM_EQ_CACHE_DIR (default ~/.cache/dlvm_eq), keyed by the kernel
spec (`spec_text`), target triple, CPU name and features, llvmlite version and the package
source digest; a second process loads it (well under 1 ms a kernel) instead of generating IR
and compiling (20-60 ms a kernel here), and never loads the IR builders (llvm_cpu and friends).
Object code rather than optimized IR: code generation from optimized IR alone measured ~60% of
a full compile. An entry records the host and symbol it was built for and is checked as an
ELF object before it is loaded (object_check.py): a damaged entry is rebuilt, not a crash.
Objects are loaded without LLVM where object_loader.py can (x86-64 Linux), else by MCJIT; with
the host key read from the disk cache (`_host`), a warm process never imports llvmlite.binding.

Shared state (threads): `JIT` (`Jit`): the MCJIT engine, its address maps, object codes and
counters are touched only under `JIT.lock`; compiling is not (each thread compiles in its own
LLVM context, cpu/llvm_unlocked.py). A kernel is still built once: a second thread asking for a
spec being built waits for the first (`Jit.building`, one event per spec key) and takes its
result. `_HOST` under `_host_lock`. `KernelCode.text` is built lazily; a race builds the same
text twice.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import llvmlite  # the version only: llvmlite.binding (LLVM itself) loads on a miss

from ...cache import source_digest
from ...records import dataclass
from ..kernels.kernel_cache import cache_key, shared_cache
from ..kernels.spec_text import spec_text
from ..llvm.llvm_lock import LLVM_LOCK
from . import object_loader
from .object_check import pack_entry, unpack_entry

if TYPE_CHECKING:
    from ..cpu.llvm_cpu import CpuIR


@dataclass
class KernelCode:
    """A loaded kernel: its address, symbol and loop layout. Duck-typed like `CpuIR`; the LLVM
    IR `text` is generated on first access (a kernel loaded from disk never needs it)."""

    address: int
    symbol: str
    layout: object
    kind: str
    build: Callable | None = dataclasses.field(default=None, repr=False)
    _ir: CpuIR | None = dataclasses.field(default=None, repr=False)

    @property
    def text(self) -> str:
        if self._ir is None:
            self._ir = self.build()
        return self._ir.text


_SYMBOL = re.compile(rb"dq_[A-Za-z0-9_]{1,64}")


class Jit:
    """The process's loaded kernels: object files loaded by object_loader.py, or added to one
    MCJIT engine (created on first need) where it cannot.

    `kernel(kind, spec, build_ir)` is the fast path: the disk entry is keyed by the spec itself
    (`spec_text`), the host (triple, CPU, features, llvmlite and so LLVM version) and the package
    source digest, and holds the symbol and the object code, so that a kernel found on disk is
    loaded without generating its LLVM IR. `address(kir)` loads a kernel keyed by its IR text."""

    def __init__(self):
        self.lock = threading.RLock()
        self.engine = None
        self.addresses: dict[str, int] = {}  # cache key -> function address
        self.by_spec: dict[str, tuple[int, str]] = {}  # spec key -> (address, symbol)
        self.symbols: dict[str, int] = {}  # symbol -> address (a symbol is a hash of its IR)
        self.objects: dict[str, bytes] = {}  # symbol -> object code loaded (a few KiB each)
        # spec key -> (the building thread's id, set when it is done): a second thread asking
        # for that kernel waits instead of generating and compiling it again
        self.building: dict[str, tuple[int, threading.Event]] = {}
        # loaded_natively: of the objects loaded (compiled or from disk), those loaded without LLVM
        self.counters = {
            "compiled": 0,
            "loaded_from_disk": 0,
            "memory_hits": 0,
            "loaded_natively": 0,
        }

    def kernel(self, kind: str, spec, build_ir: Callable[[], CpuIR], layout=None) -> KernelCode:
        key = cache_key("spec", kind, spec_text(spec), host_key(), source_digest())
        me = threading.get_ident()
        while True:
            with self.lock:
                hit = self.by_spec.get(key)
                if hit is not None:
                    self.counters["memory_hits"] += 1
                    addr, symbol = hit
                    return KernelCode(addr, symbol, layout, kind, build_ir)
                pending = self.building.get(key)
                if pending is None or pending[0] == me:  # (a build that asks for itself: build)
                    done = threading.Event()
                    self.building[key] = (me, done)
                    break
            # another thread builds this kernel: wait, then take it from memory (or, where that
            # build failed, build it here)
            pending[1].wait()
        try:
            return self._build(key, kind, build_ir, layout)
        finally:
            with self.lock:
                if self.building.get(key, (0, None))[1] is done:
                    del self.building[key]
            done.set()

    def _build(self, key: str, kind: str, build_ir, layout) -> KernelCode:
        """The kernel of spec key `key` from the disk cache, else generated and compiled."""
        with self.lock:
            disk = shared_cache()
            data = disk.get("cpu", key)
            if data is not None:
                entry = unpack_entry(data, host_key())  # header and ELF structure checked
                if entry is not None and _SYMBOL.fullmatch(entry[0].encode()):
                    symbol, obj = entry
                    try:
                        addr = self._load(obj, symbol)
                        self.counters["loaded_from_disk"] += 1
                        self.by_spec[key] = (addr, symbol)
                        return KernelCode(addr, symbol, layout, kind, build_ir)
                    except RuntimeError:  # checksum fine but unloadable: rebuild below
                        pass
                disk.corrupt += 1
        # built outside the lock: other threads build other kernels meanwhile (parallel_build)
        kir = build_ir()
        with self.lock:
            obj = self.objects.get(kir.symbol)
        if obj is None:
            obj = compile_object(kir.text, *family_pipeline(kir.kind))
            compiled = True
        else:  # the same IR under another spec: compiled already
            compiled = False
        with self.lock:
            self.counters["compiled" if compiled else "memory_hits"] += 1
            addr = self._load(obj, kir.symbol)
            disk.put("cpu", key, pack_entry(kir.symbol, host_key(), obj))
            self.by_spec[key] = (addr, kir.symbol)
            return KernelCode(
                addr, kir.symbol, layout if layout is not None else kir.layout, kind, build_ir, kir
            )

    def address(self, kir: CpuIR) -> int:
        key = cache_key(kir.text, host_key())
        with self.lock:
            if key in self.addresses:
                self.counters["memory_hits"] += 1
                return self.addresses[key]
            addr = self.symbols.get(kir.symbol)
            if addr is not None:  # loaded already through kernel()
                self.counters["memory_hits"] += 1
                self.addresses[key] = addr
                return addr
            disk = shared_cache()
            data = disk.get("cpu", key)
            entry = None if data is None else unpack_entry(data, host_key(), kir.symbol)
            obj = None
            if entry is not None:
                try:
                    addr = self._load(entry[1], kir.symbol)
                    obj = entry[1]
                    self.counters["loaded_from_disk"] += 1
                except RuntimeError:  # checksum fine but unloadable: rebuild below
                    pass
            if data is not None and obj is None:
                disk.corrupt += 1
            if obj is not None:
                self.addresses[key] = addr
                return addr
        # compiled outside the lock (as in kernel()): the native pool's code, built on another
        # thread during a compile (native_pool.prebuild), holds up no kernel's load meanwhile
        obj = compile_object(kir.text)
        with self.lock:
            addr = self.addresses.get(key)
            if addr is not None:  # another thread compiled it meanwhile
                self.counters["memory_hits"] += 1
                return addr
            addr = self._load(obj, kir.symbol)
            self.counters["compiled"] += 1
            disk.put("cpu", key, pack_entry(kir.symbol, host_key(), obj))
            self.addresses[key] = addr
            return addr

    def _load(self, obj: bytes, symbol: str) -> int:
        addr = self.symbols.get(symbol)
        if addr is not None:  # already loaded: a second copy would clash in MCJIT
            return addr
        addr = 0
        if object_loader.supported():  # without LLVM (object_loader.py); else MCJIT
            try:
                addr = object_loader.load(obj, symbol)
                self.counters["loaded_natively"] += 1
            except object_loader.Unsupported:
                addr = 0
        if not addr:
            addr = self._mcjit_load(obj, symbol)
        self.symbols[symbol] = addr
        self.objects[symbol] = obj
        return addr

    def _mcjit_load(self, obj: bytes, symbol: str) -> int:
        import llvmlite.binding as llvm

        if self.engine is None:
            self.engine = _make_engine()
        self.engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        self.engine.finalize_object()
        addr = self.engine.get_function_address(symbol)
        if not addr:
            raise RuntimeError(f"symbol {symbol} not found in object code")
        return addr


_host_lock = threading.Lock()
_HOST: tuple[str, str] | None = None


def _host() -> tuple[str, str]:
    """(triple, host key). The key is what object code depends on besides its source: triple,
    CPU name and features, llvmlite (and so LLVM) version; the same string as
    `llvm_cpu.host_key()`. LLVM computes it once per machine; later processes find it in the
    disk cache under a fingerprint of the CPU (`_fingerprint`), without loading LLVM."""
    global _HOST
    with _host_lock:
        if _HOST is None:
            fingerprint = _fingerprint()
            _HOST = _recorded_host(fingerprint) if fingerprint else None
            if _HOST is None:
                _HOST = _llvm_host()
                if fingerprint:
                    record = json.dumps({"triple": _HOST[0], "key": _HOST[1]})
                    shared_cache().put("host", fingerprint, record.encode())
        return _HOST


def _llvm_host() -> tuple[str, str]:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    triple = llvm.get_default_triple()
    features = llvm.get_host_cpu_features().flatten()
    return triple, "|".join([triple, llvm.get_host_cpu_name(), features, llvmlite.__version__])


def _fingerprint() -> str | None:
    """A digest of what LLVM reads the host's CPU name and features from (the kernel's view of
    the CPU: vendor, family, model, stepping, flags), the machine and llvmlite's version; None
    where /proc/cpuinfo cannot be read (then LLVM is asked)."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            text = f.read(1 << 16)
    except OSError:
        return None
    first = text.split(b"\n\n", 1)[0]  # the first processor's block
    fields = (b"vendor_id", b"cpu family", b"model", b"model name", b"stepping", b"flags")
    lines = sorted(ln for ln in first.splitlines() if ln.split(b":", 1)[0].strip() in fields)
    if not any(ln.startswith(b"flags") for ln in lines):
        return None
    h = hashlib.sha256(b"host-1\0" + platform.machine().encode() + b"\0")
    h.update(llvmlite.__version__.encode() + b"\0" + b"\n".join(lines))
    return h.hexdigest()


def _recorded_host(fingerprint: str) -> tuple[str, str] | None:
    data = shared_cache().get("host", fingerprint)
    try:
        record = json.loads(data) if data is not None else None
        triple, key = record["triple"], record["key"]
    except (ValueError, TypeError, KeyError):
        return None
    parts = key.split("|") if isinstance(key, str) and isinstance(triple, str) else []
    if len(parts) != 4 or parts[0] != triple or parts[3] != llvmlite.__version__:
        return None
    return triple, key


def host_key() -> str:
    return _host()[1]


def host_features() -> str:
    """LLVM's host CPU features ("+avx2,+fma,-avx512f,..."), from the host key."""
    return _host()[1].split("|")[2]


def cpu_ir(spec) -> CpuIR:
    from ..cpu.llvm_cpu import cpu_ir as build  # the IR builders load on a cache miss only

    return build(spec)


def compile_object(ir_text: str, speed: int = 3, vectorize: bool = True) -> bytes:
    from ..cpu.llvm_cpu import compile_object as build

    return build(ir_text, vectorize, speed)


def family_pipeline(kind: str) -> tuple[int, bool]:
    """(LLVM speed level, vectorize) for a kernel family (cpu/llvm_cpu.FAMILY_PIPELINE)."""
    from ..cpu.llvm_cpu import family_pipeline as pipeline

    return pipeline(kind)


def _make_engine():
    """An MCJIT engine with its own target machine (the engine takes ownership of it)."""
    import llvmlite.binding as llvm

    triple = _host()[0]
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    own = llvm.Target.from_triple(triple).create_target_machine(
        cpu=llvm.get_host_cpu_name(),
        features=llvm.get_host_cpu_features().flatten(),
        opt=3,
        codemodel="jitdefault",
    )
    with LLVM_LOCK:  # LLVM's global context: see llvm_lock
        empty = llvm.parse_assembly("")
        empty.triple = triple
        return llvm.create_mcjit_compiler(empty, own)


JIT = Jit()


def stats() -> dict:
    """Counters: compiled, loaded_from_disk, memory_hits, corrupt (disk entries rebuilt)."""
    with JIT.lock:
        return dict(JIT.counters, corrupt=shared_cache().corrupt)
