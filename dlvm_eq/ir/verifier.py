"""The verifier: every instruction's operands are defined before use and its type follows the
op table's rule. Messages name the function, the value and the mismatch."""

from __future__ import annotations

from ..errors import IRError
from .control_flow import CONTROL_FLOW_OPS, bodies, check
from .module import Const, Function, Module, Value
from .ops import OPS


def _where(fn: Function, inst=None) -> str:
    loc = inst.location if inst is not None else fn.location
    prefix = f"{loc[0]}:{loc[1]}:{loc[2]}: " if loc else ""
    return prefix + f"in @{fn.name}"


def verify_function(fn: Function, module: Module | None = None) -> None:
    defined: set[int] = set()
    for p in fn.params:
        defined.add(id(p))
    if fn.is_declaration:
        if fn.adjoint is None:
            raise IRError(f"{_where(fn)}: function has no body")
        return
    for inst in fn.body:
        spec = OPS.get(inst.op)
        if spec is None:
            raise IRError(f"{_where(fn, inst)}: %{inst.result.name}: unknown op {inst.op!r}")
        for o in inst.operands:
            if isinstance(o, Value) and id(o) not in defined:
                raise IRError(
                    f"{_where(fn, inst)}: %{inst.result.name} uses %{o.name} before it is defined"
                )
        if inst.op == "apply" and module is not None:
            callee = module[inst.attrs["callee"]]
            got = [o.type for o in inst.operands]
            if got != callee.param_types:
                raise IRError(
                    f"{_where(fn, inst)}: %{inst.result.name}: @{callee.name} expects "
                    f"({', '.join(map(str, callee.param_types))}), got "
                    f"({', '.join(map(str, got))})"
                )
        try:
            if inst.op in CONTROL_FLOW_OPS:  # messages name the operands and the body
                expected = check_control_flow(inst, module)
            else:
                expected = spec.result_type([o.type for o in inst.operands], inst.attrs)
        except IRError as e:
            raise IRError(f"{_where(fn, inst)}: %{inst.result.name}: {e}") from None
        if expected != inst.result.type:
            raise IRError(
                f"{_where(fn, inst)}: %{inst.result.name} is declared {inst.result.type} "
                f"but {inst.op} gives {expected}"
            )
        if id(inst.result) in defined:
            raise IRError(f"{_where(fn, inst)}: %{inst.result.name} is defined twice")
        defined.add(id(inst.result))
    if isinstance(fn.ret, Value) and id(fn.ret) not in defined:
        raise IRError(f"{_where(fn)}: returns %{fn.ret.name}, which is not defined")
    if fn.ret is None:
        raise IRError(f"{_where(fn)}: has no return")
    if fn.ret.type != fn.result_type:
        raise IRError(
            f"{_where(fn)}: returns {fn.ret.type} but is declared to return {fn.result_type}"
        )
    if isinstance(fn.ret, Const) and fn.ret.type != fn.result_type:
        raise IRError(f"{_where(fn)}: return type mismatch")


def verify(module: Module) -> None:
    for fn in module.functions.values():
        verify_function(fn, module)
        if fn.adjoint is not None and fn.adjoint.of not in module:
            raise IRError(f"{_where(fn)}: adjoint of unknown function @{fn.adjoint.of}")


def check_control_flow(inst, module: Module | None):
    """A control-flow instruction's result type, its operands named; its bodies must be the
    module's functions of their names."""
    labels = [
        f"%{o.name}" if isinstance(o, Value) else f"constant {o.value}" for o in inst.operands
    ]
    if module is not None:
        for body in bodies(inst.attrs):
            if module.functions.get(body.name) is not body:
                raise IRError(f"{inst.op} runs @{body.name}, which is not a function of the module")
    return check(inst.op, [o.type for o in inst.operands], inst.attrs, labels)
