"""KernelSpec / ReduceSpec -> LLVM IR for the host CPU, and IR -> optimized object code.

Elementwise ABI (the range [lo, hi) of flat output indices; threads take sub-ranges):
    void k(i64 lo, i64 hi, ptr noalias out_0, ..., ptr noalias in_0, ..., ptr noalias dims)
Reduction ABI (output elements [o0, o1), reduced flat indices [r0, r1); out[o] is written):
    void k(i64 o0, i64 o1, i64 r0, i64 r1, ptr noalias out, ptr noalias in_0, ..., ptr dims)
`dims` is `LoopLayout.dims_array()`. The symbol is `dq_` + a hash of the IR, so equal
kernels share one compiled function.

    >>> kir = cpu_ir(spec)                  # CpuIR(text, symbol, layout)
    >>> obj = compile_object(kir.text)      # optimized (O3, vectorized) object code

Shared state (threads): the target machine `_tm` is created, and every parse, pass pipeline
and code emission runs, under llvm_lock.LLVM_LOCK; `has_avx512` and `host_key` are
lru_caches of values that never change (a race computes one twice).
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass

import llvmlite
import llvmlite.binding as llvm
from llvmlite import ir

from ..kernels.kernel_spec import KernelSpec, ReduceSpec
from ..kernels.layout import LoopLayout, spec_layout
from ..kernels.spec import DTYPES
from ..llvm.emitter import I64, Emitter
from ..llvm.llvm_lock import LLVM_LOCK
from ..llvm.loops import counted_loop, entry_alloca, i64, strided_range
from ..llvm.lower_expr import combine, from_storage, init_constant, lower, storage_type, to_storage
from ..llvm.streaming import NT_MIN_BYTES, tiled_streaming
from ..llvm.symbols import symbol_for
from .llvm_unlocked import emit_object

PTR = ir.PointerType()


@dataclass(frozen=True)
class CpuIR:
    text: str  # LLVM IR (unoptimized)
    symbol: str  # function name in `text`
    layout: LoopLayout  # loop layout; its dims_array() is the kernel's last argument
    kind: str  # "map" or "reduce" ("small-map", "small-reduce": see is_small)


def mark_noalias(fn: ir.Function, first: int):
    fn.attributes.add("nounwind")
    # Full-width AVX-512 vectors: LLVM's x86 tuning prefers 256 bits; these loops are
    # throughput-bound polynomial code, measured ~10% faster at 512 (no effect without AVX-512).
    set.add(
        fn.attributes, '"prefer-vector-width"="512"'
    )  # string attribute, not in llvmlite's list
    for a in fn.args[first:]:
        a.add_attribute("noalias")
        a.add_attribute("captures(none)")


class _Frame:
    """Function arguments and run-time dims/strides of one kernel."""

    def __init__(self, b: ir.IRBuilder, layout: LoopLayout, dims_arg, n_inputs: int):
        self.b = b

        def load_i64(j):
            return b.load(b.gep(dims_arg, [i64(j)], inbounds=True, source_etype=I64), typ=I64)

        self.dims = [load_i64(layout.dim_index(d)) for d in range(len(layout.dims))]
        self.strides = []
        for k, st in enumerate(layout.strides):
            self.strides.append(
                [
                    i64(s) if s in (0, 1) else load_i64(layout.stride_index(k, d))
                    for d, s in enumerate(st)
                ]
            )
        self.n_inputs = n_inputs

    def group(self, layout: LoopLayout, g: int):
        s = sum(layout.groups[:g])
        e = s + layout.groups[g]
        return self.dims[s:e], [st[s:e] for st in self.strides]


def _loader(e: Emitter, ins, dtypes, offs):
    b = e.b

    def load(i):
        t = storage_type(dtypes[i])
        v = b.load(b.gep(ins[i], [offs[i]], inbounds=True, source_etype=t), typ=t)
        return from_storage(e, v, dtypes[i])

    return load


def _store(e: Emitter, ptr, idx, v, dt):
    t = storage_type(dt)
    e.b.store(to_storage(e, v, dt), e.b.gep(ptr, [idx], inbounds=True, source_etype=t))


def _map_function(
    module: ir.Module,
    spec: KernelSpec,
    layout: LoopLayout,
    symbol: str,
    streaming: bool = False,
    small: bool = False,
):
    n_out, n_in = len(spec.outputs), len(spec.inputs)
    fnty = ir.FunctionType(ir.VoidType(), [I64, I64] + [PTR] * (n_out + n_in + 1))
    fn = ir.Function(module, fnty, symbol)
    mark_noalias(fn, 2)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    e = Emitter(b, fast_ldexp=has_avx512(), outline=small)
    lo, hi = fn.args[:2]
    outs, ins, dims_arg = fn.args[2 : 2 + n_out], fn.args[2 + n_out : -1], fn.args[-1]
    frame = _Frame(b, layout, dims_arg, n_in)
    dtypes, odt = spec.input_dtypes, spec.output_dtypes

    def compute(b, start, stop, sinks):
        def body(b, offs, flat):
            vals = lower(e, list(spec.outputs), dtypes, _loader(e, ins, dtypes, offs))
            for sink, v, dt in zip(sinks, vals, odt):
                b.store(to_storage(e, v, dt), sink(b, flat))

        strided_range(b, start, stop, frame.dims, frame.strides, [i64(0)] * n_in, body)

    if streaming:
        tiled_streaming(b, lo, hi, outs, odt, compute)
    else:
        compute(
            b,
            lo,
            hi,
            [
                (
                    lambda b, flat, p=p, dt=dt: b.gep(
                        p, [flat], inbounds=True, source_etype=storage_type(dt)
                    )
                )
                for p, dt in zip(outs, odt)
            ],
        )
    b.ret_void()


def _reduce_function(
    module: ir.Module, spec: ReduceSpec, layout: LoopLayout, symbol: str, small: bool = False
):
    n_in = len(spec.inputs)
    fnty = ir.FunctionType(ir.VoidType(), [I64] * 4 + [PTR] * (n_in + 2))
    fn = ir.Function(module, fnty, symbol)
    mark_noalias(fn, 4)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    e = Emitter(b, fast_ldexp=has_avx512(), outline=small)
    o0, o1, r0, r1 = fn.args[:4]
    out, ins, dims_arg = fn.args[4], fn.args[5:-1], fn.args[-1]
    frame = _Frame(b, layout, dims_arg, n_in)
    dtypes, dt = spec.input_dtypes, spec.dtype
    init = init_constant(spec.identity, dt)
    (k1_dims, k1_st), (r_dims, r_st), (k2_dims, k2_st) = (frame.group(layout, g) for g in range(3))

    def value_at(offs):
        return lower(e, [spec.body], dtypes, _loader(e, ins, dtypes, offs))[0]

    if not k2_dims:  # trailing reduction: accumulate in a register per output element
        acc = entry_alloca(b, init.type, "acc")

        def per_output(b, offs1, o):
            b.store(init, acc)

            def step(b, offs, _):
                b.store(combine(e, spec.op, b.load(acc, typ=init.type), value_at(offs), dt), acc)

            strided_range(b, r0, r1, r_dims, r_st, offs1, step, "red")
            _store(e, out, o, b.load(acc, typ=init.type), dt)

        strided_range(b, o0, o1, k1_dims, k1_st, [i64(0)] * n_in, per_output, "out")
        b.ret_void()
        return

    # Kept trailing axes: sweep the reduced axes outside, update a row of outputs inside,
    # so that the inner loop is contiguous in the output and vectorizes.
    n2 = k2_dims[0]
    for d in k2_dims[1:]:
        n2 = b.mul(n2, d)
    t = storage_type(dt)

    def per_row(b, offs1, k1):
        row = b.mul(k1, n2)
        a = b.sub(b.select(b.icmp_signed(">", o0, row), o0, row), row)
        row_end = b.add(row, n2)
        z = b.sub(b.select(b.icmp_signed("<", o1, row_end), o1, row_end), row)
        slot = lambda b, j: b.gep(out, [b.add(row, j)], inbounds=True, source_etype=t)
        counted_loop(b, a, z, lambda b, j: b.store(init, slot(b, j)), "init")

        def sweep(b, offs_r, _):
            def update(b, offs, j):
                p = slot(b, j)
                b.store(combine(e, spec.op, b.load(p, typ=t), value_at(offs), dt), p)

            strided_range(b, a, z, k2_dims, k2_st, offs_r, update, "kept")

        strided_range(b, r0, r1, r_dims, r_st, offs1, sweep, "red")

    if k1_dims:
        k1_lo = b.udiv(o0, n2)
        k1_hi = b.add(b.udiv(b.sub(o1, i64(1)), n2), i64(1))
        empty = b.icmp_signed(">=", o0, o1)
        with b.if_then(b.not_(empty)):
            strided_range(b, k1_lo, k1_hi, k1_dims, k1_st, [i64(0)] * n_in, per_row, "out")
    else:
        with b.if_then(b.icmp_signed("<", o0, o1)):
            per_row(b, [i64(0)] * n_in, i64(0))
    b.ret_void()


def build_module(
    spec,
    symbol: str,
    layout: LoopLayout | None = None,
    triple: str = "",
    datalayout: str = "",
    small: bool = False,
) -> ir.Module:
    """small: math routines are called, not inlined (Emitter.outline; cpu_ir sets it for
    is_small kernels, which never vectorize)."""
    layout = layout or spec_layout(spec)
    module = ir.Module(name="dlvm_eq")  # not spec.name: equal kernels must have equal IR
    module.triple = triple
    module.data_layout = datalayout
    if isinstance(spec, KernelSpec):
        streaming = use_streaming_stores(spec, triple)
        _map_function(module, spec, layout, symbol, streaming=streaming, small=small)
    elif isinstance(spec, ReduceSpec):
        _reduce_function(module, spec, layout, symbol, small=small)
    else:
        raise TypeError(f"not a kernel spec: {spec!r}")
    return module


def use_streaming_stores(spec: KernelSpec, triple: str) -> bool:
    """Non-temporal stores for large outputs on x86 (see streaming.py)."""
    out_bytes = spec.size * sum(DTYPES[d].itemsize for d in spec.output_dtypes)
    return triple.startswith("x86_64") and out_bytes >= NT_MIN_BYTES


# A kernel over fewer elements than one 256-bit vector holds never runs a vector loop body
# (LLVM's narrowest vector loop here is 8 f32 or 4 f64 lanes): it compiles without the
# vectorizers, through the CLEANUP pipeline, and calls its math routines instead of inlining
# them (Emitter.outline: inlined, 30 tanh made one 2,000-instruction block that LLVM's
# instruction selection and register allocation took most of the time on). Measured
# (benchmarks/small_kernels.py, CPU time per call): no slower at sizes under one vector (at
# 8-15 f32 or 4-15 f64, 1.3-2.0x slower). The 30-layer tanh chain's gradient on 6 floats: LLVM
# time 0.82 -> 0.35 s (O2, no vectorizers), then 0.38 -> about 0.03 s of CPU (math called,
# CLEANUP). Its IR starts with SMALL_HEADER, so its symbol (a hash of the IR) differs from a
# large kernel's of the same spec: the two object codes never stand in for each other.
SMALL_KERNEL_BYTES = 32
SMALL_HEADER = "; small kernel: math routines called, cleanup passes only, no vectorizers\n"


def is_small(spec) -> bool:
    """Whether a map or reduction kernel iterates over fewer elements than one 256-bit vector
    of its widest dtype holds (counted as at least 4 bytes: bool and i32 kernels as f32's).

    >>> from dlvm_eq.codegen.kernels.kernel_spec import KernelInput
    >>> from dlvm_eq.codegen.kernels.spec import Load
    >>> is_small(KernelSpec("k", (7,), [KernelInput("f32")], [Load(0) + 1.0]))
    True
    >>> is_small(KernelSpec("k", (4,), [KernelInput("f64")], [Load(0) + 1.0]))
    False
    """
    dtypes = set(spec.input_dtypes)
    dtypes |= set(spec.output_dtypes) if isinstance(spec, KernelSpec) else {spec.dtype}
    widest = max([4] + [DTYPES[d].itemsize for d in dtypes])
    return math.prod(spec.shape) * widest < SMALL_KERNEL_BYTES


def cpu_ir(spec) -> CpuIR:
    """LLVM IR text for the host CPU; the symbol hashes the IR so equal kernels coincide."""
    tm = target_machine()
    layout = spec_layout(spec)
    args = dict(layout=layout, triple=tm.triple, datalayout=str(tm.target_data))
    small = is_small(spec)
    head = SMALL_HEADER if small else ""
    text, symbol = symbol_for(lambda sym: head + str(build_module(spec, sym, small=small, **args)))
    kind = "map" if isinstance(spec, KernelSpec) else "reduce"
    return CpuIR(text, symbol, layout, f"small-{kind}" if small else kind)


# ------------------------------------------------------------------ LLVM: target and passes

_lock = LLVM_LOCK  # parsing, passes and code emission share LLVM's global context
_tm = None


def target_machine() -> llvm.TargetMachine:
    """The host's target machine (host CPU name and features, -O3, JIT code model)."""
    global _tm
    with _lock:
        if _tm is None:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            target = llvm.Target.from_default_triple()
            _tm = target.create_target_machine(
                cpu=llvm.get_host_cpu_name(),
                features=llvm.get_host_cpu_features().flatten(),
                opt=3,
                codemodel="jitdefault",
            )
        return _tm


@functools.cache
def has_avx512() -> bool:
    return "+avx512f" in llvm.get_host_cpu_features().flatten().split(",")


@functools.cache
def host_key() -> str:
    """What object code depends on besides the IR: triple, CPU, features, llvmlite version."""
    tm = target_machine()
    return "|".join(
        [
            tm.triple,
            llvm.get_host_cpu_name(),
            llvm.get_host_cpu_features().flatten(),
            llvmlite.__version__,
        ]
    )


# LLVM's pipeline per kernel family (CpuIR.kind): (speed level, vectorizers on), where it was
# measured cheaper to compile and no slower to run; every other family gets O3, vectorizers on.
# gemm: its explicit vectors; the vectorizers only blow up its scalar packing loops (310 ms to
# compile -> 90 ms, same speed). im2col, col2im (memory-bound copies): O2 took a quarter less
# LLVM time on the CNN step, the kernels no slower (BENCHMARKS.md, "LLVM pipeline per family").
FAMILY_PIPELINE = {"gemm": (2, False), "im2col": (2, True), "col2im": (2, True)}
# Speed level CLEANUP is not LLVM's O0 but one round of sroa, instcombine and simplifycfg over
# each function, before the back end (still at -O3) selects, schedules and allocates registers.
# Our map bodies are straight-line code that the emitter has already CSE'd, and the O2 pipeline
# spent most of its time re-running instcombine over them. On the tanh-30 gradient's largest
# kernel, math inlined (about 2,000 instructions): LLVM CPU time 0.106 -> 0.064 s, the same ns
# per element and bitwise the same results (BENCHMARKS.md, "Small kernels: math called").
CLEANUP = 0
# maps and reductions smaller than one vector (is_small): no vector loop body ever runs, and the
# loop runs under 8 times, so LLVM's loop passes have nothing to gain
FAMILY_PIPELINE.update({"small-map": (CLEANUP, False), "small-reduce": (CLEANUP, False)})


def family_pipeline(kind: str) -> tuple[int, bool]:
    """(speed level, vectorize) for a kernel of family `kind` (FAMILY_PIPELINE)."""
    return FAMILY_PIPELINE.get(kind, (3, True))


def run_passes(mod: llvm.ModuleRef, tm, vectorize: bool = True, speed: int | None = None):
    """Optimize `mod` in place: LLVM's pipeline at `speed` (default O3 with the loop and SLP
    vectorizers, O2 with vectorize=False), or the CLEANUP passes at speed CLEANUP."""
    if speed is None:
        speed = 3 if vectorize else 2
    pto = llvm.create_pipeline_tuning_options(speed_level=speed)
    pto.loop_vectorization = pto.slp_vectorization = vectorize and speed != CLEANUP
    pb = llvm.create_pass_builder(tm, pto)
    if speed != CLEANUP:
        pb.getModulePassManager().run(mod, pb)
        return
    fpm = llvm.create_new_function_pass_manager()
    fpm.add_sroa_pass()  # a reduction's accumulator slot -> a register
    fpm.add_instruction_combine_pass()
    fpm.add_simplify_cfg_pass()
    for fn in mod.functions:
        if not fn.is_declaration:
            fpm.run(fn, pb)


def optimize(ir_text: str, vectorize: bool = True, speed: int | None = None) -> llvm.ModuleRef:
    """Parse, verify and run the O3 pipeline (loop and SLP vectorization on), or O2 without
    the vectorizers (vectorize=False), or the given speed level (FAMILY_PIPELINE)."""
    tm = target_machine()
    with _lock:  # LLVM's pass managers are not to be shared between threads
        mod = llvm.parse_assembly(ir_text)
        mod.verify()
        run_passes(mod, tm, vectorize, speed)
    return mod


_own = threading.local()  # this thread's LLVM context and target machine (compile_object)


def _own_llvm() -> tuple:
    """(context, target machine) of this thread: LLVM runs concurrently in distinct
    contexts, so kernels build in parallel without the global context's lock."""
    own = getattr(_own, "llvm", None)
    if own is None:
        target_machine()  # LLVM's native target initialized (once, under the lock)
        with _lock:
            tm = llvm.Target.from_default_triple().create_target_machine(
                cpu=llvm.get_host_cpu_name(),
                features=llvm.get_host_cpu_features().flatten(),
                opt=3,
                codemodel="jitdefault",
            )
            own = _own.llvm = (llvm.create_context(), tm)
    return own


def compile_object(ir_text: str, vectorize: bool = True, speed: int | None = None) -> bytes:
    """IR text -> optimized native object code for the host (the same bytes as `optimize`
    + emit in the global context: tests/test_parallel_kernels.py), in this thread's own LLVM
    context: threads compile at once (llvm_unlocked: ctypes releases the GIL, and the O1-O3
    pipelines skip llvmlite's lock; the CLEANUP passes, for small kernels, still take it)."""
    context, tm = _own_llvm()
    if speed is None:
        speed = 3 if vectorize else 2
    if speed != CLEANUP:  # outside llvmlite's process-wide lock: see llvm_unlocked
        return emit_object(context, tm, ir_text, speed, vectorize)
    mod = llvm.parse_assembly(ir_text, context=context)
    mod.verify()
    run_passes(mod, tm, vectorize, speed)
    return tm.emit_object(mod)


def assembly(ir_text: str, vectorize: bool = True, speed: int | None = None) -> str:
    """Optimized host assembly, for inspection (e.g. to check that loops are vectorized)."""
    mod = optimize(ir_text, vectorize, speed)
    with _lock:
        return target_machine().emit_assembly(mod)
