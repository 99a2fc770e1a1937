"""The `cpu` and `gpu` back ends: IR -> `dq.optimize` -> kernel plan -> compiled program.

    f = dq.compile(module, "f", target="cpu")     # a callable on numpy arrays
    f(x, w)
    print(f.report)                                # e-graph, costs, kernels, BLAS calls, timings
    print(f.plan)                                  # what was fused
    dq.jit(fn)                                     # registered as the DSL's "cpu"/"gpu" targets

`compile_seconds()` is the process's compile time split by phase (trace, optimize, plan,
kernels); `dlvm_eq.codegen.stats()` says how many kernels were compiled or found on disk.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from ..errors import DlvmError
from ..ir.module import Module
from ..ir_cache import cached_function
from .executor import program
from .fusion import plan_function
from .gpu_runtime import GpuUnavailable, cupy_module
from .plan import Plan

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
    cost before/after), the kernels and BLAS calls of the plan, and the time of each phase."""
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
        kernels = self.plan.kernels
        lines.append(f"  kernels: {len(kernels)}" + (" (" + ", ".join(k.name for k in kernels) + ")" if kernels else ""))
        blas = self.plan.blas_calls
        lines.append(f"  BLAS calls: {len(blas)}" + (" (" + ", ".join(
            f"{b.a.text(self.plan.slots)} @ {b.b.text(self.plan.slots)}" for b in blas) + ")" if blas else ""))
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
    from ..egraph.report import seconds_text
    return seconds_text(s)


def optimized(module: Module, name: str, target: str):
    """(module with `name` optimized, OptimizeResult or None, note); cached per IR text."""
    from ..egraph.optimize import optimize
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
            res = optimize(module, func=name, target=target)
            built.append(res)
            return res.module[name]
        # a second process compiling the same program reads the optimized function from disk
        fn = cached_function("optimize", [key[0], name, target], build)
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


def compile(module: Module, name: str, target: str = "cpu", optimize: bool = True) -> Compiled:
    """A callable running function `name` of `module` as native kernels on `target`.

    Declared adjoints (`[adjoint @f ...]` without a body) are synthesized first; `apply`s are
    inlined. `optimize=False` skips the e-graph (the IR is planned as written)."""
    if target not in TARGETS:
        raise DlvmError(f"unknown target {target!r} (expected one of {', '.join(TARGETS)})")
    if target == "gpu":
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
    plan = plan_function(module[fn.name], module, rows=(target == "cpu"))
    seconds["plan"] = time.perf_counter() - t0
    _add_seconds("plan", seconds["plan"])
    prog = program(plan, target)
    seconds["kernels"] = prog.kernel_seconds
    _add_seconds("kernels", prog.kernel_seconds)
    report = CompileReport(fn.name, target, plan, result, note, seconds)
    return Compiled(prog, report)


def _with(module: Module, fn) -> Module:
    out = Module(module.name, module.stage)
    for n, f in module.functions.items():
        out.add(fn if n == fn.name else f)
    return out


# ------------------------------------------------------------------ DSL back ends

def _jit_backend(target: str):
    def compile_for_jit(module: Module, name: str):
        return compile(module, name, target)
    return compile_for_jit


def register() -> None:
    from ..dsl.api import register_backend
    for t in TARGETS:
        register_backend(t, _jit_backend(t))


__all__ = ["CompileReport", "Compiled", "GpuUnavailable", "compile", "compile_seconds",
           "optimized", "register"]
