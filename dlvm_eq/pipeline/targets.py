"""The targets `dq.jit` compiles for: one table, filled here rather than by importing a code
generator for its side effects.

    register_backend("mine", lambda module, name: my_callable)   # callable(*numpy arrays)
    backend("cpu")(module, "f")                                   # what dq.jit calls

"interp" runs the reference interpreter; "cpu" and "gpu" compile through `pipeline.native`
(llvmlite loads only when one of them compiles something).
"""

from __future__ import annotations

import contextlib
import contextvars

from ..errors import DlvmError
from ..ir.control_flow import has_control_flow
from ..ir.interp import interpret
from ..ir.module import Module
from ..ir.ops import CAST, ELEMENTWISE_KINDS, LITERAL, OPS, TUPLE
from .timing import phase

DEFAULT_TARGET = "cpu"  # the llvmlite code generator; "interp" runs the reference interpreter


def _compile_interp(module: Module, name: str):
    def run(*arrays):
        out = interpret(module, name, *arrays)
        # a returned parameter would alias the caller's array; jit outputs are fresh arrays
        if isinstance(out, tuple):
            return tuple(o.copy() if any(o is a for a in arrays) else o for o in out)
        return out.copy() if any(out is a for a in arrays) else out

    return run


def _native(target: str):
    def compile_for_jit(module: Module, name: str, rules=()):
        with phase("import"):  # the code generator loads on the first native compile
            from .native import compile

        # jit traced the function for its arguments' own types (int64 arrays as i32, as JAX
        # does without x64), so the compiled function takes what it was traced for
        return compile(module, name, target, cast=True, rules=rules)

    return compile_for_jit


_NATIVE = {"cpu": _native("cpu"), "gpu": _native("gpu")}
_BACKENDS: dict = {"interp": _compile_interp, **_NATIVE}


_OPTIMIZED_LATER = contextvars.ContextVar("dlvm_eq_optimized_later", default=False)
_TRACED_TARGET = contextvars.ContextVar("dlvm_eq_traced_target", default=DEFAULT_TARGET)
_SATURATED: contextvars.ContextVar[Saturated | None] = contextvars.ContextVar(
    "dlvm_eq_saturated", default=None
)
# ops outside a saturated adjoint that leave the module's own pass skipped: an SGD update
# `p - lr * g` is one fused map whatever the algebra does (the planner fuses it, not the rules)
_TAIL = frozenset(ELEMENTWISE_KINDS + (CAST, LITERAL, TUPLE))
# ...except where the algebra changes what it computes, not only its cost: the ops that the left
# sides of rules/algebra.egg's `stable` ruleset start from (log(sigmoid z), log(1 - sigmoid z),
# 1 - sigmoid z, log(exp s / b)); an update that holds one gets the module's pass, as a user
# expects such forms made stable wherever they are written (tests/test_adjoint_report.py
# checks this set against the rule file)
STABLE_HEADS = frozenset(("log", "sigmoid"))


class Saturated:
    """What a trace for an optimizing target inlined from adjoints whose e-graph already ran
    the whole shipped schedule (adjoint and algebra saturated together once: issue 32).

    >>> with traced_for("cpu") as saturated: module, _ = traced_module(step, args)
    >>> saturated.covers(module, "step")   # True: dq.jit skips the module's second pass
    """

    def __init__(self) -> None:
        self.instructions: dict[int, object] = {}  # id -> Instruction (kept alive: ids stay)
        self.reports: list = []  # what each adjoint's e-graph did (egraph/adjoint_report.py)

    def add(self, instructions, report=None) -> None:
        """Record an adjoint's inlined instructions, and its AdjointReport (for the report)."""
        for inst in instructions:
            self.instructions[id(inst)] = inst
        if report is not None:
            self.reports.append(report)

    def covers(self, module: Module, name: str) -> bool:
        """Whether `name`'s own e-graph pass would re-saturate what was saturated: it holds
        such an adjoint, no loop or branch, and outside it only elementwise ops and tuples
        that no numerically stable form starts from (STABLE_HEADS)."""
        fn = module[name]
        if not self.instructions or has_control_flow(fn):
            return False
        inside = sum(id(i) in self.instructions for i in fn.body)
        return inside > 0 and all(
            id(i) in self.instructions or (OPS[i.op].kind in _TAIL and i.op not in STABLE_HEADS)
            for i in fn.body
        )


def saturated_record() -> Saturated | None:
    """Where this trace records the instructions of adjoints optimized with the whole schedule
    (None: not tracing for a target that optimizes the module)."""
    return _SATURATED.get()


@contextlib.contextmanager
def traced_for(target: str):
    """Within: tracing for `target`; differentiation leaves the algebra to the target's
    compile where it optimizes the whole module (one e-graph of algebra per function).
    Yields the Saturated record of the trace (what the target's pass need not saturate again)."""
    saturated = Saturated()
    token = _OPTIMIZED_LATER.set(optimizes(target))
    # a gradient made while tracing is extracted for the target's costs (issue 33: whether
    # attention runs fused is priced per machine)
    target_token = _TRACED_TARGET.set(target if target in _NATIVE else DEFAULT_TARGET)
    token2 = _SATURATED.set(saturated if optimizes(target) else None)
    try:
        yield saturated
    finally:
        _SATURATED.reset(token2)
        _TRACED_TARGET.reset(target_token)
        _OPTIMIZED_LATER.reset(token)


SECOND_PASS_SKIPPED = (
    "algebra saturated once, with the adjoint (one e-graph); the module's second pass skipped"
)


def compile_for(
    target: str, module: Module, name: str, rules=(), saturated: Saturated | None = None
):
    """What dq.jit calls: the target's compile, with the user's rule files where given (only
    a target that optimizes, cpu or gpu, has rules to add them to). `saturated`: the record
    of a trace whose algebra already ran (Saturated.covers), so the target plans it as traced
    and its report shows the adjoints' e-graphs instead."""
    if saturated is not None and not rules and optimizes(target):
        with phase("import"):
            from .native import compile

        compiled = compile(module, name, target, optimize=False, cast=True)
        compiled.report.note = SECOND_PASS_SKIPPED
        compiled.report.adjoints = list(saturated.reports)
        return compiled
    if not rules:
        return backend(target)(module, name)
    if not optimizes(target):
        raise DlvmError(
            f"jit: rules= needs a target that optimizes the program (cpu, gpu), not {target!r}"
        )
    return backend(target)(module, name, rules=tuple(rules))


def optimizes(target: str) -> bool:
    """Whether compiling for `target` optimizes the module as a whole (the native pipeline,
    not a back end registered in its place)."""
    native = _NATIVE.get(target)
    return native is not None and _BACKENDS.get(target) is native


def traced_target() -> str:
    """The native target (cpu or gpu) the module being traced is compiled for; cpu outside jit
    and for other back ends."""
    return _TRACED_TARGET.get()


def will_be_optimized() -> bool:
    """Whether the module being traced is optimized as a whole after tracing."""
    return _OPTIMIZED_LATER.get()


def register_backend(target: str, compile) -> None:
    """`compile(module, name)` returns a callable taking and returning numpy arrays."""
    _BACKENDS[target] = compile


def backend(target: str):
    """The compile function of `target`; a DlvmError names the known ones."""
    try:
        return _BACKENDS[target]
    except KeyError:
        known = ", ".join(sorted(_BACKENDS))
        raise DlvmError(f"jit: unknown target {target!r} (available: {known})") from None


__all__ = [
    "DEFAULT_TARGET",
    "compile_for",
    "backend",
    "register_backend",
    "traced_for",
    "will_be_optimized",
]
