"""Fused reduce-then-map kernels over rows (CPU; the GPU version of a RowSpec is
`llvm_ptx._rows_kernel`): softmax-style patterns in one pass over memory.

A `RowSpec` iterates a (rows, cols) space. Per row it runs its reductions in order (each body
may read the results of the earlier ones), then evaluates its map outputs over the row (which
may read every reduction's result). A row is read from DRAM once: the later passes find it in
L1/L2. The last reduction's subexpressions that the map needs again (softmax's
`exp(x - max)`) are kept in a stack buffer for rows of up to SCRATCH elements instead of being
recomputed (longer rows recompute them; the choice is compiled in), and large outputs are written with streaming stores (see streaming.py).

    >>> x = Load(0)
    >>> m = Load(1)                  # reduction 0's result (inputs come first)
    >>> s = Load(2)                  # reduction 1's result
    >>> e = unary("exp", x - m)
    >>> spec = RowSpec("softmax", 4096, 4096, [KernelInput("f32")],
    ...                [(x, "max", None), (e, "add", None)], [e / s])
    >>> k = compile_rows(spec)
    >>> y, row_max, row_sum = k(x_array)

Inputs are 2-D views given by (row stride, col stride) in elements (0 = broadcast); strides
None means C-contiguous (rows, cols). ABI:
    void k(i64 r0, i64 r1, ptr out_0.., ptr red_0.., ptr in_0.., ptr dims)
where dims = [rows, cols, row stride 0, col stride 0, row stride 1, ...].

Shared state (threads): `_kernels` (compile_rows's memo) under `_lock` (a race builds an equal
kernel twice, the last is kept); a RowKernel is immutable after construction. A row is always
computed whole by one call, so results do not depend on how rows are split over threads.
"""
from __future__ import annotations

import ctypes
import hashlib
import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from llvmlite import ir

from ..runtime.cpu_kernel import (CHUNKS_PER_THREAD, MIN_PARALLEL_WORK, _JIT, _run_ranges, _split,
                          aligned_empty, data_ptr, usable_cpus)
from .spec import (DTYPES, REDUCE_INIT, REDUCE_OPS, Binary, Cast, Const, Expr, KernelError,
                     KernelInput, Load, Select, Unary, _wrap, children, dtype_of, op_name,
                     resolve, walk)

if TYPE_CHECKING:
    from ..cpu.llvm_cpu import CpuIR

PTR = ir.PointerType()
SHORT_ROW = 32     # rows at most this long are compiled for their exact length
SCRATCH = 8192        # row elements kept on the stack for the map pass (32 KiB of f32)
MAX_STASH = 2         # subexpressions kept per row at most
_PLACEHOLDER = "__dq_rows__"


@dataclass(frozen=True)
class RowSpec:
    name: str
    rows: int
    cols: int
    inputs: tuple[KernelInput, ...]
    reductions: tuple[tuple, ...]     # (body, op, init or None)
    outputs: tuple[Expr, ...]

    def __post_init__(self):
        object.__setattr__(self, "inputs", tuple(self.inputs))
        for i, inp in enumerate(self.inputs):
            if inp.strides is not None and (len(inp.strides) != 2 or min(inp.strides) < 0):
                raise KernelError(f"{self.name}: input {i} needs (row stride, col stride), got {inp.strides}")
        dtypes = list(i.dtype for i in self.inputs)
        reds = []
        for body, op, init in self.reductions:
            op = op_name(op)
            if op not in REDUCE_OPS:
                raise KernelError(f"{self.name}: unknown reduction {op!r}")
            body = resolve(_wrap(body), tuple(dtypes))
            dt = dtype_of(body, tuple(dtypes))
            if dt == "bool":
                raise KernelError(f"{self.name}: cannot reduce bool values")
            reds.append((body, op, _typed(REDUCE_INIT[op] if init is None else init, dt)))
            dtypes.append(dt)
        object.__setattr__(self, "reductions", tuple(reds))
        memo: dict = {}
        outs = tuple(resolve(_wrap(o), tuple(dtypes), memo) for o in self.outputs)
        object.__setattr__(self, "outputs", outs)

    @property
    def input_dtypes(self) -> tuple[str, ...]:
        return tuple(i.dtype for i in self.inputs)

    @property
    def reduction_dtypes(self) -> tuple[str, ...]:
        dts = list(self.input_dtypes)
        for body, _, _ in self.reductions:
            dts.append(dtype_of(body, tuple(dts)))
        return tuple(dts[len(self.inputs):])

    @property
    def all_dtypes(self) -> tuple[str, ...]:
        return self.input_dtypes + self.reduction_dtypes

    @property
    def output_dtypes(self) -> tuple[str, ...]:
        return tuple(dtype_of(o, self.all_dtypes) for o in self.outputs)

    def strides(self, i: int) -> tuple[int, int]:
        s = self.inputs[i].strides
        return (self.cols, 1) if s is None else s


def _typed(v, dt: str):
    if dt == "i32":
        return int({math.inf: 2**31 - 1, -math.inf: -2**31}.get(v, v))
    return float(v)


def reduce_identity(op: str, dt: str):
    return _typed(REDUCE_INIT[op], dt)


def pattern(spec: RowSpec) -> tuple:
    """What the code depends on besides the spec's expressions: strides 0/1 or run-time."""
    cls = lambda s: s if s in (0, 1) else None  # noqa: E731
    return tuple((cls(spec.strides(i)[0]), cls(spec.strides(i)[1])) for i in range(len(spec.inputs)))


def loads(expr: Expr) -> list[Load]:
    """The Load nodes of an expression DAG, each once."""
    return [e for e in walk([expr]) if isinstance(e, Load)]


def rebuild(expr: Expr, replace: dict) -> Expr:
    """`expr` with the nodes in `replace` (usually Loads) replaced by other expressions."""
    new: dict = {}
    for e in walk([expr]):
        if e in replace:
            new[e] = replace[e]
        elif isinstance(e, (Load, Const)):
            new[e] = e
        elif isinstance(e, Unary):
            new[e] = Unary(e.op, new[e.x])
        elif isinstance(e, Binary):
            new[e] = Binary(e.op, new[e.a], new[e.b])
        elif isinstance(e, Select):
            new[e] = Select(new[e.cond], new[e.a], new[e.b])
        else:
            new[e] = Cast(new[e.x], e.dtype)
    return new[expr]


def stash_nodes(spec: RowSpec) -> list[Expr]:
    """The last reduction's subexpressions that the outputs read again (maximal ones)."""
    if not spec.reductions:
        return []
    last = set(walk([spec.reductions[-1][0]]))
    out, seen, stack = [], set(), list(spec.outputs)
    while stack:
        e = stack.pop()
        if e in seen:
            continue
        seen.add(e)
        if e in last and not isinstance(e, (Load, Const)):
            out.append(e)
            continue
        stack.extend(children(e))
    return out[:MAX_STASH]


def _build(spec: RowSpec, symbol: str, triple: str, datalayout: str) -> ir.Module:
    # the IR builders load here: a kernel found in the disk cache is loaded without them
    from ..llvm.emitter import I64, Emitter
    from ..cpu.llvm_cpu import _noalias, has_avx512
    from ..llvm.loops import counted_loop, entry_alloca, i64
    from ..llvm.lower_expr import combine, from_storage, init_constant, lower, storage_type, to_storage
    from ..llvm.streaming import NT_MIN_BYTES, tiled_streaming
    module = ir.Module(name="dlvm_eq")
    module.triple, module.data_layout = triple, datalayout
    n_in, n_red, n_out = len(spec.inputs), len(spec.reductions), len(spec.outputs)
    fnty = ir.FunctionType(ir.VoidType(), [I64, I64] + [PTR] * (n_out + n_red + n_in + 1))
    fn = ir.Function(module, fnty, symbol)
    _noalias(fn, 2)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    e = Emitter(b, fast_ldexp=has_avx512())
    r0, r1 = fn.args[:2]
    outs = fn.args[2:2 + n_out]
    reds = fn.args[2 + n_out:2 + n_out + n_red]
    ins = fn.args[2 + n_out + n_red:-1]
    dims = fn.args[-1]

    def dim(j):
        return b.load(b.gep(dims, [i64(j)], inbounds=True, source_etype=I64), typ=I64)
    # Short rows: the column count is a constant, so LLVM unrolls the per-row loops and
    # vectorizes across them (a loop of 10 run-time iterations stays scalar: ~10x slower).
    cols = i64(spec.cols) if spec.cols <= SHORT_ROW else dim(1)
    pat = pattern(spec)
    rstride = [i64(p[0]) if p[0] is not None else dim(2 + 2 * i) for i, p in enumerate(pat)]
    cstride = [i64(p[1]) if p[1] is not None else dim(3 + 2 * i) for i, p in enumerate(pat)]
    dtypes = spec.all_dtypes
    odt = spec.output_dtypes
    stash = stash_nodes(spec) if spec.cols <= SCRATCH else []   # the IR depends on it: one version
    stash_dt = [dtype_of(s, dtypes) for s in stash]
    slots = []
    for dt in stash_dt:
        with b.goto_entry_block():
            a = b.alloca(storage_type(dt), size=ir.Constant(I64, SCRATCH), name="stash")
        a.align = 64
        slots.append(a)
    streaming = triple.startswith("x86_64") and \
        spec.rows * spec.cols * sum(DTYPES[d].itemsize for d in odt) >= NT_MIN_BYTES

    def per_row(b, r):
        base = [b.mul(r, rs) if not (isinstance(rs, ir.Constant) and rs.constant == 0) else i64(0)
                for rs in rstride]
        accs: list = []

        def loader(j):
            def load(i):
                if i >= n_in:
                    return accs[i - n_in]
                t = storage_type(dtypes[i])
                cs = cstride[i]
                if isinstance(cs, ir.Constant) and cs.constant == 0:
                    off = base[i]
                elif isinstance(cs, ir.Constant) and cs.constant == 1:
                    off = b.add(base[i], j)
                else:
                    off = b.add(base[i], b.mul(j, cs))
                v = b.load(b.gep(ins[i], [off], inbounds=True, source_etype=t), typ=t)
                return from_storage(e, v, dtypes[i])
            return load

        def reduce(k, body, op, init, keep):
            dt = dtypes[n_in + k]
            ident = init_constant(reduce_identity(op, dt), dt)
            acc = entry_alloca(b, ident.type, f"acc{k}")
            b.store(ident, acc)
            roots = [body] + (list(keep) if keep else [])

            def step(b, j):
                vals = lower(e, roots, dtypes, loader(j))
                b.store(combine(e, op, b.load(acc, typ=ident.type), vals[0], dt), acc)
                for slot, v, sdt in zip(slots, vals[1:], stash_dt):
                    b.store(to_storage(e, v, sdt), b.gep(slot, [j], inbounds=True, source_etype=storage_type(sdt)))
            counted_loop(b, i64(0), cols, step, f"red{k}")
            v = b.load(acc, typ=ident.type)
            if init != reduce_identity(op, dt):
                v = combine(e, op, v, init_constant(init, dt), dt)
            b.store(to_storage(e, v, dt), b.gep(reds[k], [r], inbounds=True, source_etype=storage_type(dt)))
            return v

        for k, (body, op, init) in enumerate(spec.reductions[:-1]):
            accs.append(reduce(k, body, op, init, None))
        row_lo = b.mul(r, cols)

        def finish(use_stash: bool):
            body, op, init = spec.reductions[-1]
            k = n_red - 1
            v = reduce(k, body, op, init, stash if use_stash else None)
            accs.append(v)
            exprs = list(spec.outputs)
            if use_stash:   # stashed values are read back as extra inputs
                extra = {s: Load(len(dtypes) + q) for q, s in enumerate(stash)}
                exprs = [rebuild(o, extra) for o in exprs]
            all_dt = dtypes + tuple(stash_dt) if use_stash else dtypes

            def compute(b, lo, hi, sinks):
                def body_(b, flat):
                    j = b.sub(flat, row_lo)
                    base_load = loader(j)

                    def load(i):
                        if i >= len(dtypes):
                            q = i - len(dtypes)
                            t = storage_type(stash_dt[q])
                            v = b.load(b.gep(slots[q], [j], inbounds=True, source_etype=t), typ=t)
                            return from_storage(e, v, stash_dt[q])
                        return base_load(i)
                    vals = lower(e, exprs, all_dt, load)
                    for sink, v, dt in zip(sinks, vals, odt):
                        b.store(to_storage(e, v, dt), sink(b, flat))
                counted_loop(b, lo, hi, body_, "map")
            hi = b.add(row_lo, cols)
            if streaming:
                tiled_streaming(b, row_lo, hi, list(outs), odt, compute)
            else:
                compute(b, row_lo, hi, [(lambda b, flat, p=p, dt=dt: b.gep(p, [flat], inbounds=True,
                                                                        source_etype=storage_type(dt)))
                                        for p, dt in zip(outs, odt)])

        finish(bool(stash))

    counted_loop(b, r0, r1, per_row, "rows")
    b.ret_void()
    return module


def rows_ir(spec: RowSpec) -> CpuIR:
    """LLVM IR text for the host; the symbol hashes the IR (equal kernels coincide)."""
    from ..cpu.llvm_cpu import CpuIR, target_machine
    if not spec.reductions:
        raise KernelError(f"{spec.name}: a row kernel needs at least one reduction")
    tm = target_machine()
    draft = str(_build(spec, _PLACEHOLDER, tm.triple, str(tm.target_data)))
    symbol = "dq_rows_" + hashlib.sha256(draft.encode()).hexdigest()[:20]
    return CpuIR(draft.replace(f'@"{_PLACEHOLDER}"', f'@"{symbol}"'), symbol, None, "rows")


class RowKernel:
    """A compiled RowSpec: call it on C-contiguous arrays; returns (outputs..., reductions...)."""

    def __init__(self, spec: RowSpec, threads: int | None = None):
        self.spec = spec
        self.threads = threads or usable_cpus()
        if not spec.reductions:
            raise KernelError(f"{spec.name}: a row kernel needs at least one reduction")
        # loaded by spec: the IR is generated only when the kernel is not on disk
        self.ir = _JIT.kernel("rows", spec, lambda: rows_ir(spec))
        self.address = self.ir.address
        flat = [spec.rows, spec.cols] + [s for i in range(len(spec.inputs)) for s in spec.strides(i)]
        self.dims = np.array(flat, dtype=np.int64)
        self._dims_ptr = self.dims.ctypes.data
        n_ptrs = len(spec.outputs) + len(spec.reductions) + len(spec.inputs) + 1
        self._fn = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, *([ctypes.c_void_p] * n_ptrs))(self.address)
        self.out_dtypes = [DTYPES[d] for d in spec.output_dtypes]
        self.red_dtypes = [DTYPES[d] for d in spec.reduction_dtypes]
        work = spec.rows * spec.cols * (len(spec.reductions) + 1)
        parts = max(1, min(CHUNKS_PER_THREAD * self.threads, work // MIN_PARALLEL_WORK, spec.rows))
        self._chunks = _split(spec.rows, parts, 1) if spec.rows else []

    def run(self, ins, outs, reds) -> None:
        if not self._chunks or self.spec.cols == 0:
            for red, (_, op, init) in zip(reds, self.spec.reductions):
                red.fill(init)
            return
        ptrs = [data_ptr(a) for a in outs] + [data_ptr(a) for a in reds] + [data_ptr(a) for a in ins]
        ptrs.append(self._dims_ptr)
        if len(self._chunks) == 1:
            self._fn(0, self.spec.rows, *ptrs)
            return
        _run_ranges(self._fn, self._chunks, ptrs, self.threads)

    def __call__(self, *inputs):
        spec = self.spec
        ins = [np.ascontiguousarray(a, dtype=DTYPES[i.dtype]) for a, i in zip(inputs, spec.inputs)]
        outs = [aligned_empty((spec.rows, spec.cols), d) for d in self.out_dtypes]
        reds = [np.empty(spec.rows, d) for d in self.red_dtypes]
        self.run(ins, outs, reds)
        return tuple(outs) + tuple(reds)


_kernels: dict = {}
_lock = threading.Lock()


def compile_rows(spec: RowSpec) -> RowKernel:
    with _lock:
        k = _kernels.get(spec)
    if k is None:
        k = RowKernel(spec)
        with _lock:
            _kernels[spec] = k
    return k


__all__ = ["RowKernel", "RowSpec", "compile_rows", "loads", "rebuild", "rows_ir", "stash_nodes"]
