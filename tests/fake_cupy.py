"""A stand-in for CuPy that runs the generated GPU kernels on the host, launch by launch.

The GPU target's launcher (`codegen/gpu/gpu_runtime.py`) and program (`executor.GpuProgram`) only
ever run on a machine with a GPU. This module lets the tests run them here: it provides the part
of CuPy's API they use, with "device arrays" that are numpy arrays of a marked subclass, and a
`cuda.function.Module` whose functions execute each launch as CUDA would — every (block,
thread) of the grid — by calling the kernel's host-emulation build (`llvm_ptx.host_emulation_ir`:
the same LLVM IR with the special registers as arguments).

It is strict where a mistake would silently corrupt results on a real GPU:
- loaded PTX is assembled by `ptxas` (when on PATH), as the driver would JIT it;
- every launch argument is checked against the `.entry`'s parameter list: pointers must be
  C-contiguous device arrays (not host numpy arrays), integers numpy scalars of exactly the
  declared width (CuPy packs numpy scalars at their own width);
- grid and block sizes must be within CUDA's limits.

    with fake_cupy.installed(monkeypatch, sms=2):
        f = dq.compile(module, "f", target="gpu")
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import re
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

PTXAS = shutil.which("ptxas")

# What crossed between host and "device", and what ran there, since `installed` (or a
# `record.clear()`): "launches" (our kernels' launches), "library_calls" (matmul, concatenate,
# ...: CuPy's own launches), "host_to_device" (host data made a device
# array), "device_to_host" (a device value read on the host: get, asnumpy, bool, int, float,
# item: each a synchronization on a real GPU), "device_copies" (copyto, a[i] = b), "allocations" (empty,
# zeros). Tests of loops read it per step (tests/test_gpu_loops.py).
record: collections.Counter = collections.Counter()


class DeviceArray(np.ndarray):
    """A "device" array: a numpy array marked as living on the fake GPU."""

    def get(self) -> np.ndarray:
        record["device_to_host"] += 1
        return np.asarray(self).copy()

    def _read(self):
        record["device_to_host"] += 1
        return np.asarray(self)

    def __bool__(self):
        return bool(self._read())

    def __int__(self):
        return int(self._read())

    def __float__(self):
        return float(self._read())

    def item(self, *args):
        return self._read().item(*args)

    def __setitem__(self, key, value):  # a copy kernel on a real GPU (from host data: a transfer)
        record["device_copies" if isinstance(value, DeviceArray) else "host_to_device"] += 1
        super().__setitem__(key, value)


def _device(a) -> DeviceArray:
    return a.view(DeviceArray) if isinstance(a, np.ndarray) else np.asarray(a).view(DeviceArray)


def asarray(a, dtype=None):
    """A device array: host data is copied over (as CuPy transfers it); a device array of the
    right dtype is returned as it is."""
    if isinstance(a, DeviceArray) and (dtype is None or a.dtype == np.dtype(dtype)):
        return a
    if not isinstance(a, DeviceArray):
        record["host_to_device"] += 1
    return _device(np.array(a, dtype=dtype))


def ascontiguousarray(a, dtype=None):
    if not isinstance(a, DeviceArray):
        a = asarray(a, dtype)
    return _device(np.ascontiguousarray(a, dtype=dtype))


def empty(shape, dtype=np.float32):
    record["allocations"] += 1
    return _device(np.empty(shape, dtype))


def zeros(shape, dtype=np.float32):
    record["allocations"] += 1
    return _device(np.zeros(shape, dtype))


def asnumpy(a):
    if isinstance(a, DeviceArray):
        record["device_to_host"] += 1
    return np.asarray(a).copy()


def _on_device(fn):
    def wrapped(*args, **kw):
        record["library_calls"] += 1  # cuBLAS or a CuPy kernel on a real GPU: launches too
        return _device(fn(*args, **kw))

    return wrapped


# the numpy functions the GPU program calls, returning device arrays
matmul, dot, concatenate = _on_device(np.matmul), _on_device(np.dot), _on_device(np.concatenate)
add, multiply, maximum, minimum = (
    _on_device(np.add),
    _on_device(np.multiply),
    _on_device(np.maximum),
    _on_device(np.minimum),
)
broadcast_to, transpose, reshape = (
    _on_device(np.broadcast_to),
    _on_device(np.transpose),
    _on_device(np.reshape),
)


def copyto(dst, src, **kw):
    record["device_copies"] += 1
    np.copyto(dst, src, **kw)


take, clip = (
    _on_device(np.take),
    _on_device(np.clip),
)  # gather steps (codegen/execution/gather_steps.py)
cumsum, flip = _on_device(np.cumsum), _on_device(np.flip)
logical_and, logical_not = (
    _on_device(np.logical_and),
    _on_device(np.logical_not),
)  # gpu_loop.py  # scan steps (codegen/planning/scan.py)
add.at = np.add.at  # CuPy's ufunc.at, as scatterAdd calls it
# what the convolution and pooling steps call (dlvm_eq/ir/window_ops.py), as CuPy has them
full, arange, where, expand_dims, argmax, take_along_axis, sum, max = (
    _on_device(np.full),
    _on_device(np.arange),
    _on_device(np.where),
    _on_device(np.expand_dims),
    _on_device(np.argmax),
    _on_device(np.take_along_axis),
    _on_device(np.sum),
    _on_device(np.max),
)
lib = types.SimpleNamespace(
    stride_tricks=types.SimpleNamespace(
        as_strided=lambda a, shape=None, strides=None: _device(
            np.lib.stride_tricks.as_strided(a, shape, strides)
        )
    )
)
float32, float64, int32, int64 = np.float32, np.float64, np.int32, np.int64
# what the attention step's reference formulas call (codegen/planning/attention.py)
ndarray = DeviceArray
swapaxes, exp, log = _on_device(np.swapaxes), _on_device(np.exp), _on_device(np.log)


# ------------------------------------------------------------------ kernels

_PARAM = re.compile(r"\.param\s+\.([us](?:32|64)|b(?:32|64))(\s+\.ptr)?")


def entry_params(ptx: str, symbol: str) -> list[str]:
    """The `.entry symbol(...)`'s parameters as 'ptr', 'i32' or 'i64'."""
    m = re.search(r"\.entry\s+" + re.escape(symbol) + r"\s*\((.*?)\)", ptx, re.S)
    if m is None:
        raise RuntimeError(f"CUDA_ERROR_NOT_FOUND: no .entry {symbol} in the loaded PTX")
    out = []
    for kind, ptr in _PARAM.findall(m.group(1)):
        out.append("ptr" if ptr else ("i32" if kind.endswith("32") else "i64"))
    return out


def _spec_for(symbol: str):
    """The kernel spec whose PTX has this symbol (the launcher generated and cached it)."""
    from dlvm_eq.codegen.gpu import gpu_runtime

    for (spec, _arch), kp in list(gpu_runtime._ptx_cache.items()):
        if kp.symbol == symbol:
            return spec
    raise RuntimeError(f"fake CuPy: no kernel spec known for {symbol}")


class Function:
    """One kernel; calling it runs the launch on the host, thread by thread."""

    def __init__(self, ptx: str, symbol: str):
        from dlvm_eq.codegen.cpu.llvm_cpu import CpuIR
        from dlvm_eq.codegen.gpu.llvm_ptx import host_emulation_ir
        from dlvm_eq.codegen.gpu.pool_ptx import pool_host_emulation_ir
        from dlvm_eq.codegen.kernels.pool_spec import PoolSpec
        from dlvm_eq.codegen.runtime.jit import JIT

        self.symbol = symbol
        self.params = entry_params(ptx, symbol)
        spec = _spec_for(symbol)
        if isinstance(spec, PoolSpec):  # pooling kernels: gpu/pool_ptx.py
            (text, host_symbol), layout = pool_host_emulation_ir(spec), None
        else:
            text, host_symbol, layout, _bits = host_emulation_ir(spec)
        addr = JIT.address(CpuIR(text, host_symbol, layout, "emulated"))
        c = {"ptr": ctypes.c_void_p, "i32": ctypes.c_int32, "i64": ctypes.c_int64}
        self._fn = ctypes.CFUNCTYPE(None, *[c[p] for p in self.params], *[ctypes.c_int32] * 6)(addr)
        self.launches = 0

    def _check(self, args) -> list:
        if len(args) != len(self.params):
            raise RuntimeError(
                f"{self.symbol}: {len(args)} arguments for {len(self.params)} parameters"
            )
        out = []
        for i, (a, p) in enumerate(zip(args, self.params)):
            if p == "ptr":
                if not isinstance(a, DeviceArray):
                    raise TypeError(
                        f"{self.symbol}: argument {i} is a {type(a).__name__}, not a device array"
                    )
                if not a.flags.c_contiguous:
                    raise ValueError(f"{self.symbol}: argument {i} is not C-contiguous")
                out.append(a.ctypes.data)
            else:
                want = np.int32 if p == "i32" else np.int64
                if type(a) is not want:
                    raise TypeError(
                        f"{self.symbol}: argument {i} must be {want.__name__} for its "
                        f".param ({p}), got {type(a).__name__}"
                    )
                out.append(int(a))
        return out

    def __call__(self, grid, block, args, stream=None, shared_mem=0):
        grid, block = tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block))
        if not (1 <= grid[0] < 2**31 and 1 <= grid[1] <= 65535 and grid[2] == 1):
            raise ValueError(f"{self.symbol}: grid {grid} outside CUDA's limits (or unsupported z)")
        if not (1 <= block[0] <= 1024 and block[1] == block[2] == 1):
            raise ValueError(
                f"{self.symbol}: block {block} outside CUDA's limits (or unsupported y/z)"
            )
        values = self._check(args)
        self.launches += 1
        record["launches"] += 1
        for by in range(grid[1]):
            for bx in range(grid[0]):
                for tx in range(block[0]):
                    self._fn(*values, bx, block[0], tx, grid[0], by, grid[1])


class CtaFunction(Function):
    """A kernel with shared memory and barriers (gpu/attention_ptx.py): each CTA's threads run
    on host threads at once, sharing one buffer for its shared memory (filled with NaN, so a
    read before the CTA wrote it shows), and every barrier is a callback that waits for all of
    them (a thread that misses one breaks the barrier: the launch raises)."""

    def __init__(self, ptx: str, symbol: str):
        from dlvm_eq.codegen.cpu.llvm_cpu import CpuIR
        from dlvm_eq.codegen.gpu.attention_ptx import attention_host_emulation_ir
        from dlvm_eq.codegen.runtime.jit import JIT

        self.symbol = symbol
        self.params = entry_params(ptx, symbol)
        spec = self.spec = _spec_for(symbol)
        text, host_symbol = attention_host_emulation_ir(spec)
        addr = JIT.address(CpuIR(text, host_symbol, None, "emulated"))
        self.dtype = np.float32 if spec.dtype == "f32" else np.float64
        self.shared_size = spec.shared_elements()
        self._fn = ctypes.CFUNCTYPE(
            None, *[ctypes.c_void_p] * (len(self.params) + 2), *[ctypes.c_int32] * 6
        )(addr)
        self.launches = 0

    def __call__(self, grid, block, args, stream=None, shared_mem=0):
        import threading

        grid, block = tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block))
        if not (1 <= grid[0] < 2**31 and grid[1] == grid[2] == 1):
            raise ValueError(f"{self.symbol}: grid {grid} outside CUDA's limits (or unsupported)")
        if not (1 <= block[0] <= 1024 and block[1] == block[2] == 1):
            raise ValueError(f"{self.symbol}: block {block} outside CUDA's limits (or unsupported)")
        values = self._check(args)
        self.launches += 1
        record["launches"] += 1
        broken: list = []
        for bx in range(grid[0]):
            shared = np.full(self.shared_size, np.nan, self.dtype)
            barrier = threading.Barrier(block[0], timeout=120)

            def wait(barrier=barrier):
                try:
                    barrier.wait()
                except threading.BrokenBarrierError as e:  # raised in a C callback: kept
                    broken.append(e)

            callback = ctypes.CFUNCTYPE(None)(wait)
            extra = [shared.ctypes.data, ctypes.cast(callback, ctypes.c_void_p).value]
            threads = [
                threading.Thread(
                    target=self._fn, args=(*values, *extra, bx, block[0], tx, grid[0], 0, 1)
                )
                for tx in range(block[0])
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if broken:
                raise RuntimeError(f"{self.symbol}: a thread of CTA {bx} missed a barrier")


class Module:
    """cupy.cuda.function.Module: load(PTX bytes), get_function(name)."""

    def __init__(self):
        self.ptx = None

    def load(self, data: bytes):
        self.ptx = data.decode()
        if PTXAS is not None:  # the driver JIT-compiles PTX on load; ptxas finds the same errors
            with tempfile.TemporaryDirectory() as d:
                src = Path(d) / "k.ptx"
                src.write_text(self.ptx)
                r = subprocess.run(
                    [PTXAS, "-arch=sm_90", str(src), "-o", str(Path(d) / "k.cubin")],
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                if r.returncode != 0:
                    raise RuntimeError(f"CUDA_ERROR_INVALID_PTX:\n{r.stderr}")

    def get_function(self, name: str) -> Function:
        from dlvm_eq.codegen.gpu.attention_ptx import AttentionGpuSpec

        if isinstance(_spec_for(name), AttentionGpuSpec):  # shared memory and barriers
            return CtaFunction(self.ptx, name)
        return Function(self.ptx, name)


# ------------------------------------------------------------------ the cuda namespace


class Device:
    sms = 2

    def __init__(self, i: int = 0):
        self.id = i
        self.compute_capability = "90"
        self.attributes = {"MultiProcessorCount": Device.sms}


def _build_cuda():
    cuda = types.SimpleNamespace()
    cuda.Device = Device
    cuda.runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1,
        deviceSynchronize=lambda: None,
        getDeviceProperties=lambda i: {
            "name": b"fake GPU",
            "major": 9,
            "minor": 0,
            "multiProcessorCount": Device.sms,
        },
    )
    cuda.function = types.SimpleNamespace(Module=Module)
    return cuda


cuda = _build_cuda()


@contextlib.contextmanager
def installed(monkeypatch, sms: int = 2):
    """This module as `cupy` (and fresh launcher caches) for the duration of the block."""
    from dlvm_eq.codegen.gpu import gpu_runtime

    monkeypatch.setitem(sys.modules, "cupy", sys.modules[__name__])
    monkeypatch.setattr(Device, "sms", sms)
    monkeypatch.setattr(gpu_runtime, "_functions", {})
    record.clear()
    yield sys.modules[__name__]
