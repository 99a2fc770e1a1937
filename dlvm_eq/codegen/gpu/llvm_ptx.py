"""KernelSpec / ReduceSpec -> PTX text for NVIDIA GPUs (llvmlite's NVPTX back end).

Elementwise ABI: a grid-stride loop over flat output indices,
    .entry k(iN n, ptr.global out_0.., ptr.global in_0.., iN dims_and_strides...)
Reduction ABI: one thread per output element (grid-stride in x), looping over a slice
[y*chunk, (y+1)*chunk) of the reduced elements picked by blockIdx.y, writing out[y*n_out + o]
(with gridDim.y > 1 the launcher combines the partial rows),
    .entry k(iN n_out, iN n_red, iN chunk, ptr.global out, ptr.global in_0.., iN dims_and_strides...)
iN is i32 when every index and offset fits (then 32-bit index arithmetic, much cheaper on a
GPU than 64-bit division), else i64; the launcher passes numpy scalars of that width. The
math is the same inline polynomial code as on the CPU, so nothing is linked (no libdevice).

    >>> kp = ptx_kernel(spec, arch="sm_75")    # PtxKernel(ptx, symbol, layout, index_bits)
    >>> kp.ptx.startswith("//")
    True

Shared state (threads): `_tms` (one target machine per arch) and every parse, pass pipeline
and PTX emission under llvm_lock.LLVM_LOCK, the lock the CPU back end uses too: LLVM's
global context is not thread-safe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import llvmlite.binding as llvm
from llvmlite import ir

from ..kernels.kernel_spec import KernelSpec, ReduceSpec
from ..kernels.layout import LoopLayout, spec_layout
from ..kernels.rows import RowSpec, reduce_identity
from ..llvm.emitter import I32, I64, Emitter
from ..llvm.llvm_lock import LLVM_LOCK
from ..llvm.loops import counted_loop, decompose, entry_alloca, strided_range
from ..llvm.lower_expr import combine, from_storage, init_constant, lower, storage_type, to_storage
from ..llvm.symbols import symbol_for

TRIPLE = "nvptx64-nvidia-cuda"
GLOBAL = ir.PointerType(addrspace=1)
ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90")


@dataclass(frozen=True)
class PtxKernel:
    ptx: str  # PTX assembly text
    symbol: str  # the .entry name
    layout: LoopLayout | None  # loop layout (dims/strides: the trailing arguments); None for rows
    index_bits: int  # 32 or 64: width of every integer argument
    kind: str  # "map", "reduce" or "rows"

    def int_args(self) -> list[int]:
        """The trailing integer arguments: dims, then each input's strides."""
        return [
            int(v)
            for v in self.layout.dims_array()[
                : len(self.layout.dims) * (1 + len(self.layout.strides))
            ]
        ]


def index_bits(spec, layout: LoopLayout) -> int:
    """32 when the iteration size and every input offset stay below 2**30."""
    biggest = max(
        [math.prod(spec.shape)]
        + [sum((d - 1) * s for d, s in zip(layout.dims, st)) + 1 for st in layout.strides]
    )
    return 32 if biggest < 2**30 else 64


# The special registers a kernel reads; under host emulation they are trailing i32 arguments
# in this order (see host_emulation_ir).
SREGS = ("ctaid.x", "ntid.x", "tid.x", "nctaid.x", "ctaid.y", "nctaid.y")


def _sreg(b: ir.IRBuilder, name: str):
    if getattr(b.module, "host_emulation", False):
        return b.function.args[len(b.function.args) - len(SREGS) + SREGS.index(name)]
    fn = b.module.globals.get(f"llvm.nvvm.read.ptx.sreg.{name}")
    if fn is None:
        fn = ir.Function(b.module, ir.FunctionType(I32, []), f"llvm.nvvm.read.ptx.sreg.{name}")
    return b.call(fn, [])


def _global_id(b: ir.IRBuilder, t: ir.IntType):
    """(blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x) as type t."""
    ext = (lambda v: v) if t.width == 32 else (lambda v: b.zext(v, t))
    ctaid, ntid, tid, nctaid = (
        ext(_sreg(b, n)) for n in ("ctaid.x", "ntid.x", "tid.x", "nctaid.x")
    )
    return b.add(b.mul(ctaid, ntid), tid), b.mul(nctaid, ntid)


def _grid_stride(b: ir.IRBuilder, n, body):
    """for (i = global id; i < n; i += grid size) body(i)."""
    start, step = _global_id(b, n.type)
    pre = b.block
    head = b.append_basic_block("gs.head")
    blk = b.append_basic_block("gs.body")
    done = b.append_basic_block("gs.end")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(n.type, name="i")
    i.add_incoming(start, pre)
    b.cbranch(b.icmp_unsigned("<", i, n), blk, done)
    b.position_at_end(blk)
    body(b, i)
    i.add_incoming(b.add(i, step), b.block)
    b.branch(head)
    b.position_at_end(done)


def _params(fn: ir.Function, layout: LoopLayout, t: ir.IntType, first_int: int):
    """Run-time dims and strides (constants where the stride is 0 or 1)."""
    rank = len(layout.dims)
    args = fn.args[first_int:]
    dims = list(args[:rank])
    strides = [
        [ir.Constant(t, s) if s in (0, 1) else args[rank * (1 + k) + d] for d, s in enumerate(st)]
        for k, st in enumerate(layout.strides)
    ]
    return dims, strides


def _loader(e: Emitter, ins, dtypes, offs):
    def load(i):
        st = storage_type(dtypes[i])
        ptr = e.b.gep(ins[i], [offs[i]], inbounds=True, source_etype=st)
        return from_storage(e, e.b.load(ptr, typ=st), dtypes[i])

    return load


def _store(e: Emitter, ptr, idx, v, dt):
    st = storage_type(dt)
    e.b.store(to_storage(e, v, dt), e.b.gep(ptr, [idx], inbounds=True, source_etype=st))


def _layout_ints(layout: LoopLayout) -> int:
    """How many trailing integer arguments (dims, then each input's strides) a layout takes."""
    return len(layout.dims) * (1 + len(layout.strides))


def _kernel(module, symbol, n_ints_head, n_ptrs, n_tail, t):
    host = getattr(module, "host_emulation", False)
    ptr = ir.PointerType() if host else GLOBAL
    emulated = [I32] * len(SREGS) if host else []
    fnty = ir.FunctionType(
        ir.VoidType(), [t] * n_ints_head + [ptr] * n_ptrs + [t] * n_tail + emulated
    )
    fn = ir.Function(module, fnty, symbol)
    if not host:
        fn.calling_convention = "ptx_kernel"  # LLVM >= 20: the kernel marker (no nvvm.annotations)
    for a in fn.args[n_ints_head : n_ints_head + n_ptrs]:
        a.add_attribute("noalias")
    return fn


def _map_kernel(module, spec: KernelSpec, layout, symbol, t):
    n_out, n_in = len(spec.outputs), len(spec.inputs)
    fn = _kernel(module, symbol, 1, n_out + n_in, _layout_ints(layout), t)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    e = Emitter(b)
    n, outs, ins = fn.args[0], fn.args[1 : 1 + n_out], fn.args[1 + n_out : 1 + n_out + n_in]
    dims, strides = _params(fn, layout, t, 1 + n_out + n_in)
    dtypes = spec.input_dtypes

    def body(b, i):
        offs = decompose(b, i, dims, strides, [ir.Constant(t, 0)] * n_in)
        vals = lower(e, list(spec.outputs), dtypes, _loader(e, ins, dtypes, offs))
        for ptr, v, dt in zip(outs, vals, spec.output_dtypes):
            _store(e, ptr, i, v, dt)

    _grid_stride(b, n, body)
    b.ret_void()


def _reduce_kernel(module, spec: ReduceSpec, layout, symbol, t):
    n_in = len(spec.inputs)
    fn = _kernel(module, symbol, 3, 1 + n_in, _layout_ints(layout), t)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    e = Emitter(b)
    n_out, n_red, chunk = fn.args[:3]
    out, ins = fn.args[3], fn.args[4 : 4 + n_in]
    dims, strides = _params(fn, layout, t, 4 + n_in)
    # blockIdx.y picks a slice [r0, r1) of the reduced elements and a row of partial results
    y = _sreg(b, "ctaid.y")
    y = y if t.width == 32 else b.zext(y, t)
    r0 = b.mul(y, chunk)
    r1 = b.add(r0, chunk)
    r1 = b.select(b.icmp_unsigned("<", n_red, r1), n_red, r1)
    row = b.mul(y, n_out)
    g1, gr, _ = layout.groups
    kept = list(range(g1)) + list(range(g1 + gr, len(dims)))
    k_dims = [dims[d] for d in kept]
    k_st = [[st[d] for d in kept] for st in strides]
    r_dims, r_st = dims[g1 : g1 + gr], [st[g1 : g1 + gr] for st in strides]
    init = init_constant(spec.identity, spec.dtype)
    acc = entry_alloca(b, init.type, "acc")

    def per_output(b, o):
        base = decompose(b, o, k_dims, k_st, [ir.Constant(t, 0)] * n_in)
        b.store(init, acc)

        def step(b, offs, _):
            v = lower(e, [spec.body], spec.input_dtypes, _loader(e, ins, spec.input_dtypes, offs))[
                0
            ]
            b.store(combine(e, spec.op, b.load(acc, typ=init.type), v, spec.dtype), acc)

        strided_range(b, r0, r1, r_dims, r_st, base, step, "red")
        _store(e, out, b.add(row, o), b.load(acc, typ=init.type), spec.dtype)

    _grid_stride(b, n_out, per_output)
    b.ret_void()


def _rows_kernel(module, spec: RowSpec, symbol, t):
    """One thread per row (grid-stride over rows): the reductions in order, each a loop over
    the row, then the map over the row. No barriers and no shared memory: meant for short rows
    (the planner makes GPU row kernels only up to GPU_ROW_COLS columns), where a warp's rows lie
    in a few cache lines and every later pass over a row hits L1."""
    n_in, n_red, n_out = len(spec.inputs), len(spec.reductions), len(spec.outputs)
    fn = _kernel(module, symbol, 1, n_out + n_red + n_in, 1 + 2 * n_in, t)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    e = Emitter(b)
    n_rows = fn.args[0]
    outs = fn.args[1 : 1 + n_out]
    reds = fn.args[1 + n_out : 1 + n_out + n_red]
    ins = fn.args[1 + n_out + n_red : 1 + n_out + n_red + n_in]
    tail = fn.args[1 + n_out + n_red + n_in : 1 + n_out + n_red + n_in + 1 + 2 * n_in]
    cols = tail[0]
    row_st = [tail[1 + 2 * i] for i in range(n_in)]
    col_st = [tail[2 + 2 * i] for i in range(n_in)]
    dtypes = spec.all_dtypes
    zero = ir.Constant(t, 0)

    def per_row(b, r):
        accs: list = []

        def loader(j):
            def load(i):
                if i >= n_in:  # an earlier reduction's result
                    return accs[i - n_in]
                off = b.add(b.mul(r, row_st[i]), b.mul(j, col_st[i]))
                st = storage_type(dtypes[i])
                v = b.load(b.gep(ins[i], [off], inbounds=True, source_etype=st), typ=st)
                return from_storage(e, v, dtypes[i])

            return load

        for k, (body, op, init) in enumerate(spec.reductions):
            dt = dtypes[n_in + k]
            ident = init_constant(reduce_identity(op, dt), dt)
            acc = entry_alloca(b, ident.type, f"acc{k}")
            b.store(ident, acc)

            def step(b, j, body=body, op=op, dt=dt, acc=acc, ident=ident):
                v = lower(e, [body], dtypes, loader(j))[0]
                b.store(combine(e, op, b.load(acc, typ=ident.type), v, dt), acc)

            counted_loop(b, zero, cols, step, f"red{k}")
            v = b.load(acc, typ=ident.type)
            if init != reduce_identity(op, dt):  # the loop folds from the identity
                v = combine(e, op, v, init_constant(init, dt), dt)
            _store(e, reds[k], r, v, dt)
            accs.append(v)
        row_lo = b.mul(r, cols)

        def item(b, j):
            vals = lower(e, list(spec.outputs), dtypes, loader(j))
            for ptr, v, dt in zip(outs, vals, spec.output_dtypes):
                _store(e, ptr, b.add(row_lo, j), v, dt)

        counted_loop(b, zero, cols, item, "map")

    _grid_stride(b, n_rows, per_row)
    b.ret_void()


def row_index_bits(spec: RowSpec) -> int:
    """32 when every output index and input offset of the row kernel stays below 2**30."""
    biggest = max(
        [spec.rows * spec.cols]
        + [
            (spec.rows - 1) * spec.strides(i)[0] + (spec.cols - 1) * spec.strides(i)[1] + 1
            for i in range(len(spec.inputs))
        ]
    )
    return 32 if biggest < 2**30 else 64


def row_int_args(spec: RowSpec) -> list[int]:
    """A row kernel's trailing integer arguments: cols, then each input's (row, col) strides."""
    return [spec.cols] + [s for i in range(len(spec.inputs)) for s in spec.strides(i)]


_lock = LLVM_LOCK  # the CPU back end parses and compiles in the same global LLVM context
_tms: dict[str, llvm.TargetMachine] = {}


def target_machine(arch: str = "sm_75") -> llvm.TargetMachine:
    if arch not in ARCHS:
        raise ValueError(
            f"unsupported GPU architecture {arch!r}; expected one of {', '.join(ARCHS)}"
        )
    with _lock:
        if arch not in _tms:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            target = llvm.Target.from_triple(TRIPLE)
            _tms[arch] = target.create_target_machine(cpu=arch, opt=3)
        return _tms[arch]


def new_module(arch: str, host_emulation: bool = False) -> ir.Module:
    """An empty module for a GPU kernel on `arch`, or for the host CPU when `host_emulation`
    (the kernel builders read `module.host_emulation` to take the special registers as
    arguments). Named "dlvm_eq", not after the spec: equal kernels must have equal IR."""
    module = ir.Module(name="dlvm_eq")
    module.host_emulation = host_emulation
    if host_emulation:
        from ..cpu.llvm_cpu import target_machine as host_tm

        module.triple, module.data_layout = host_tm().triple, str(host_tm().target_data)
    else:
        module.triple, module.data_layout = TRIPLE, str(target_machine(arch).target_data)
    return module


def build_module(
    spec, symbol: str, arch: str = "sm_75", host_emulation: bool = False
) -> tuple[ir.Module, LoopLayout, int]:
    if isinstance(spec, RowSpec):
        layout, bits = None, row_index_bits(spec)
    else:
        layout = spec_layout(spec)
        bits = index_bits(spec, layout)
    t = I32 if bits == 32 else I64
    module = new_module(arch, host_emulation)
    if isinstance(spec, KernelSpec):
        _map_kernel(module, spec, layout, symbol, t)
    elif isinstance(spec, RowSpec):
        _rows_kernel(module, spec, symbol, t)
    else:
        _reduce_kernel(module, spec, layout, symbol, t)
    return module, layout, bits


def host_emulation_ir(spec) -> tuple[str, str, LoopLayout, int]:
    """The GPU kernel's IR for the host CPU: the same function with the special registers
    (SREGS: blockIdx.x, blockDim.x, threadIdx.x, gridDim.x, blockIdx.y, gridDim.y) as six
    trailing i32 arguments. Calling it once per (block, thread) of a launch runs the launch;
    (0, 1, 0, 1, 0, 1) runs it as one thread whose grid-stride loop covers every element.
    Tests check the GPU code and its launcher this way without a GPU."""
    return _named(spec, "dq_gpu_", arch="sm_75", host_emulation=True)


def _named(spec, prefix: str, **kw) -> tuple[str, str, LoopLayout, int]:
    built = {}

    def build(name: str) -> str:
        module, built["layout"], built["bits"] = build_module(spec, name, **kw)
        return str(module)

    text, symbol = symbol_for(build, prefix)
    return text, symbol, built["layout"], built["bits"]


def ptx_ir(spec, arch: str = "sm_75") -> tuple[str, str, LoopLayout, int]:
    """(LLVM IR text, symbol, layout, index bits); the symbol hashes the IR."""
    return _named(spec, "dq_", arch=arch)


def compile_ptx(ir_text: str, arch: str = "sm_75") -> str:
    """LLVM IR -> PTX after the O3 pipeline."""
    tm = target_machine(arch)
    with _lock:
        mod = llvm.parse_assembly(ir_text)
        mod.verify()
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
        return tm.emit_assembly(mod)


def ptx_kernel(spec, arch: str = "sm_75") -> PtxKernel:
    """PTX for a kernel spec. arch: sm_75 (default), sm_80, sm_86, sm_89, sm_90."""
    text, symbol, layout, bits = ptx_ir(spec, arch)
    return PtxKernel(compile_ptx(text, arch), symbol, layout, bits, kernel_kind(spec))


def kernel_kind(spec) -> str:
    return (
        "map" if isinstance(spec, KernelSpec) else "rows" if isinstance(spec, RowSpec) else "reduce"
    )


# The kernel skeleton (signature, grid-stride loop), public for the GPU's other builders
# (index_ptx.py, pool_ptx.py, im2col_ptx.py).
kernel_function, grid_stride = _kernel, _grid_stride
