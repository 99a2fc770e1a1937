"""Compile, load and run kernels on the CPU: `CpuKernel` (a callable on numpy arrays that
splits the index range over threads), `BufferPool`, and the kernel cache (memory + disk).

    >>> k = compile_cpu(KernelSpec("axpb", (1000,), [KernelInput("f32")], [Load(0) * 2.0 + 1.0]))
    >>> y = k(np.ones(1000, np.float32))            # one output: an array; several: a tuple
    >>> stats()                                     # {'compiled': 1, 'loaded_from_disk': 0, ...}

Object code is cached under $DLVM_EQ_CACHE_DIR (default ~/.cache/dlvm_eq), keyed by the kernel
spec (`spec_text`), target triple, CPU name and features, llvmlite version and the package
source digest; a second process loads it (well under 1 ms a kernel) instead of generating IR
and compiling (20-60 ms a kernel here), and never loads the IR builders (llvm_cpu and friends).
Object code rather than optimized IR: code generation from optimized IR alone measured ~60% of
a full compile. An entry records the host and symbol it was built for and is checked as an
ELF object before MCJIT sees it (object_check.py): a damaged entry is rebuilt, not a crash.

Shared state (threads; every object here may be used by many Python threads at once):
- `_JIT` (`_Jit`): the MCJIT engine, its address maps, object codes and counters are touched
  only under `_JIT.lock`, compiling included (LLVM itself under llvm_lock.LLVM_LOCK);
- `_HOST` under `_host_lock`; `_pool` (Python threads) created once under `_JIT.lock`;
- `_kernels` (compile_cpu's memo) under `_kernels_lock`: two threads may both build an equal
  kernel, the last one is kept, both are valid;
- `BufferPool`: its free lists and counters under its own lock;
- `CpuKernel`: immutable after construction (its dims array is only read); a reduction's
  partial rows are allocated per call. `KernelCode.text` is built lazily; a race builds the
  same text twice;
- results do not depend on the thread count: maps compute every element alike wherever a
  chunk boundary falls, reductions are cut into slices chosen by their sizes only
  (REDUCE_SLICES, `CpuKernel._run_reduce`), combined in slice order.

Threads: `usable_cpus()` (read once): DLVM_EQ_NUM_THREADS if set, else the affinity mask capped
by the cgroup CPU quota (`cpu_count`); with 1, kernels run on the caller and no helper thread
is started. Parallel kernels run on the native pool (`native_pool`), or on Python threads
(`thread_pool`) with DLVM_EQ_NATIVE_POOL=0; either way the caller takes chunks too and never
waits for a helper that has not claimed one.
"""
from __future__ import annotations

import ctypes
import dataclasses
import math
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import llvmlite.binding as llvm
import numpy as np

from ..cache import source_digest
from ..config import settings
from . import native_pool   # imports nothing of ours at load time (its uses of this module are lazy)
from .kernel import DTYPES, Expr, KernelError, KernelSpec, ReduceSpec, walk
from .kernel_cache import cache_key, shared_cache
from .layout import group_size, spec_layout
from .llvm_lock import LLVM_LOCK
from .object_check import pack_entry, unpack_entry
from .reference import REDUCE_NP

if TYPE_CHECKING:
    from .llvm_cpu import CpuIR

# Work (elements) below which a kernel runs on the calling thread: waking workers costs
# ~10-30 us, about what one core needs for this many elements of a typical fused kernel.
MIN_PARALLEL_WORK = 1 << 16
ALIGN = 64  # chunk boundaries in elements: whole cache lines per thread
CHUNKS_PER_THREAD = 16  # many more chunks than threads: a descheduled thread holds up little
# A long reduction with few outputs is cut into at most this many slices of the reduced axes,
# whatever the thread count (see CpuKernel._run_reduce): enough to share among 16 threads.
REDUCE_SLICES = 64
# Smallest chunk of a parallel map kernel (elements). A claim costs ~0.1 us in the native pool,
# so chunks far smaller than MIN_PARALLEL_WORK are cheap, and with 2 x MIN_PARALLEL_WORK
# elements split in 2, a helper descheduled holding one chunk held half the kernel.
MIN_CHUNK_WORK = 1 << 13


def _make_data_ptr():
    """A fast `a.ctypes.data` (that one costs ~2 us, more than a small kernel): numpy's array
    struct starts with PyObject_HEAD then the data pointer. Checked once; else the slow way."""
    offset = object.__basicsize__
    probe = np.arange(3.0)
    try:
        if ctypes.c_void_p.from_address(id(probe) + offset).value == probe.ctypes.data:
            from_address = ctypes.c_void_p.from_address
            return lambda a: from_address(id(a) + offset).value
    except (ValueError, OSError):  # pragma: no cover - exotic interpreters
        pass
    return lambda a: a.ctypes.data  # pragma: no cover


data_ptr = _make_data_ptr()


# ------------------------------------------------------------------ buffers

def aligned_empty(shape, dtype, align: int = 64) -> np.ndarray:
    """np.empty with the data 64-byte aligned (numpy's large arrays are 16 mod 64), so that
    kernels can write whole cache lines with streaming stores."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + align, np.uint8)
    off = (-data_ptr(raw)) % align
    return raw[off:off + nbytes].view(dtype).reshape(shape)


def _whole_buffer(a: np.ndarray) -> bool:
    """a owns its memory, or is the full aligned view of an aligned_empty buffer."""
    if a.flags.owndata:
        return True
    base = a.base
    return (isinstance(base, np.ndarray) and base.flags.owndata and base.dtype == np.uint8
            and base.ndim == 1 and 0 <= base.nbytes - a.nbytes <= 64)


class BufferPool:
    """Reuse numpy buffers by (shape, dtype): fresh pages cost ~1.7 us per 4 KiB here.

    >>> pool = BufferPool()
    >>> a = pool.acquire((1024,), np.float32); pool.release(a)
    >>> pool.acquire((1024,), np.float32) is a
    True
    """

    def __init__(self, max_bytes: int | None = None):
        self._free: dict[tuple, list[np.ndarray]] = {}
        self._lock = threading.Lock()
        self.max_bytes = max_bytes
        self.bytes_free = 0
        self.hits = self.misses = 0

    def acquire(self, shape, dtype) -> np.ndarray:
        key = (tuple(shape), np.dtype(dtype).str)
        with self._lock:
            free = self._free.get(key)
            if free:
                self.hits += 1
                a = free.pop()
                self.bytes_free -= a.nbytes
                return a
            self.misses += 1
        return aligned_empty(key[0], key[1])

    def release(self, a: np.ndarray) -> None:
        """Give a buffer back; the caller must not use it afterwards."""
        if not (isinstance(a, np.ndarray) and a.flags.c_contiguous and _whole_buffer(a)):
            return  # a view would alias a live buffer
        with self._lock:
            if self.max_bytes is not None and self.bytes_free + a.nbytes > self.max_bytes:
                return
            self._free.setdefault((a.shape, a.dtype.str), []).append(a)
            self.bytes_free += a.nbytes

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self.bytes_free = 0


# ------------------------------------------------------------------ loading compiled code

def spec_text(spec) -> str:
    """A complete linear description of a kernel spec (KernelSpec, ReduceSpec, RowSpec): every
    field, Expr DAG nodes numbered once (a shared subexpression is written once, so the text
    grows with the DAG, not with its tree). Two specs with equal texts are equal."""
    nodes: list[str] = []
    ids: dict[int, int] = {}

    def number(root: Expr) -> int:
        # iterative (walk: operands before users), so deep expressions need no recursion
        for e in walk([root]):
            if id(e) not in ids:
                body = ",".join(enc(getattr(e, f.name)) for f in dataclasses.fields(e))
                ids[id(e)] = len(nodes)
                nodes.append(f"{type(e).__name__}({body})")
        return ids[id(root)]

    def enc(v) -> str:
        if isinstance(v, Expr):
            i = ids.get(id(v))
            return f"#{number(v) if i is None else i}"
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return f"{type(v).__name__}(" + ",".join(
                f"{f.name}={enc(getattr(v, f.name))}" for f in dataclasses.fields(v)) + ")"
        if isinstance(v, (tuple, list)):
            return "(" + ",".join(enc(x) for x in v) + ",)"
        if v is None or isinstance(v, (bool, int, float, str)):
            return repr(v)       # 1, 1.0 and True stay distinct; floats round-trip exactly
        raise TypeError(f"spec_text: unexpected {type(v).__name__} in a kernel spec")

    top = enc(spec)
    return top + "\n" + "\n".join(nodes)


@dataclasses.dataclass
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


class _Jit:
    """One MCJIT engine for the process; kernels are added as object files.

    `kernel(kind, spec, build_ir)` is the fast path: the disk entry is keyed by the spec itself
    (`spec_text`), the host (triple, CPU, features, llvmlite and so LLVM version) and the package
    source digest, and holds the symbol and the object code, so that a kernel found on disk is
    loaded without generating its LLVM IR. `address(kir)` loads a kernel keyed by its IR text."""

    def __init__(self):
        self.lock = threading.RLock()
        self.engine = None
        self.addresses: dict[str, int] = {}   # cache key -> function address
        self.by_spec: dict[str, tuple[int, str]] = {}   # spec key -> (address, symbol)
        self.symbols: dict[str, int] = {}     # symbol -> address (a symbol is a hash of its IR)
        self.objects: dict[str, bytes] = {}   # symbol -> object code loaded (a few KiB each)
        self.counters = {"compiled": 0, "loaded_from_disk": 0, "memory_hits": 0}

    def kernel(self, kind: str, spec, build_ir: Callable[[], CpuIR], layout=None) -> KernelCode:
        key = cache_key("spec", kind, spec_text(spec), host_key(), source_digest())
        with self.lock:
            hit = self.by_spec.get(key)
            if hit is not None:
                self.counters["memory_hits"] += 1
                addr, symbol = hit
                return KernelCode(addr, symbol, layout, kind, build_ir)
            disk = shared_cache()
            data = disk.get("cpu", key)
            if data is not None:
                entry = unpack_entry(data, host_key())     # header and ELF structure checked
                if entry is not None and _SYMBOL.fullmatch(entry[0].encode()):
                    symbol, obj = entry
                    try:
                        addr = self._load(obj, symbol)
                        self.counters["loaded_from_disk"] += 1
                        self.by_spec[key] = (addr, symbol)
                        return KernelCode(addr, symbol, layout, kind, build_ir)
                    except RuntimeError:   # checksum fine but unloadable: rebuild below
                        pass
                disk.corrupt += 1
            kir = build_ir()
            obj = self.objects.get(kir.symbol)
            if obj is None:
                obj = compile_object(kir.text, vectorize=kir.kind != "gemm")   # explicit vectors
                self.counters["compiled"] += 1
            else:                      # the same IR under another spec: compiled already
                self.counters["memory_hits"] += 1
            addr = self._load(obj, kir.symbol)
            disk.put("cpu", key, pack_entry(kir.symbol, host_key(), obj))
            self.by_spec[key] = (addr, kir.symbol)
            return KernelCode(addr, kir.symbol, layout if layout is not None else kir.layout, kind,
                              build_ir, kir)

    def address(self, kir: CpuIR) -> int:
        key = cache_key(kir.text, host_key())
        with self.lock:
            if key in self.addresses:
                self.counters["memory_hits"] += 1
                return self.addresses[key]
            addr = self.symbols.get(kir.symbol)
            if addr is not None:       # loaded already through kernel()
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
            if obj is None:
                obj = compile_object(kir.text)
                addr = self._load(obj, kir.symbol)
                self.counters["compiled"] += 1
                disk.put("cpu", key, pack_entry(kir.symbol, host_key(), obj))
            self.addresses[key] = addr
            return addr

    def _load(self, obj: bytes, symbol: str) -> int:
        addr = self.symbols.get(symbol)
        if addr is not None:          # already in the engine: a second copy would clash
            return addr
        if self.engine is None:
            self.engine = _make_engine()
        self.engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        self.engine.finalize_object()
        addr = self.engine.get_function_address(symbol)
        if not addr:
            raise RuntimeError(f"symbol {symbol} not found in object code")
        self.symbols[symbol] = addr
        self.objects[symbol] = obj
        return addr


_host_lock = threading.Lock()
_HOST: tuple[str, str] | None = None


def _host() -> tuple[str, str]:
    """(triple, host key), LLVM's native target initialized: what loading object code needs.
    The key is what object code depends on besides its source: triple, CPU name and features,
    llvmlite (and so LLVM) version; the same string as `llvm_cpu.host_key()`, computed without
    loading the IR builders."""
    global _HOST
    with _host_lock:
        if _HOST is None:
            import llvmlite
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            triple = llvm.get_default_triple()
            _HOST = (triple, "|".join([triple, llvm.get_host_cpu_name(),
                                       llvm.get_host_cpu_features().flatten(), llvmlite.__version__]))
        return _HOST


def host_key() -> str:
    return _host()[1]


def cpu_ir(spec) -> CpuIR:
    from .llvm_cpu import cpu_ir as build  # the IR builders load on a cache miss only
    return build(spec)


def compile_object(ir_text: str, vectorize: bool = True) -> bytes:
    from .llvm_cpu import compile_object as build
    return build(ir_text, vectorize)


def _make_engine():
    """An MCJIT engine with its own target machine (the engine takes ownership of it)."""
    triple = _host()[0]
    own = llvm.Target.from_triple(triple).create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
        opt=3, codemodel="jitdefault")
    with LLVM_LOCK:             # LLVM's global context: see llvm_lock
        empty = llvm.parse_assembly("")
        empty.triple = triple
        return llvm.create_mcjit_compiler(empty, own)


_JIT = _Jit()


def stats() -> dict:
    """Counters: compiled, loaded_from_disk, memory_hits, corrupt (disk entries rebuilt)."""
    with _JIT.lock:
        return dict(_JIT.counters, corrupt=shared_cache().corrupt)


_pool: ThreadPoolExecutor | None = None


_CPUS: int | None = None


def usable_cpus() -> int:
    """Threads for parallel kernels, the caller's included: DLVM_EQ_NUM_THREADS, else the
    CPUs of the affinity mask capped by the cgroup CPU quota (`cpu_count`); read once."""
    global _CPUS
    if _CPUS is None:
        from .cpu_count import thread_count
        _CPUS = thread_count()
    return _CPUS


def thread_pool() -> ThreadPoolExecutor:
    """The persistent worker threads (one per usable CPU), created on first use."""
    global _pool
    if _pool is None:
        with _JIT.lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(max_workers=usable_cpus(), thread_name_prefix="dq-kernel")
    return _pool


def _native():
    """The native worker pool, unless DLVM_EQ_NATIVE_POOL=0 (then Python threads are used)."""
    if not settings().native_pool:
        return None
    return native_pool.native_pool()


def rest_workers() -> None:
    """A compiled program call has returned: the native pool's idle workers go to sleep now
    rather than spin out their budget while the user's own code (numpy and its BLAS threads)
    runs. Costs the next call a futex wake; the caller starts its first kernel alone meanwhile."""
    pool = native_pool._POOL
    if RESTING and pool is not None:
        pool.rest()


# Whether rest_workers acts: a switch for measuring (benchmarks/contention.py runs both ways).
RESTING = True


def _run_chunks(fn, chunks: list[tuple], threads: int) -> None:
    """Run fn(*args) for every args in `chunks` on up to `threads` threads, the caller's
    included. Chunks are taken from a shared counter, so a thread that the OS descheduled does
    not hold up the others: there are more chunks than threads. The native pool's workers
    are used where available (they wake in well under a microsecond; Python's in 15-60 us)."""
    if len(chunks) == 1 or threads == 1:
        for args in chunks:
            fn(*args)
        return
    pool = _native()
    if pool is not None and len(chunks[0]) <= pool.max_args:
        pool.run(ctypes.cast(fn, ctypes.c_void_p).value, chunks, threads)
        return
    _run_python(fn, chunks, threads)


def _run_ranges(fn, ranges: list[tuple[int, int]], tail: tuple, threads: int) -> None:
    """_run_chunks for calls fn(lo, hi, *tail), the kernels' usual shape."""
    if len(ranges) == 1 or threads == 1:
        for lo, hi in ranges:
            fn(lo, hi, *tail)
        return
    pool = _native()
    if pool is not None and 2 + len(tail) <= pool.max_args:
        pool.run_ranges(ctypes.cast(fn, ctypes.c_void_p).value, ranges, tail, threads)
        return
    _run_python(fn, [(lo, hi, *tail) for lo, hi in ranges], threads)


def _run_python(fn, chunks: list[tuple], threads: int) -> None:
    """Python threads take chunks from one shared iterator (next() on it is atomic under the
    GIL); the caller works too, and waits only for helpers that started, not for queued ones."""
    todo = iter(chunks)

    def work():
        for args in todo:
            fn(*args)
    futures = [thread_pool().submit(work) for _ in range(min(threads, len(chunks)) - 1)]
    work()
    for f in futures:
        if not f.cancel():           # running (it may hold a chunk) or finished
            f.result()


def _split(n: int, parts: int, align: int = ALIGN) -> list[tuple[int, int]]:
    step = -(-n // parts)
    step = -(-step // align) * align if step > align else step
    return [(lo, min(lo + step, n)) for lo in range(0, n, step)]


# ------------------------------------------------------------------ kernels

class CpuKernel:
    """A compiled kernel. Call it on C-contiguous numpy arrays (scalars are accepted for
    inputs of size 1); outputs come from `out=`, the `pool`, or are freshly allocated."""

    def __init__(self, spec: KernelSpec | ReduceSpec, pool: BufferPool | None = None,
                 threads: int | None = None):
        self.spec = spec
        self.pool = pool
        self.threads = threads or usable_cpus()
        # the IR is generated only when the kernel is not on disk (or `.ir.text` is read)
        self.ir = _JIT.kernel("map" if isinstance(spec, KernelSpec) else "reduce", spec,
                              lambda: cpu_ir(spec), spec_layout(spec))
        self.address = self.ir.address
        self.dims = self.ir.layout.dims_array()
        self._dims_ptr = self.dims.ctypes.data
        self._in_dtypes = [DTYPES[d] for d in spec.input_dtypes]
        self._in_sizes = [inp.min_size(spec.shape) for inp in spec.inputs]
        is_map = isinstance(spec, KernelSpec)
        n_ptrs = (len(spec.outputs) if is_map else 1) + len(spec.inputs) + 1
        proto = ctypes.CFUNCTYPE(None, *([ctypes.c_int64] * (2 if is_map else 4)),
                                 *([ctypes.c_void_p] * n_ptrs))
        self._fn = proto(self.address)  # a CFUNCTYPE call releases the GIL
        self._size = math.prod(spec.shape)
        self._n_in = len(spec.inputs)
        if is_map:
            self.out_shapes = [spec.shape] * len(spec.outputs)
            self.out_dtypes = [DTYPES[d] for d in spec.output_dtypes]
        else:
            self.out_shapes = [spec.out_shape]
            self.out_dtypes = [DTYPES[spec.dtype]]

    def __repr__(self):
        return f"CpuKernel({self.spec.name!r}, symbol={self.ir.symbol})"

    def _inputs(self, arrays) -> list:
        if len(arrays) != self._n_in:
            raise KernelError(f"{self.spec.name}: expected {self._n_in} inputs, got {len(arrays)}")
        arrays = list(arrays)
        for i, (a, dt, size) in enumerate(zip(arrays, self._in_dtypes, self._in_sizes)):
            if type(a) is not np.ndarray:
                a = arrays[i] = np.asarray(a, dtype=dt)
            if a.dtype != dt or a.size < size or not a.flags.c_contiguous:
                raise KernelError(f"{self.spec.name}: input {i} must be a C-contiguous {dt} array with at "
                                  f"least {size} elements, got {a.dtype} {a.shape}")
        return arrays

    def _outputs(self, out) -> list[np.ndarray]:
        if out is None:
            if self.pool is not None:
                return [self.pool.acquire(s, d) for s, d in zip(self.out_shapes, self.out_dtypes)]
            return [aligned_empty(s, d) for s, d in zip(self.out_shapes, self.out_dtypes)]
        outs = [out] if isinstance(out, np.ndarray) else list(out)
        for j, (o, s, d) in enumerate(zip(outs, self.out_shapes, self.out_dtypes)):
            if o.shape != s or o.dtype != d or not o.flags.c_contiguous:
                raise KernelError(f"{self.spec.name}: out[{j}] must be a C-contiguous {d} array of shape {s}")
        if len(outs) != len(self.out_shapes):
            raise KernelError(f"{self.spec.name}: expected {len(self.out_shapes)} outputs")
        return outs

    def __call__(self, *inputs, out=None):
        ins = self._inputs(inputs)
        outs = self._outputs(out)
        if isinstance(self.spec, KernelSpec):
            self._run_map(ins, outs)
        else:
            self._run_reduce(ins, outs[0])
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _run_map(self, ins, outs):
        n = self._size
        if n == 0:
            return
        ptrs = [data_ptr(o) for o in outs]
        ptrs += [data_ptr(a) for a in ins]
        ptrs.append(self._dims_ptr)
        if n < 2 * MIN_PARALLEL_WORK or self.threads == 1:
            self._fn(0, n, *ptrs)  # the common small case: no splitting at all
            return
        parts = min(CHUNKS_PER_THREAD * self.threads, n // MIN_CHUNK_WORK)
        _run_ranges(self._fn, _split(n, parts), ptrs, self.threads)

    def _run_reduce(self, ins, out):
        spec, lay = self.spec, self.ir.layout
        n_out = out.size
        n_red = group_size(lay, 1) if 0 not in spec.shape else 0
        if n_out == 0:
            return
        if n_red == 0:
            out.fill(spec.init)
            return
        in_ptrs = [data_ptr(a) for a in ins]
        work = n_out * n_red
        # How a reduction is cut depends on its sizes only, never on the thread count: the
        # result is then the same bits with 1, 2 or 64 threads, busy cores or not.
        parts = max(1, min(REDUCE_SLICES, work // MIN_PARALLEL_WORK))
        if parts == 1 or n_out >= 4 * parts:
            # Split the outputs: one call reduces an output whole, so where the outputs are
            # split (here by thread count) changes no result.
            split = max(1, min(CHUNKS_PER_THREAD * self.threads, work // MIN_PARALLEL_WORK))
            _run_ranges(self._fn, _split(n_out, split, 1 if n_out < ALIGN * split else ALIGN),
                        (0, n_red, data_ptr(out), *in_ptrs, self._dims_ptr), self.threads)
            self._apply_init(out)
            return
        # Few outputs, long reductions: `parts` fixed slices, each reduced into its own partial
        # row by whichever thread takes it, then the rows combined in slice order.
        chunks = _split(n_red, parts, 1)
        partial = np.empty((len(chunks), n_out), dtype=out.dtype)
        _run_chunks(self._fn, [(0, n_out, lo, hi, data_ptr(partial[t]), *in_ptrs, self._dims_ptr)
                               for t, (lo, hi) in enumerate(chunks)], self.threads)
        with np.errstate(all="ignore"):
            REDUCE_NP[spec.op].reduce(partial, axis=0, out=out.reshape(-1))
        self._apply_init(out)

    def _apply_init(self, out):
        if self.spec.init != self.spec.identity:  # the kernel folds from the identity
            with np.errstate(all="ignore"):
                REDUCE_NP[self.spec.op](out, np.asarray(self.spec.init, out.dtype), out=out)


_kernels: dict = {}
_kernels_lock = threading.Lock()


def compile_cpu(spec: KernelSpec | ReduceSpec, pool: BufferPool | None = None) -> CpuKernel:
    """A CpuKernel for `spec`, reused for equal specs (and pools) within the process."""
    key = (spec, id(pool))
    with _kernels_lock:
        k = _kernels.get(key)
    if k is None:
        k = CpuKernel(spec, pool=pool)
        with _kernels_lock:
            _kernels[key] = k
    return k

