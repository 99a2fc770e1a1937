"""Tracing a Python function into an IR `Function`, and inlining a `Function` into a trace.

f_ir = trace(lambda x: dq.exp(x) * 2.0, [spec((3,), "f32")])
# func @lambda: (<3 x f32>) -> <3 x f32> { %0 = exp %x ...; %1 = multiply %0, 2.0: f32 }

def g(x):                       # inside another trace: reuse f_ir (e.g. an adjoint program)
    return call_function(f_ir, x) + 1.0
"""

from __future__ import annotations

import inspect
import re

import numpy as np

from ..errors import DlvmError
from ..ir.inline import live_instructions
from ..ir.module import Const, Function, FunctionBuilder, Module, Value
from ..ir.types import DType, TensorType, TupleType
from ..records import dataclass
from .context import Trace, current_trace, tracing_error, user_location
from .primitive import is_weak, lift_value, own_value, promote, to_dtype
from .tensor import Tensor


@dataclass(frozen=True)
class ShapeDtypeStruct:
    """An example argument by shape and dtype alone, like `jax.ShapeDtypeStruct`."""

    shape: tuple[int, ...]
    dtype: DType

    @property
    def type(self) -> TensorType:
        return TensorType(self.shape, self.dtype)


def spec(shape, dtype="f32") -> ShapeDtypeStruct:
    """`dq.spec((2, 3), "f32")`: a stand-in for an argument of that shape and dtype."""
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    return ShapeDtypeStruct(shape, to_dtype(dtype))


def type_of(x) -> TensorType:
    """The IR type an example argument traces as: f64 arrays -> f64, ints -> i32, bools -> bool;
    Python floats -> f32 scalars; specs, TensorTypes and Tensors as they say."""
    if isinstance(x, Tensor):
        return x.value.tensor_type
    if isinstance(x, TensorType):
        return x
    if isinstance(x, ShapeDtypeStruct):
        return x.type
    if is_weak(x):
        return TensorType((), promote([x]))
    if hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, np.ndarray):
        return TensorType(tuple(x.shape), to_dtype(x.dtype))  # jax/cupy arrays, other specs
    a = np.asarray(x)
    try:
        return TensorType(a.shape, DType.from_numpy(a.dtype))
    except ValueError:
        raise DlvmError(f"cannot trace an argument of dtype {a.dtype} ({x!r:.60})") from None


def function_name(fn) -> str:
    """An IR identifier for a Python callable: its __name__, lambdas as "lambda"."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    name = "lambda" if name == "<lambda>" else re.sub(r"\W", "_", name)
    return name if name and not name[0].isdigit() else "f_" + name


def param_names(fn, count: int) -> list[str]:
    """Parameter names from the Python signature; extra (*args) ones numbered."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names: list[str] = []
    var = None
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind == p.VAR_POSITIONAL:
            var = p.name
            break
    names = names[:count]
    base = var or "arg"
    names += [f"{base}{i}" for i in range(count - len(names))]
    return names


def trace(fn, arg_types, name: str | None = None, names: list[str] | None = None) -> Function:
    """Run `fn` once on symbolic tensors of `arg_types` (anything `type_of` takes); the IR
    Function it built. A returned tuple or list becomes a tuple result."""
    function, captured = _trace(fn, arg_types, name, names, allow_captures=False)
    return function


def trace_closure(fn, arg_types, name: str | None = None, names: list[str] | None = None):
    """Like `trace`, but values of enclosing traces that `fn` closes over become extra trailing
    parameters: returns (Function, captured Tensors of the enclosing trace). Pass the captured
    tensors after the arguments to `call_function`."""
    return _trace(fn, arg_types, name, names, allow_captures=True)


def _trace(fn, arg_types, name, names, allow_captures):
    types = [type_of(t) for t in arg_types]
    name = name or function_name(fn)
    builder = FunctionBuilder(name, types, names or param_names(fn, len(types)))
    with Trace(builder, allow_captures) as t:
        out = fn(*(Tensor(p, t) for p in list(builder.params)))
        if isinstance(out, (tuple, list)):
            ret = [_result_value(o, t) for o in out]
        else:
            ret = _result_value(out, t)
        function = builder.finish(ret)
    # values the result does not depend on (a loss whose gradient alone is returned) are dropped
    function.body = live_instructions(function.body, [function.ret])
    code = getattr(fn, "__code__", None)
    if code is not None:
        function.location = (code.co_filename, code.co_firstlineno, 1)
    return function, t.captured


def _result_value(x, t: Trace) -> Value:
    if isinstance(x, (tuple, list)):
        raise tracing_error(
            "nested tuples cannot be returned from a traced function; return a flat tuple of arrays"
        )
    if x is None:
        raise tracing_error("the traced function returned None; return an array or a tuple")
    return lift_value(x, t)


def call_function(fn: Function, *args, module: Module | None = None):
    """Inline IR function `fn` into the current trace on `args` (Tensors, arrays or scalars);
    returns a Tensor, or a tuple of Tensors for a tuple result. `apply`s in `fn` are inlined
    from `module`. Outside a trace, runs `fn` with the reference interpreter."""
    if len(args) != len(fn.params):
        raise DlvmError(f"@{fn.name} takes {len(fn.params)} arguments, got {len(args)}")
    t = current_trace()
    if t is None or not any(isinstance(a, Tensor) for a in args):
        from ..ir.interp import run_function

        return run_function(module, fn, [_concrete_arg(a, p.type) for a, p in zip(args, fn.params)])
    if fn.is_declaration:
        raise DlvmError(f"@{fn.name} has no body to inline (synthesize the adjoint first)")
    env: dict[int, object] = {}
    for i, (a, p) in enumerate(zip(args, fn.params)):
        env[id(p)] = _param_value(a, p, fn, i, t)
    for inst in fn.body:
        ops = [_get(env, o) for o in inst.operands]
        if inst.op == "tuple":
            env[id(inst.result)] = tuple(ops)
        elif inst.op == "extract" and isinstance(ops[0], tuple):
            env[id(inst.result)] = ops[0][inst.attrs["index"]]
        elif inst.op == "apply":
            if module is None:
                raise DlvmError(f"@{fn.name} applies @{inst.attrs['callee']}: pass module=")
            out = call_function(
                module[inst.attrs["callee"]], *(_wrap(o, t) for o in ops), module=module
            )
            env[id(inst.result)] = _unwrap(out)
        else:
            env[id(inst.result)] = t.builder.emit(
                inst.op, ops, location=inst.location or user_location(), **inst.attrs
            )
    return _wrap(_get(env, fn.ret), t)


def _get(env, o):
    return o if isinstance(o, Const) else env[id(o)]


def _wrap(x, t):
    if isinstance(x, tuple):
        return tuple(_wrap(e, t) for e in x)
    if isinstance(x, Const):
        x = t.builder.emit("literal", [], location=user_location(), value=x.value, type=x.type)
    return Tensor(x, t)


def _unwrap(x):
    return tuple(_unwrap(e) for e in x) if isinstance(x, tuple) else x.value


def _param_value(a, p: Value, fn: Function, i: int, t: Trace):
    if isinstance(a, Tensor):
        v = own_value(a, t)
    elif is_weak(a) and p.tensor_type.shape == ():
        return Const.of(a, p.tensor_type.dtype)
    else:
        v = lift_value(np.asarray(a).astype(p.tensor_type.dtype.numpy), t)
    if v.type != p.type:
        raise tracing_error(
            f"@{fn.name}: argument {i} has type {v.type}, parameter %{p.name} expects {p.type}"
        )
    return v


def _concrete_arg(a, t):
    if isinstance(t, TupleType):
        raise DlvmError(f"cannot pass a tuple parameter {t}")
    return np.asarray(a, dtype=t.dtype.numpy)
