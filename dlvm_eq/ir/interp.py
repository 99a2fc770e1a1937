"""The reference interpreter: runs any IR function on numpy arrays. It is the oracle that every
other stage is tested against.

    interpret(module, "f", x)                 # in the declared dtypes
    interpret(module, "f", x, float64=True)   # float tensors computed in float64 (oracle)
"""

from __future__ import annotations

import numpy as np

from ..errors import DlvmError
from .control_flow import CONTROL_FLOW_OPS, evaluate
from .declared import require_body
from .module import Const, Function, Module
from .ops import OPS
from .types import DType, TensorType, TupleType


def _coerce(arg, t, float64: bool, fn: Function, i: int):
    if not isinstance(t, TensorType):
        raise DlvmError(f"@{fn.name}: parameter {i} has tuple type {t}, which cannot be passed")
    a = np.asarray(arg)
    if a.shape != t.shape:
        raise DlvmError(
            f"@{fn.name}: argument {i} has shape {a.shape}, expected {t} (shape {t.shape})"
        )
    return a.astype(_dtype(t.dtype, float64), copy=False)


def _dtype(d: DType, float64: bool):
    return np.float64 if (float64 and d.is_float) else d.numpy


def _const(c: Const, float64: bool):
    return np.asarray(c.value, dtype=_dtype(c.type.dtype, float64))


def _resolved(module: Module | None, body: Function) -> Function:
    """A body that is a declared adjoint runs as the module's resolved function of its name."""
    if body.is_declaration and module is not None and body.name in module:
        return module[body.name]
    return body


def run_function(module: Module | None, fn: Function, args, float64: bool = False):
    require_body(fn)  # declared adjoints: resolved by the pipeline (dq.interpret) first
    if len(args) != len(fn.params):
        raise DlvmError(f"@{fn.name} takes {len(fn.params)} arguments, got {len(args)}")
    env: dict[int, object] = {
        id(p): _coerce(a, p.type, float64, fn, i) for i, (p, a) in enumerate(zip(fn.params, args))
    }

    def get(o):
        return _const(o, float64) if isinstance(o, Const) else env[id(o)]

    for inst in fn.body:
        vals = [get(o) for o in inst.operands]
        if inst.op == "apply":
            if module is None:
                raise DlvmError("apply needs the module")
            out = run_function(module, module[inst.attrs["callee"]], vals, float64)
        elif inst.op in CONTROL_FLOW_OPS:
            out = evaluate(
                inst.op,
                vals,
                inst.attrs,
                lambda body, args: run_function(module, _resolved(module, body), args, float64),
                lambda shape, t: np.zeros(shape, _dtype(t.dtype, float64)),
            )
        else:
            attrs = inst.attrs
            if float64 and inst.op in ("literal", "dataTypeCast"):
                t = attrs.get("type") if inst.op == "literal" else None
                if inst.op == "dataTypeCast" and attrs["dtype"].is_float:
                    attrs = dict(attrs, dtype=DType.f64)
                elif t is not None and t.dtype.is_float:
                    attrs = dict(attrs, type=t.with_dtype(DType.f64))
            out = OPS[inst.op].evaluate(vals, attrs)
            if isinstance(inst.result.type, TensorType):
                out = np.asarray(out).astype(_dtype(inst.result.type.dtype, float64), copy=False)
        env[id(inst.result)] = out
    result = get(fn.ret)
    if isinstance(fn.result_type, TupleType):
        return tuple(result)
    return result


def interpret(module: Module, name: str, *arrays, float64: bool = False):
    """Run function `name` of `module` on numpy arrays; returns an array or a tuple of arrays."""
    return run_function(module, module[name], arrays, float64)
