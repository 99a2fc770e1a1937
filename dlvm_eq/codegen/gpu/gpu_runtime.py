"""Launch generated PTX through CuPy: `GpuKernel` is a callable on CuPy (or numpy) arrays.

    >>> k = compile_gpu(spec)          # raises GpuUnavailable without CuPy or a working GPU
    >>> y = k(cupy.asarray(x))         # a CuPy array

PTX is generated for the device's compute capability (the newest of llvm_ptx.ARCHS not above
it), cached in memory per (kernel, device) and on disk per (IR, arch); the driver JIT-compiles
it on load. Integer arguments are numpy scalars of the kernel's declared index width.

Shared state (threads): `_ptx_cache`, `_functions` and `counters` are read and written under
`_lock`; two threads asking for the same new kernel may both generate its PTX (equal text),
the first stored wins. A GpuKernel / GpuRowKernel is immutable after construction; every
call allocates its outputs (and a reduction's partial rows) from CuPy's pool.
"""

from __future__ import annotations

import threading

import llvmlite
import numpy as np

from ...errors import DlvmError
from ..kernels.kernel_cache import DiskCache, cache_key, shared_cache
from ..kernels.kernel_spec import KernelSpec, ReduceSpec
from ..kernels.layout import group_size
from ..kernels.rows import RowSpec
from ..kernels.spec import DTYPES, KernelError
from .llvm_ptx import ARCHS, PtxKernel, compile_ptx, kernel_kind, ptx_ir, row_int_args

BLOCK = 256
BLOCKS_PER_SM = 32  # grid-stride loops: enough blocks to fill the GPU, no more
MIN_SLICE = 256  # reduced elements per thread at least, when a reduction is split


class GpuUnavailable(DlvmError):
    """CuPy is not installed, or CUDA has no usable device/driver."""


def cupy_module():
    """The cupy module, or GpuUnavailable saying why it cannot be used."""
    try:
        import cupy
    except ImportError as e:
        raise GpuUnavailable(
            f"the gpu target needs CuPy: pip install 'dlvm_eq[gpu]' (cupy-cuda12x) ({e})"
        ) from None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise GpuUnavailable("CUDA reports no GPU device")
    except GpuUnavailable:
        raise
    except Exception as e:  # CUDARuntimeError: no driver, insufficient driver, ...
        raise GpuUnavailable(f"CUDA is not usable here: {e}") from None
    return cupy


def gpu_available() -> bool:
    try:
        cupy_module()
        return True
    except GpuUnavailable:
        return False


def arch_for(compute_capability: str | int) -> str:
    """The newest supported PTX target not above the device: arch_for('86') == 'sm_86'."""
    cc = int(compute_capability)
    ok = [a for a in ARCHS if int(a[3:]) <= cc]
    if not ok:
        raise GpuUnavailable(f"compute capability {cc} is below the oldest target {ARCHS[0]}")
    return ok[-1]


_lock = threading.Lock()
_ptx_cache: dict = {}  # (spec, arch) -> PtxKernel
_functions: dict = {}  # (symbol, arch, device id) -> (module, function)
counters = {"ptx_generated": 0, "ptx_from_disk": 0}


def _spec_ir(spec, arch: str) -> tuple:
    """(LLVM IR text, symbol, layout, integer bits, kind) of an elementwise/reduce/row spec."""
    return (*ptx_ir(spec, arch), kernel_kind(spec))


def ptx_for(spec, arch: str, disk: DiskCache | None = None, build=_spec_ir) -> PtxKernel:
    """PTX for `spec` on `arch`, from memory, the disk cache, or the code generator `build`
    (spec, arch) -> (LLVM IR text, symbol, layout, integer bits, kind); other kernel families
    (pools) pass their own builder and share these caches."""
    key = (spec, arch)
    with _lock:
        if key in _ptx_cache:
            return _ptx_cache[key]
    text, symbol, layout, bits, kind = build(spec, arch)
    disk = disk or shared_cache()
    dkey = cache_key(text, arch, llvmlite.__version__)
    raw = disk.get(f"ptx-{arch}", dkey)
    if raw is None:
        ptx = compile_ptx(text, arch)
        disk.put(f"ptx-{arch}", dkey, ptx.encode())
    else:
        ptx = raw.decode()
    kp = PtxKernel(ptx, symbol, layout, bits, kind)
    with _lock:
        counters["ptx_generated" if raw is None else "ptx_from_disk"] += 1
        return _ptx_cache.setdefault(key, kp)  # a thread that lost the race takes the first


class _Loaded:
    """A spec's PTX loaded on the current CUDA device: the function, its integer width, the
    device's SM count (grid sizes)."""

    def __init__(self, spec):
        cp = self.cp = cupy_module()
        dev = cp.cuda.Device()
        self.spec = spec
        self.arch = arch_for(dev.compute_capability)
        self.ptx = ptx_for(spec, self.arch)
        self._module, self._fn = load_function(cp, self.ptx, self.arch, dev.id)
        self.int_t = np.int32 if self.ptx.index_bits == 32 else np.int64
        self._sms = dev.attributes.get("MultiProcessorCount", 80)


class GpuKernel(_Loaded):
    """A kernel loaded on the current CUDA device."""

    def __init__(self, spec: KernelSpec | ReduceSpec):
        super().__init__(spec)
        self._tail = [self.int_t(v) for v in self.ptx.int_args()]
        self._in_dtypes = [DTYPES[d] for d in spec.input_dtypes]
        self._in_sizes = [inp.min_size(spec.shape) for inp in spec.inputs]
        if isinstance(spec, KernelSpec):
            self.out_shapes = [spec.shape] * len(spec.outputs)
            self.out_dtypes = [DTYPES[d] for d in spec.output_dtypes]
        else:
            self.out_shapes, self.out_dtypes = [spec.out_shape], [DTYPES[spec.dtype]]

    def _grid(self, n: int) -> tuple[int]:
        return (max(1, min(-(-n // BLOCK), self._sms * BLOCKS_PER_SM)),)

    def _reduce(self, ins, out, kw):
        """One thread per output; with few outputs, blockIdx.y also splits the reduced
        elements into slices whose partial results are then combined by CuPy."""
        n_out = out.size
        n_red = group_size(self.ptx.layout, 1) if 0 not in self.spec.shape else 0
        if n_out == 0:
            return
        if n_red == 0:
            out.fill(self.spec.init)
            return
        block = min(BLOCK, -(-n_out // 32) * 32)
        wanted = self._sms * 2048 // max(n_out, 1)  # threads to fill the GPU
        slices = max(1, min(wanted, n_red // MIN_SLICE, 65535))
        chunk = -(-n_red // slices)
        slices = -(-n_red // chunk)
        grid = (max(1, min(-(-n_out // block), self._sms * BLOCKS_PER_SM)), slices)
        target = out if slices == 1 else self.cp.empty((slices, n_out), out.dtype)
        self._fn(
            grid,
            (block,),
            (self.int_t(n_out), self.int_t(n_red), self.int_t(chunk), target, *ins, *self._tail),
            **kw,
        )
        if slices > 1:
            combine = {"add": "sum", "mul": "prod", "max": "max", "min": "min"}[self.spec.op]
            getattr(target, combine)(axis=0, out=out.reshape(-1))
        if self.spec.init != self.spec.identity:  # the kernel folds from the identity
            init = self.cp.asarray(self.spec.init, dtype=out.dtype)
            {
                "add": self.cp.add,
                "mul": self.cp.multiply,
                "max": self.cp.maximum,
                "min": self.cp.minimum,
            }[self.spec.op](out, init, out=out)

    def __call__(self, *inputs, out=None, stream=None):
        cp = self.cp
        if len(inputs) != len(self._in_dtypes):
            raise KernelError(
                f"{self.spec.name}: expected {len(self._in_dtypes)} inputs, got {len(inputs)}"
            )
        ins = []
        for i, (a, dt, size) in enumerate(zip(inputs, self._in_dtypes, self._in_sizes)):
            a = cp.ascontiguousarray(
                cp.asarray(a, dtype=dt) if not hasattr(a, "dtype") else cp.asarray(a)
            )
            if a.dtype != dt or a.size < size:
                raise KernelError(
                    f"{self.spec.name}: input {i} must be {dt} with at least {size} elements"
                )
            ins.append(a)
        outs = (
            [cp.empty(s, d) for s, d in zip(self.out_shapes, self.out_dtypes)]
            if out is None
            else ([out] if not isinstance(out, (tuple, list)) else list(out))
        )
        kw = {} if stream is None else {"stream": stream}
        if isinstance(self.spec, KernelSpec):
            n = self.spec.size
            if n:
                self._fn(self._grid(n), (BLOCK,), (self.int_t(n), *outs, *ins, *self._tail), **kw)
        else:
            self._reduce(ins, outs[0], kw)
        return outs[0] if len(outs) == 1 else tuple(outs)


def load_function(cp, kp: PtxKernel, arch: str, device: int):
    """(module, function) of a PTX kernel loaded on a device, once per process."""
    fkey = (kp.symbol, arch, device)
    with _lock:
        if fkey not in _functions:
            module = cp.cuda.function.Module()
            module.load(kp.ptx.encode())  # cuModuleLoadData takes PTX text
            _functions[fkey] = (module, module.get_function(kp.symbol))
        return _functions[fkey]


ROW_BLOCK = 128  # threads per block of a row kernel (one row per thread)


class GpuRowKernel(_Loaded):
    """A row kernel (kernels.rows.RowSpec) on the current CUDA device: one thread per row.
    `run(ins, outs, reds)` on C-contiguous device arrays, as the CPU RowKernel."""

    def __init__(self, spec: RowSpec):
        super().__init__(spec)
        self._tail = [self.int_t(v) for v in row_int_args(spec)]

    def run(self, ins, outs, reds, stream=None) -> None:
        rows = self.spec.rows
        if rows == 0:
            return
        grid = (max(1, min(-(-rows // ROW_BLOCK), self._sms * BLOCKS_PER_SM)),)
        kw = {} if stream is None else {"stream": stream}
        self._fn(grid, (ROW_BLOCK,), (self.int_t(rows), *outs, *reds, *ins, *self._tail), **kw)


def compile_gpu(spec: KernelSpec | ReduceSpec | RowSpec) -> GpuKernel | GpuRowKernel:
    return GpuRowKernel(spec) if isinstance(spec, RowSpec) else GpuKernel(spec)
