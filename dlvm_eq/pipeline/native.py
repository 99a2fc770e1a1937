"""The `cpu` and `gpu` compile pipeline: IR -> declared adjoints resolved -> `dq.optimize` ->
fusion decision and kernel plan (planning.py) -> compiled program.

    f = dq.compile(module, "f", target="cpu")     # a callable on numpy arrays
    f(x, w)
    print(f.report)                                # e-graph, costs, kernels, matmuls, timings
    print(f.plan)                                  # what was fused

`compile_seconds()` is the process's compile time split by phase (trace, optimize, plan,
kernels); `dlvm_eq.codegen.stats()` says how many kernels were compiled or found on disk.

A warm compile (same program, same cache, another process) builds nothing: the optimized
function comes from the IR cache (dlvm_eq/ir/function_cache.py), the plan from the plan cache
(planning.py), the kernels' object code from the kernel cache (codegen). Neither egglog nor
the planner is imported then.

Shared state (threads): `_optimized` is read and written under `_lock` (two threads compiling
the same module may both optimize it; the results are equal, the last is kept). A Compiled
holds one program, safe to call from many threads (see codegen's executor).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING

from ..cache import watching_time_cuts
from ..codegen import Plan, program
from ..codegen.kernels.row_limit import use_scratch
from ..codegen.runtime.batch_gemm import use_blocks as use_gemm_blocks
from ..codegen.runtime.conv_blocks import use_blocks as use_conv_blocks
from ..egraph.rulefiles import rules_digest
from ..errors import DlvmError
from ..extract.machine import machine
from ..extract.profile import load_profile
from ..ir.attention_op import use_tile_blocks
from ..ir.function_cache import cached_function, function_key
from ..ir.module import Module
from ..records import dataclass
from ..units import seconds_text
from .adjoints import resolve_adjoints
from .planning import planned
from .timing import PHASES, compile_phases, compile_seconds, phase

if TYPE_CHECKING:
    from ..egraph.optimize import OptimizeResult
    from .measure_time import Measured

TARGETS = ("cpu", "gpu")

_lock = threading.Lock()
_optimized: dict[tuple, tuple] = {}  # (IR text, function, target) -> (Module, OptimizeResult)


@dataclass
class CompileReport:
    """What compiling one function did: the optimizer's report (e-graph size, rules fired,
    cost before/after), the kernels and matmuls of the plan, and the time of each phase."""

    name: str
    target: str
    plan: Plan
    optimize: OptimizeResult | None = None  # an OptimizeResult, or None when not optimized
    note: str = ""
    seconds: dict[str, float] = field(default_factory=dict)
    measured: Measured | None = None  # a measure_time.Measured, once `measure_compiled` ran it
    # where the compile went, phase by phase (timing.PHASES; dq.jit adds trace and adjoint)
    phases: dict[str, float] = field(default_factory=dict)
    # issue 32: the e-graphs of the adjoints whose algebra made the module's pass unneeded
    # (egraph/adjoint_report.AdjointReport; dq.jit fills them in when it skips that pass)
    adjoints: list = field(default_factory=list)

    @property
    def predicted(self):
        """The plan's predicted time on this target's machine (calibration/plan_cost.py)."""
        from ..calibration.plan_cost import predict_plan  # loads the plan's step types

        return predict_plan(self.plan, self.target)

    @property
    def kernel_names(self) -> list[str]:
        return [k.name for k in self.plan.kernels]

    def __str__(self) -> str:
        lines = [f"compiled @{self.name} for {self.target}"]
        for adjoint in self.adjoints:
            lines.extend("  " + line for line in adjoint.lines())
        fr = None
        if self.optimize is not None:
            try:
                fr = self.optimize.report[self.name]
            except KeyError:
                fr = None
        if fr is not None:
            sat = fr.saturation
            lines.append(
                f"  e-graph: {fr.e_classes} e-classes"
                + (
                    f", e-nodes {sat.nodes_before} -> {sat.nodes} ({sat.stop_reason})"
                    if sat
                    else ""
                )
            )
            fired = _rules_fired(sat)
            lines.append(f"  rules fired: {fired or 'none'}")
            if fr.user_rules:
                lines.append(
                    "  your rules fired: "
                    + ", ".join(f"{f}:{ln} {r} x{n}" for f, ln, r, n in fr.user_rules)
                )
            lines.append(
                f"  cost (model): {seconds_text(fr.cost_before)} -> {seconds_text(fr.cost_after)}"
                + (" (original kept: " + fr.note + ")" if fr.kept_original else "")
            )
            lines.extend("  " + line for line in fr.attention)  # issue 33: fused or plain
            lines.extend("  " + line for line in fr.layout)  # issue 36: transposes
        if self.note:
            lines.append(f"  note: {self.note}")
        if self.plan.fusion is not None:
            lines.append(f"  {self.plan.fusion}")
        kernels = self.plan.kernels
        lines.append(
            f"  kernels: {len(kernels)}"
            + (" (" + ", ".join(k.name for k in kernels) + ")" if kernels else "")
        )
        blas = self.plan.blas_calls
        lines.append(
            f"  matmuls: {len(blas)}"
            + (
                " ("
                + ", ".join(
                    f"{b.a.text(self.plan.slots)} @ {b.b.text(self.plan.slots)}" for b in blas
                )
                + ")"
                if blas
                else ""
            )
        )
        slots = self.plan.slots
        written = [b for b in blas if getattr(b, "out_view", None) is not None]
        if written:  # codegen/planning/product_layout.py: a permuting copy replaced
            lines.append(
                "  products written in their reader's layout (no copy): "
                + ", ".join(
                    f"{b.a.text(slots)} @ {b.b.text(slots)} -> {slots[b.out].label()}"
                    f" {slots[b.out].shape}"
                    for b in written
                )
            )
        epilogues = self.plan.epilogues
        if epilogues:
            lines.append(
                "  GEMM epilogues: "
                + ", ".join(
                    f"{g.epilogue.name} on {g.blas.a.text(self.plan.slots)} @ {g.blas.b.text(self.plan.slots)}"
                    for g in epilogues
                )
                + " (run on each tile of the product by our GEMM)"
            )
        if self.target == "cpu":  # issue 36: the blocks in use, convolutions' alternatives priced
            from ..calibration.block_prices import block_lines

            lines.extend("  " + line for line in block_lines(self.plan))
        if self.seconds:
            lines.append(
                "  time: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.seconds.items())
            )
        if self.phases:
            lines.append(
                f"  compile time {sum(self.phases.values()) * 1e3:.0f} ms by phase: "
                + ", ".join(
                    f"{p} {self.phases[p] * 1e3:.1f} ms" for p in PHASES if p in self.phases
                )
            )
        lines.append(_time_line(self))
        return "\n".join(lines)


def _time_line(report: CompileReport) -> str:
    """The predicted time of one call, and the measured one next to it when measured."""
    p = report.predicted
    line = f"  predicted time per call: {seconds_text(p.seconds)} ({p.priced_by})"
    m = report.measured
    if m is not None:
        line += f"; measured median {seconds_text(m.median)} over {m.calls} calls (predicted / measured {p.seconds / m.median:.2f})"
    return line


def _rules_fired(sat) -> str:
    from ..egraph.adjoint_report import rules_fired_text

    return rules_fired_text(sat)


def optimized(module: Module, name: str, target: str, rules: Sequence[str | Path] = ()):
    """(module with `name` optimized, OptimizeResult or None, note); cached per IR text, per
    the user's rule files (`rules`, added to the shipped ones) and per machine profile
    (extraction prices e-nodes with it: `dlvm-eq calibrate`)."""
    return _optimized_keyed(module, name, target, rules)[:3]


def rule_files_key(rules: Sequence[str | Path]) -> str:
    """What a compile's cache keys hold of the user's rule files: their contents, in order."""
    if not rules:
        return ""
    from ..egraph.rulefiles import read_rule_file

    h = hashlib.sha256()
    for path in rules:
        h.update(read_rule_file(path)[0].encode() + b"\0")
    return "user rules " + h.hexdigest()


def _optimized_keyed(module: Module, name: str, target: str, rules: Sequence[str | Path] = ()):
    """optimized(...), the key of the module it returns: a digest of the input's key where
    any process would return the same module for it (read from the IR cache, or built with no
    time budget cut short), else None (the caller prints the module to key what it builds),
    and the never-slower guard's plan of that module when this call made one (else None: a
    plan is handed out once, never shared between two compiles)."""
    text = str(module)  # the one print of the input: every key below derives from it
    rules = tuple(rules)
    key = (text, name, target, machine(target).cost_key, rule_files_key(rules))
    with _lock:
        hit = _optimized.get(key)
    if hit is not None:
        return hit
    with phase("optimize"):
        out = _optimize(module, name, target, text, key, rules)
    with _lock:
        if len(_optimized) > 256:
            _optimized.clear()
        _optimized[key] = out[:4] + (None,)
    return out


def _optimize(module: Module, name: str, target: str, text: str, key: tuple, rules: tuple):
    note = ""
    try:
        built = []

        def build():
            from ..egraph import load_bindings  # egglog: only when an e-graph is built

            load_bindings()
            from ..egraph.optimize import optimize

            res = optimize(module, func=name, target=target, rules=list(rules))
            choice, plan = _never_slower(module, res, name, target)
            built.append((res, choice, plan))
            return (
                res.module[name] if choice is None or choice.kept == "optimized" else module[name]
            )

        # a second process compiling the same program reads the optimized function from disk
        parts = [text, name, target, key[3]] + ([key[4]] if rules else [])
        with watching_time_cuts() as cuts:
            fn = cached_function("optimize", parts, build, rules_digest())
        digest = None if cuts else "optimized " + function_key("optimize", parts, rules_digest())
        if built:
            res, choice, plan = built[0]
            if choice is not None and choice.kept == "original":
                out = (module, res, str(choice), digest, plan)
            else:
                out = (res.module, res, str(choice) if choice else note, digest, plan)
        else:
            note = "optimized program read from the compile cache (no e-graph built)"
            result = Module(module.name, module.stage, dict(module.functions))
            result.functions[name] = fn
            out = (result, None, note, digest, None)
    except DlvmError as e:  # the optimizer's limits are not the code generator's: run as written
        from ..egraph.rule_origin import UserRuleError  # on an error only: a warm call loads none

        if isinstance(e, UserRuleError):  # a user's rule made an ill-typed program: theirs to fix
            raise
        note = f"not optimized: {e}"
        out = (module, None, note, None, None)
    return out


def _never_slower(module: Module, res, name: str, target: str):
    """(the never-slower guard's choice (never_slower.py) on the optimizer's result, the plan
    of the program it keeps), or (None, None) where the optimizer kept the function as
    written; its choice is what the IR cache stores, its plan what `lower` uses."""
    from ..egraph.stability import stable_rules_fired
    from .never_slower import plans_compared  # only where the e-graph ran: not warm

    fr = res.report[name]
    if fr.kept_original or res.module[name] is module[name]:
        return None, None
    stable = tuple(stable_rules_fired(fr.saturation.rule_matches)) if fr.saturation else ()
    return plans_compared(module[name], res.module[name], module, target, stable, res.module)


class Compiled:
    """A compiled function: call it like the IR function (numpy arrays in and out on cpu,
    CuPy on gpu). `.plan` shows what was fused, `.report` what compiling did."""

    def __init__(self, program, report: CompileReport):
        self._program = program
        self.report = report
        self.plan = report.plan

    def __call__(self, *args):
        return self._program(*args)

    @property
    def program(self):
        """The CpuProgram or GpuProgram that runs the plan."""
        return self._program

    def __repr__(self):
        return f"<compiled @{self.report.name} for {self.report.target}: {self.plan.summary()}>"


def lower(
    module: Module,
    name: str,
    target: str = "cpu",
    optimize: bool = True,
    rules: Sequence[str | Path] = (),
) -> CompileReport:
    """Every stage of `compile` short of building kernels: declared adjoints resolved, the
    e-graph (unless `optimize=False`; `rules`: the user's rule files, added to the shipped
    ones), the fusion decision and the plan (from the plan cache when there). The report's
    `plan` is what `compile` builds; `dlvm-eq codegen` prints it."""
    if target not in TARGETS:
        raise DlvmError(f"unknown target {target!r} (expected one of {', '.join(TARGETS)})")
    fn = module[name]
    seconds = {}
    note = ""
    result = None
    t0 = time.perf_counter()
    with phase("adjoint"):
        module = resolve_adjoints(module, [fn.name])  # fn, or what it applies, may be declared
    if fn.is_declaration:
        seconds["adjoint"] = time.perf_counter() - t0
    if optimize:
        t0 = time.perf_counter()
        module, result, note, ir_key, built = _optimized_keyed(module, fn.name, target, rules)
        seconds["optimize"] = time.perf_counter() - t0
    else:
        ir_key = built = None
    t0 = time.perf_counter()
    with phase("plan"):
        plan = planned(module, fn.name, target, ir_key, built)
    seconds["plan"] = time.perf_counter() - t0
    return CompileReport(fn.name, target, plan, result, note, seconds)


def compile(
    module: Module,
    name: str,
    target: str = "cpu",
    optimize: bool = True,
    cast: bool = False,
    rules: Sequence[str | Path] = (),
) -> Compiled:
    """A callable running function `name` of `module` as native kernels on `target`.

    Declared adjoints (`[adjoint @f ...]` without a body) are synthesized first; `apply`s are
    inlined. `optimize=False` skips the e-graph (the IR is planned as written). An argument
    of another dtype than declared is a DlvmError unless `cast=True` (never from complex or
    object arrays); Python numbers take the declared dtype where their kind fits
    (codegen/execution/arguments.py). `rules`: the user's rule files, whose rulesets join the
    shipped ones (as `dlvm-eq opt --rules`); the report lists which of their rules fired."""
    if target == "gpu":
        from ..codegen import cupy_module

        cupy_module()  # GpuUnavailable (a DlvmError) says why the GPU cannot be used
    from ..ir.control_flow import has_control_flow

    if target == "cpu":  # issue 36: our GEMM blocked as this host's profile measured fastest
        profile = load_profile("cpu")
        use_gemm_blocks(profile.gemm_blocks if profile is not None else None)
        use_conv_blocks(profile.conv_blocks if profile is not None else None)
        use_scratch(profile.row_scratch if profile is not None else None)  # row values kept
        use_tile_blocks(  # issue 33: the backward's and the forward's tiles
            profile.attention_blocks if profile is not None else None,
            profile.attention_forward_blocks if profile is not None else None,
        )
    # the loop pipeline loads only where some function of the module has control flow
    if any(has_control_flow(f) for f in module.functions.values()):
        from .loops import compile_loops, needs_loops

        if target in TARGETS and needs_loops(module, name):  # each piece and body compiled once
            return compile_loops(module, name, target, cast, optimize, rules)
    with compile_phases() as phases:
        report = lower(module, name, target, optimize, rules)
        with phase("kernels"):
            prog = program(report.plan, target, cast=cast)
    report.seconds["kernels"] = prog.kernel_seconds
    report.phases = phases
    return Compiled(prog, report)


def __getattr__(name):
    if name == "GpuUnavailable":  # the GPU launcher (and its PTX generator) load on demand
        from ..codegen import GpuUnavailable

        return GpuUnavailable
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CompileReport", "Compiled", "compile", "compile_seconds", "lower", "optimized"]
