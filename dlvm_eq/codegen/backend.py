"""The `cpu` and `gpu` back ends: IR -> `dq.optimize` -> kernel plan -> compiled program.

    f = dq.compile(module, "f", target="cpu")     # a callable on numpy arrays
    f(x, w)
    print(f.report)                                # e-graph, costs, kernels, matmuls, timings
    print(f.plan)                                  # what was fused
    dq.jit(fn)                                     # registered as the DSL's "cpu"/"gpu" targets

`compile_seconds()` is the process's compile time split by phase (trace, optimize, plan,
kernels); `dlvm_eq.codegen.stats()` says how many kernels were compiled or found on disk.

A warm compile (same program, same cache, another process) builds nothing: the optimized
function comes from the IR cache (dlvm_eq/ir/function_cache.py), the plan from the plan cache here
(JSON data, `plan_records.PLAN_SCHEMA`; keyed by the optimized module's text, the target, the rule files and the package
source), the kernels' object code from the kernel cache (cpu_runtime.py). Neither egglog nor
the planner is imported then; `plan_cache_stats` counts plan hits and misses.

Shared state (threads): `_optimized`, `_SECONDS` and `plan_cache_stats` are read and written
under `_lock` (two threads compiling the same module may both optimize it; the results are
equal, the last is kept). A Compiled holds one program, safe to call from many threads (see
executor).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from ..cache import shared_cache
from ..egraph.rulefiles import rules_digest
from ..errors import DlvmError
from ..ir.module import Module
from ..ir.printer import print_module
from ..ir import function_cache as ir_cache
from ..ir.function_cache import cached_function
from .executor import program
from .kernel_cache import cache_key
from ..json_records import RecordError
from .plan import Plan
from .plan_records import plan_schema

TARGETS = ("cpu", "gpu")

_lock = threading.Lock()
_SECONDS = {"optimize": 0.0, "plan": 0.0, "kernels": 0.0}
_optimized: dict[tuple, tuple] = {}     # (IR text, function, target) -> (Module, OptimizeResult)


def compile_seconds() -> dict[str, float]:
    """Seconds this process spent compiling, by phase: trace (dq.jit's tracing), optimize
    (the e-graph), plan (fusion), kernels (LLVM code generation or disk-cache loads)."""
    from ..dsl import api
    with _lock:
        return {"trace": getattr(api, "TRACE_SECONDS", {}).get("trace", 0.0), **_SECONDS}


def _add_seconds(phase: str, s: float) -> None:
    with _lock:
        _SECONDS[phase] += s


@dataclass
class CompileReport:
    """What compiling one function did: the optimizer's report (e-graph size, rules fired,
    cost before/after), the kernels and matmuls of the plan, and the time of each phase."""
    name: str
    target: str
    plan: Plan
    optimize: object = None           # an OptimizeResult, or None when not optimized
    note: str = ""
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def kernel_names(self) -> list[str]:
        return [k.name for k in self.plan.kernels]

    def __str__(self) -> str:
        lines = [f"compiled @{self.name} for {self.target}"]
        fr = None
        if self.optimize is not None:
            try:
                fr = self.optimize.report[self.name]
            except KeyError:
                fr = None
        if fr is not None:
            sat = fr.saturation
            lines.append(f"  e-graph: {fr.e_classes} e-classes"
                         + (f", e-nodes {sat.nodes_before} -> {sat.nodes} ({sat.stop_reason})" if sat else ""))
            fired = _rules_fired(sat)
            lines.append(f"  rules fired: {fired or 'none'}")
            lines.append(f"  cost (model): {_seconds_text(fr.cost_before)} -> {_seconds_text(fr.cost_after)}"
                         + (" (original kept: " + fr.note + ")" if fr.kept_original else ""))
        if self.note:
            lines.append(f"  note: {self.note}")
        if self.plan.fusion is not None:
            lines.append(f"  {self.plan.fusion}")
        kernels = self.plan.kernels
        lines.append(f"  kernels: {len(kernels)}" + (" (" + ", ".join(k.name for k in kernels) + ")" if kernels else ""))
        blas = self.plan.blas_calls
        lines.append(f"  matmuls: {len(blas)}" + (" (" + ", ".join(
            f"{b.a.text(self.plan.slots)} @ {b.b.text(self.plan.slots)}" for b in blas) + ")" if blas else ""))
        epilogues = self.plan.epilogues
        if epilogues:
            lines.append("  GEMM epilogues: " + ", ".join(
                f"{g.epilogue.name} on {g.blas.a.text(self.plan.slots)} @ {g.blas.b.text(self.plan.slots)}"
                for g in epilogues) + " (run on each tile of the product by our GEMM)")
        if self.seconds:
            lines.append("  time: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.seconds.items()))
        return "\n".join(lines)


def _rules_fired(sat) -> str:
    if sat is None or not sat.rule_matches:
        return ""
    from ..egraph.saturate import rule_label
    top = sat.top_rules()
    return ", ".join(f"{rule_label(r)} x{n}" for r, n in top[:8]) + (", ..." if len(top) > 8 else "")


def _seconds_text(s: float) -> str:
    from ..egraph.optimize_report import seconds_text
    return seconds_text(s)


def optimized(module: Module, name: str, target: str):
    """(module with `name` optimized, OptimizeResult or None, note); cached per IR text."""
    key = (str(module), name, target)
    with _lock:
        hit = _optimized.get(key)
    if hit is not None:
        return hit
    t0 = time.perf_counter()
    note = ""
    try:
        built = []

        def build():
            from ..egraph import load_bindings  # egglog: only when an e-graph is built
            load_bindings()
            from ..egraph.optimize import optimize
            res = optimize(module, func=name, target=target)
            built.append(res)
            return res.module[name]
        # a second process compiling the same program reads the optimized function from disk
        fn = cached_function("optimize", [key[0], name, target], build, rules_digest())
        if built:
            out = (built[0].module, built[0], note)
        else:
            note = "optimized program read from the compile cache (no e-graph built)"
            result = Module(module.name, module.stage, dict(module.functions))
            result.functions[name] = fn
            out = (result, None, note)
    except DlvmError as e:   # the optimizer's limits are not the code generator's: run as written
        note = f"not optimized: {e}"
        out = (module, None, note)
    _add_seconds("optimize", time.perf_counter() - t0)
    with _lock:
        if len(_optimized) > 256:
            _optimized.clear()
        _optimized[key] = out
    return out


class Compiled:
    """A compiled function: call it like the IR function (numpy arrays in and out on cpu,
    CuPy on gpu). `.plan` shows what was fused, `.report` what compiling did."""

    def __init__(self, program, report: CompileReport):
        self._program = program
        self.report = report
        self.plan = report.plan

    def __call__(self, *args):
        return self._program(*args)

    def __repr__(self):
        return f"<compiled @{self.report.name} for {self.report.target}: {self.plan.summary()}>"


def compile(module: Module, name: str, target: str = "cpu", optimize: bool = True,
            cast: bool = False) -> Compiled:
    """A callable running function `name` of `module` as native kernels on `target`.

    Declared adjoints (`[adjoint @f ...]` without a body) are synthesized first; `apply`s are
    inlined. `optimize=False` skips the e-graph (the IR is planned as written). An argument
    of another dtype than declared is a DlvmError unless `cast=True` (never from complex or
    object arrays); Python numbers take the declared dtype where their kind fits
    (codegen/arguments.py)."""
    if target not in TARGETS:
        raise DlvmError(f"unknown target {target!r} (expected one of {', '.join(TARGETS)})")
    if target == "gpu":
        from .gpu_runtime import cupy_module
        cupy_module()     # GpuUnavailable (a DlvmError) says why the GPU cannot be used
    fn = module[name]
    seconds = {}
    note = ""
    result = None
    if fn.is_declaration:
        from ..ad import synthesize_declared
        t0 = time.perf_counter()
        module = _with(module, synthesize_declared(module, fn))
        seconds["adjoint"] = time.perf_counter() - t0
    if optimize:
        t0 = time.perf_counter()
        module, result, note = optimized(module, fn.name, target)
        seconds["optimize"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    plan = planned(module, fn.name, target)
    seconds["plan"] = time.perf_counter() - t0
    _add_seconds("plan", seconds["plan"])
    prog = program(plan, target, cast=cast)
    seconds["kernels"] = prog.kernel_seconds
    _add_seconds("kernels", prog.kernel_seconds)
    report = CompileReport(fn.name, target, plan, result, note, seconds)
    return Compiled(prog, report)


# ------------------------------------------------------------------ the plan cache

PLAN_FORMAT = "2"     # bump when what a plan entry holds changes (2: JSON, was a pickle)
plan_cache_stats = {"hits": 0, "misses": 0}


def _plan_settings() -> str:
    """What a CPU plan depends on besides the module: GEMM epilogue fusion's switch and the
    product size from which our GEMM is used (settable at run time, e.g. by tests)."""
    from . import gemm_runtime
    return f"epilogues={gemm_runtime.epilogues_enabled()},gemm={gemm_runtime.enabled()}:{gemm_runtime.GEMM_MIN_MACS}"


def planned(module: Module, name: str, target: str) -> Plan:
    """`plan_function(module[name], module, rows=rows_for(target), target=target)`, or the plan a previous
    process stored for the same module text, target, rule files and package source. A plan
    entry that does not read back as a Plan is rebuilt and overwritten. DLVM_EQ_NO_IR_CACHE=1
    turns this cache off along with the IR cache."""
    def build() -> Plan:
        from .fusion import plan_function, rows_for  # the planner loads only when a plan is built
        return plan_function(module[name], module, rows=rows_for(target), target=target)

    if not ir_cache.enabled():
        return build()
    from .. import __version__
    from ..cache import source_digest
    key = cache_key("plan", PLAN_FORMAT, __version__, source_digest(), rules_digest(),
                    name, target, print_module(module), _plan_settings())
    cache = shared_cache()
    data = cache.get("plan", key)
    if data is not None:
        plan = _load_plan(data)
        if plan is not None:
            with _lock:
                plan_cache_stats["hits"] += 1
            return plan
        with _lock:
            cache.corrupt += 1   # checksum fine but not a plan: rebuilt and overwritten
    with _lock:
        plan_cache_stats["misses"] += 1
    plan = build()
    try:
        cache.put("plan", key, plan_schema().dumps(plan).encode())
    except RecordError:
        pass    # a plan holding something that is not data is simply not cached
    return plan


def _load_plan(data: bytes) -> Plan | None:
    try:
        plan = plan_schema().loads(data)
    except RecordError:    # any unreadable entry is a miss
        return None
    return plan if isinstance(plan, Plan) else None


def _with(module: Module, fn) -> Module:
    out = Module(module.name, module.stage)
    for n, f in module.functions.items():
        out.add(fn if n == fn.name else f)
    return out


# ------------------------------------------------------------------ DSL back ends

def _jit_backend(target: str):
    def compile_for_jit(module: Module, name: str):
        # jit traced the function for its arguments' own types (int64 arrays as i32, as JAX
        # does without x64), so the compiled function takes what it was traced for
        return compile(module, name, target, cast=True)
    return compile_for_jit


def register() -> None:
    from ..dsl.api import register_backend
    for t in TARGETS:
        register_backend(t, _jit_backend(t))


def __getattr__(name):
    if name == "GpuUnavailable":      # the GPU launcher (and its PTX generator) load on demand
        from .gpu_runtime import GpuUnavailable
        return GpuUnavailable
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CompileReport", "Compiled", "compile", "compile_seconds", "optimized", "planned",
           "register"]
