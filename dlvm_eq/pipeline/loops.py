"""Running functions with loops and branches on the cpu and gpu targets: the function is first
optimized with every body it reaches in ONE e-graph session (egraph/optimize_loops.py: each
straight piece and each body loaded once, saturated by the same rules, extracted jointly);
then it is cut at its control-flow ops (ir/regions.py) and each straight piece and each body
is planned and compiled ONCE as extracted (fusion, plan, kernels), and a small driver runs
the loop, calling the compiled body once per step. A body with loops of its own is compiled
the same way.

    f = compile_loops(module, "rnn", "cpu")     # what dq.compile / dq.jit do for such a module
    f(w, h0, xs)
    print(f.report)                               # the one e-graph; one report per piece, body

Execution: on cpu a scan or while loop whose bodies' plans allow it (codegen/planning/
loop_plan.py) runs on the native loop driver (codegen/execution/native_loop.py; bodies with
loops or branches of their own: native_nest.py): no Python between steps, the body's arena and
output buffers reused by every step and the stacked ys written in place. On gpu a loop runs
on the gpu executor (codegen/execution/gpu_loop.py: the body's plan steps on one slot list,
carries moved by pointer; gpu_flow.py: a scan body with branches or loops). Otherwise (a
switch in a body, a reduction cut in slices, a gpu while loop with control flow in its test
or body, ...) the Python driver below calls
the compiled body once per step; `drivers` says which ran each scan and while loop ("native":
no Python driver), and why. Buffers there:
a compiled body reuses its arena across steps (codegen's executor); its outputs are fresh or
recycled buffers that the driver drops once the next step has read them, and the stacked ys
are allocated once per loop and filled step by step.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DlvmError
from ..extract.machine import machine
from ..ir.control_flow import (
    COND,
    SCAN,
    SWITCH,
    WHILE,
    elements,
    has_control_flow,
    reachable_bodies,
)
from ..ir.loop_rules import apply_loop_rules
from ..ir.module import Const, Function, Module, Operand, Value
from ..ir.regions import normalize, split
from ..ir.types import TupleType
from .timing import phase

if TYPE_CHECKING:
    from .native import Compiled

# dead carries dropped, constant-selector branches and one-step scans inlined (ir/loop_rules.py);
# invariant motion and x_t @ W batching are e-graph rules (rules/loops.egg), priced by the trip
# count. (Batching once measured slower, LSTM hidden 256, T 64: 96 against 58 ms, because the
# one large product before the loop ran on OpenBLAS's two threads, which then busy-waited
# through the single-threaded loop; with the whole call on one OpenBLAS thread, ONE_BLAS_THREAD,
# it measured even: 32.9 against 32.3 ms CPU a call, load 7-8, 2 cores.)
LOOP_RULES = True
# A function with loops runs every piece's products on one OpenBLAS thread, not only those in
# the native loops: OpenBLAS's workers, woken by one large product between two loops (the
# deferred weight gradients, ir/loop_sums.py; a batched input projection), busy-wait through
# the single-threaded loop that follows. Measured on the 2-core machine at load 8 (CPU time a
# call, GRU hidden 64, T 64): 131 ms with OpenBLAS's two threads against 3.1 ms on one.
ONE_BLAS_THREAD = True
# A scan whose body allows it runs on the native loop driver (no Python between steps); off,
# every scan runs through the Python driver below (benchmarks/rnn.py measures both).
NATIVE_LOOPS = True


def needs_loops(module: Module, name: str) -> bool:
    """Whether function `name` (or what it applies) has control flow."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        fn = module[todo.pop()]
        if fn.name in seen:
            continue
        seen.add(fn.name)
        if fn.is_declaration:  # a declared adjoint has the control flow of what it inverts
            if fn.adjoint is not None:
                todo.append(fn.adjoint.of)
            continue
        if has_control_flow(fn):
            return True
        todo.extend(i.attrs["callee"] for i in fn.body if i.op == "apply")
    return False


@dataclass
class LoopsReport:
    """The reports of the pieces and bodies compiled for one function."""

    name: str
    target: str
    parts: list = field(default_factory=list)  # (label, CompileReport or LoopsReport)
    drivers: list = field(default_factory=list)  # per scan or while: "native", or why not
    optimize: Any = None  # the OptimizeResult of the one e-graph (pieces and bodies), or None
    note: str = ""

    def __str__(self) -> str:
        lines = [f"compiled @{self.name} for {self.target} in {len(self.parts)} parts"]
        fr = self.optimize.report.functions.get(self.name) if self.optimize else None
        if fr is not None:
            lines.append(f"  e-graph (one for every piece and body): {fr.e_classes} e-classes")
            if fr.saturation is not None:
                from ..egraph.saturate import rule_label

                top = fr.saturation.top_rules()[:8]
                text = ", ".join(f"{rule_label(r)} x{n}" for r, n in top)
                lines.append(f"  rules fired: {text or 'none'}")
            if fr.user_rules:
                lines.append(
                    "  your rules fired: "
                    + ", ".join(f"{f}:{ln} {r} x{n}" for f, ln, r, n in fr.user_rules)
                )
            lines.append(f"  {fr.note}")
            lines.extend(f"  {line}" for line in fr.never_slower)  # each piece and body
        if self.note:
            lines.append(f"  note: {self.note}")
        lines.extend(f"  scan {k}: driver {d}" for k, d in enumerate(self.drivers))
        for label, report in self.parts:
            lines.append(f"  {label}:")
            lines.extend("    " + line for line in str(report).splitlines())
        return "\n".join(lines)


@dataclass
class _Compiling:
    """One compile's settings and the bodies it compiled (each once)."""

    target: str
    optimize: bool
    done: dict = field(default_factory=dict)  # id(Function) -> (Function, compiled)
    rules: tuple = ()  # the user's rule files, for every piece and body


def compile_loops(
    module: Module,
    name: str,
    target: str = "cpu",
    cast: bool = False,
    optimize: bool = True,
    rules=(),
):
    """A callable running function `name` of `module` (numpy arrays in and out on cpu, CuPy
    on gpu), each straight piece and each loop body compiled once (pieces always cast their
    arguments to the declared dtypes: `cast` is accepted for dq.compile's signature)."""
    from .adjoints import resolve_adjoints

    module = resolve_adjoints(module, [name])
    fn, result, note = module[name], None, ""
    if target == "cpu" and NATIVE_LOOPS:
        _prebuild_runtime(fn)
    if optimize:  # every piece and body in ONE e-graph session; each then planned as extracted
        fn, result, note = optimized_with_bodies(module, name, target, tuple(rules))
    program = _Program(fn, module, _Compiling(target, False, rules=tuple(rules)))
    program.report.optimize, program.report.note = result, note
    return program


_prebuilt: list = []  # the one thread compiling the native loops' runtime, once started


def _prebuild_runtime(fn: Function) -> None:
    """Compile the native loop driver and our GEMM (where a loop's products may run on a
    prepacked weight) on another thread while the e-graph optimizes, where another core is free: both
    are the same for every program, built once per process (cached on disk), and were built
    last, when the first native scan asked for them: about 0.3 s of CPU of the GRU's cold
    compile (benchmarks/rnn.py, T = 8), which now overlaps the rest."""
    from ..codegen.runtime.cpu_count import usable_cpus

    if _prebuilt or usable_cpus() < 2 or not any(i.op == SCAN for i in _all_insts(fn)):
        return
    with _lock:
        if _prebuilt:
            return
        gemm = _may_prepack(fn)
        t = threading.Thread(target=_build_runtime, args=(gemm,), name="dlvm_eq-loop-runtime")
        _prebuilt.append(t)  # not a daemon: the interpreter lets it finish its cache writes
    t.start()


def _all_insts(fn: Function):
    yield from fn.body
    for b in reachable_bodies(fn):
        yield from b.body


def _may_prepack(fn: Function) -> tuple[int, ...]:
    """The rows of each body product large enough, as written, for our GEMM on a prepacked
    weight (execution/packed_products.prepack decides on the plan; a guess costs at most a
    build on the other thread): the GRU at hidden 256 (k n = 65536), not at 64 (4096). The
    rows pick the micro-tile (gemm_runtime.packed_b_gemm)."""
    from ..codegen.execution.packed_products import MAX_ROWS, MIN_DEPTH_WIDTH
    from ..codegen.runtime.gemm_runtime import prepacking_enabled

    if not prepacking_enabled():
        return ()
    rows: set[int] = set()
    for body in reachable_bodies(fn):
        for i in body.body:
            shapes: list[tuple[int, ...]] = [
                tuple(getattr(o.type, "shape", ())) for o in i.operands[:2]
            ]
            if i.op == "dot" and len(shapes) == 2 and all(len(x) == 2 for x in shapes):
                m, k, n = shapes[0][0], shapes[0][1], shapes[1][1]
                if m <= MAX_ROWS and k * n >= MIN_DEPTH_WIDTH:
                    rows.add(m)
    return tuple(sorted(rows))


def _build_runtime(gemm_rows: tuple[int, ...] = ()) -> None:
    try:
        from ..codegen.runtime.gemm_runtime import packed_b_gemm
        from ..codegen.runtime.loop_driver import loop_driver

        loop_driver()
        for m in gemm_rows:  # the tile each row count runs on (one build per tile)
            packed_b_gemm(m)
    except Exception:
        pass


_lock = threading.Lock()
_optimized: dict[tuple, tuple] = {}  # (function and bodies as text, ...) -> optimized_with_bodies


def optimized_with_bodies(module: Module, name: str, target: str, rules: tuple = ()) -> tuple:
    """(function `name` with its straight pieces and every body it reaches optimized together
    in one e-graph session (egraph/optimize_loops.py), the OptimizeResult or None, a note);
    cached per process by the text of the function and its bodies. The optimizer's limits are
    not the code generator's: on a DlvmError the function runs as written."""
    from ..egraph.rule_origin import UserRuleError
    from .native import rule_files_key

    fn = module[name]
    text = "\n".join(str(f) for f in [fn, *reachable_bodies(fn)])
    key = (text, name, target, machine(target).cost_key, rule_files_key(rules))
    with _lock:
        hit = _optimized.get(key)
    if hit is not None:
        return hit
    with phase("optimize"):
        try:
            from ..egraph import load_bindings

            load_bindings()
            from ..egraph.optimize_loops import optimize_function_with_loops
            from .never_slower import guard_for  # each piece and body: never slower

            res = optimize_function_with_loops(module, name, rules, target, guard_for(target))
            out = (res.module[name], res, "")
        except UserRuleError:  # a user's rule made an ill-typed program: theirs to fix
            raise
        except DlvmError as e:
            out = (fn, None, f"not optimized: {e}")
    with _lock:
        if len(_optimized) > 64:
            _optimized.clear()
        _optimized[key] = out
    return out


class _Program:
    def __init__(self, fn: Function, module: Module | None, ctx: _Compiling):
        self.fn, self.target = fn, ctx.target
        self.report = LoopsReport(fn.name, ctx.target)
        self._xp = _array_module(ctx.target)
        # loop rules first: dead carries dropped, constant branches inlined (ir/loop_rules.py)
        if LOOP_RULES:
            fn = apply_loop_rules(fn)
        params, nodes, results = normalize(fn, module)
        self._params, self._results = params, results
        self._tuple = isinstance(fn.result_type, TupleType)
        # (run, operands read, values defined, whether a region)
        self._steps: list[tuple[Any, Sequence[Operand], list[Value], bool]] = []
        self.drivers = self.report.drivers  # per scan: "native", or why Python runs it
        self._parts: list = []  # for native_nest.py: the steps with their compiled functions
        pieces = split(params, nodes, results, f"{fn.name}.piece")
        with _planning_ahead(pieces, module, ctx):
            self._compile_pieces(pieces, module, ctx)

    def _compile_pieces(self, pieces, module, ctx: _Compiling) -> None:
        for k, piece in enumerate(pieces):
            if piece.region is None:
                assert piece.function is not None  # split() gives each straight piece one
                run = _compiled(piece.function, module, ctx)
                self.report.parts.append((f"piece {k}", run.report))
                self._steps.append((run, piece.inputs, piece.outputs, False))
                self._parts.append(("piece", run, piece.inputs, piece.outputs))
            else:  # a region's operands may be constants
                inst = piece.region.inst
                run = self._region(inst, module, ctx)
                self._steps.append((run, inst.operands, piece.outputs, True))
                self._parts.append(("region", inst, self._bodies, piece.outputs))

    def _region(self, inst, module, ctx: _Compiling):
        compiled = []
        for key in ("cond", "body"):
            if key in inst.attrs:
                compiled.append(_compiled(inst.attrs[key], module, ctx))
        for b in inst.attrs.get("branches", ()):
            compiled.append(_compiled(b, module, ctx))
        self._bodies = compiled
        for fn_report in compiled:
            self.report.parts.append((f"%{inst.result.name} = {inst.op}", fn_report.report))
        xp, attrs = self._xp, inst.attrs
        if inst.op == SCAN:
            native = _native(compiled[0], attrs) if self.target == "cpu" else _gpu(compiled, attrs)
            self.drivers.append(native if isinstance(native, str) or native is None else "native")
            if native is not None and not isinstance(native, str):
                nc, nx = attrs["carries"], attrs["xs"]
                n = attrs["length"]
                return lambda vals: native(vals[:nc], vals[nc : nc + nx], vals[nc + nx :], n)
            return lambda vals: _run_scan(xp, compiled[0], attrs, vals)
        if inst.op == WHILE:
            native = (
                _native_while(compiled, attrs) if self.target == "cpu" else _gpu(compiled, attrs)
            )
            self.drivers.append(native if isinstance(native, str) or native is None else "native")
            if native is not None and not isinstance(native, str):
                return native
            return lambda vals: _run_while(compiled[0], compiled[1], attrs, vals)
        if inst.op == COND:
            return lambda vals: _as_list(compiled[0 if bool(vals[0]) else 1](*vals[1:]))
        assert inst.op == SWITCH
        last = len(compiled) - 1
        return lambda vals: _as_list(compiled[min(max(int(vals[0]), 0), last)](*vals[1:]))

    def parts(self) -> tuple:
        """(params, steps, results): ("piece", compiled, inputs, outputs) and ("region", inst,
        [compiled functions], outputs) steps, for the native loop driver."""
        return self._params, self._parts, self._results

    def __call__(self, *args):
        if len(args) != len(self._params):
            raise DlvmError(f"@{self.fn.name} takes {len(self._params)} arguments, got {len(args)}")
        if self.target != "cpu" or not ONE_BLAS_THREAD:
            return self._run(args)
        from ..codegen.runtime.attention_cpu import one_blas_thread  # (a counted section)

        with one_blas_thread():
            return self._run(args)

    def _run(self, args):
        env: dict[int, object] = {}
        for p, a in zip(self._params, args):
            # (the compiled pieces check or cast each argument's dtype)
            env[id(p)] = a if hasattr(a, "dtype") else self._xp.asarray(a, p.type.dtype.numpy)
        get = self._getter(env)
        for run, inputs, outputs, is_region in self._steps:
            vals = [get(v) for v in inputs]
            outs = run(vals) if is_region else _as_list(run(*vals))
            for v, o in zip(outputs, outs):
                env[id(v)] = o
        results = [get(r) for r in self._results]
        return tuple(results) if self._tuple else results[0]

    def _getter(self, env):
        xp = self._xp

        def get(o):
            if isinstance(o, Const):
                return xp.asarray(o.value, dtype=o.type.dtype.numpy)
            return env[id(o)]

        return get


def _planning_ahead(pieces, module: Module | None, ctx: _Compiling):
    """The straight pieces and the straight bodies of the regions, listed to the fusion stage
    before any is planned: the first plan built compiles the fusion rules of them all
    (egraph/fusion_ahead.py; a plan read from the plan cache loads none)."""
    from ..egraph.fusion_ahead import planning_ahead

    fns = []
    for piece in pieces:
        if piece.region is None:
            fns.append(piece.function)
        else:
            attrs = piece.region.inst.attrs
            fns.extend(attrs[k] for k in ("cond", "body") if k in attrs)
            fns.extend(attrs.get("branches", ()))
    fresh = [f for f in fns if id(f) not in ctx.done and not has_control_flow(f)]
    return planning_ahead((f, module) for f in fresh)


def _compiled(fn: Function, module: Module | None, ctx: _Compiling):
    """`fn` compiled once per compile (a body two loops run is compiled once)."""
    hit = ctx.done.get(id(fn))
    if hit is not None:
        return hit[1]
    run: _Program | Compiled
    if has_control_flow(fn):
        run = _Program(fn, module, ctx)
    else:
        from .native import compile as native_compile

        m = Module(fn.name)
        m.add(fn)
        run = native_compile(
            m, fn.name, ctx.target, optimize=ctx.optimize, cast=True, rules=ctx.rules
        )
    ctx.done[id(fn)] = (fn, run)  # fn kept alive: its id is the key
    return run


def _native(body, attrs):
    """The scan on the native loop driver (codegen/execution/native_loop.py), or why not."""
    if not NATIVE_LOOPS:
        return "native loops are off"
    if isinstance(body, _Program):  # loops or branches of its own
        from ..codegen.execution.native_nest import native_nested_scan

        nc, nx = attrs["carries"], attrs["xs"]
        return native_nested_scan(body, nc, nx, attrs["reverse"], attrs["body"])
    prog = getattr(body, "program", None)
    if prog is None or not hasattr(prog, "take_arena"):
        return "a body without a cpu program"
    from ..codegen.execution.native_loop import native_scan

    return native_scan(prog, attrs["carries"], attrs["xs"], attrs["reverse"])


def _native_while(compiled, attrs):
    """The while loop on the native loop driver, or why not."""
    if not NATIVE_LOOPS:
        return "native loops are off"
    if any(isinstance(c, _Program) for c in compiled):  # loops or branches of their own
        from ..codegen.execution.native_nest import native_nested_while

        return native_nested_while(compiled[0], compiled[1], attrs["carries"], attrs["body"])
    from ..codegen.execution.native_loop import native_while

    return native_while(compiled[0], compiled[1], attrs["carries"])


def _gpu(compiled, attrs):
    """The scan or while loop on the gpu executor (codegen/execution/gpu_loop.py), or why not."""
    from ..codegen.execution import gpu_loop

    progs = [getattr(c, "program", None) for c in compiled]
    if "length" not in attrs:  # a while loop
        return gpu_loop.gpu_while(progs[0], progs[1], attrs["carries"])
    if isinstance(compiled[0], _Program):  # branches or loops of its own
        from ..codegen.execution.gpu_flow import gpu_flow_scan

        return gpu_flow_scan(
            compiled[0], attrs["carries"], attrs["xs"], attrs["reverse"], attrs["body"]
        )
    return gpu_loop.gpu_scan(
        progs[0], attrs["carries"], attrs["xs"], attrs["reverse"], attrs["body"]
    )


def _array_module(target: str):
    if target == "gpu":
        from ..codegen import cupy_module

        return cupy_module()
    return np


def _as_list(out) -> list:
    return list(out) if isinstance(out, tuple) else [out]


def _run_scan(xp, body, attrs, vals) -> list:
    n, nc, nx = attrs["length"], attrs["carries"], attrs["xs"]
    carries, xs, withs = list(vals[:nc]), vals[nc : nc + nx], list(vals[nc + nx :])
    y_types = elements(attrs["body"].result_type)[nc:]
    ys = [xp.empty((n, *t.shape), t.dtype.numpy) for t in y_types]
    call = getattr(body, "program", body)  # the executor itself: one Python call less a step
    for t in range(n - 1, -1, -1) if attrs["reverse"] else range(n):
        out = call(*carries, *[x[t] for x in xs], *withs)
        if type(out) is not tuple:
            out = (out,)
        carries = list(out[:nc])
        for acc, y in zip(ys, out[nc:]):
            acc[t] = y
    return carries + ys


def _run_while(cond, body, attrs, vals) -> list:
    nc = attrs["carries"]
    carries, withs = list(vals[:nc]), list(vals[nc:])
    while bool(cond(*carries, *withs)):
        carries = _as_list(body(*carries, *withs))
    return carries


__all__ = ["LoopsReport", "compile_loops", "needs_loops"]
