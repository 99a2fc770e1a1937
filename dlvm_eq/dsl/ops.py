"""The DSL's primitive ops: numpy names mapped onto IR ops. Each works on traced tensors (emits
IR) and on numpy arrays (computes eagerly with the op table's numpy semantics):

    dq.sum(x, axis=(0, -1), keepdims=True)   # reduce %x by add ... along 0, 2; shapeCast
    dq.exp(np.zeros(3, np.float32))          # array([1., 1., 1.], dtype=float32)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..ir.ops import ELEMENTWISE_KINDS, LOGIC, OPS
from ..ir.registry.reduction import COMBINATORS
from ..ir.types import BOOL, F32, I32
from .context import shape_error
from .primitive import bind, check_operand, dtype_of, is_weak, promote, to_dtype
from .tensor import Tensor

# sum, max, min, abs and round below shadow the builtins on purpose: they are the DSL's ops.

# ---------------------------------------------------------------- elementwise

# DSL name -> IR op, from the registry's `dsl` names (ir/registry/); the op says whether it
# needs floats (ints are promoted to f32).
UNARY = {d: n for n, s in OPS.items() if s.arity == 1 and s.kind != LOGIC for d in s.dsl}
BINARY = {
    d: n for n, s in OPS.items() if s.arity == 2 and s.kind in ELEMENTWISE_KINDS for d in s.dsl
}
_TRUE_DIVIDE = {"divide"}  # `/` is true division, as in numpy and JAX: ints give floats


def _unary(name: str, ir_op: str):
    def op(x):
        return bind(ir_op, [x], name=name, float_result=OPS[ir_op].float_only)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Elementwise {name} (IR `{ir_op}`)."
    return op


def _binary(name: str, ir_op: str):
    float_result = OPS[ir_op].float_only or name in _TRUE_DIVIDE

    def op(x, y):
        return bind(ir_op, [x, y], name=name, float_result=float_result)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Elementwise {name} with broadcasting (IR `{ir_op}`)."
    return op


# dq.exp, dq.add, ...: one function per DSL name (`from .ops import exp` in dsl/__init__.py)
ELEMENTWISE = {n: _unary(n, o) for n, o in UNARY.items()}
ELEMENTWISE.update({n: _binary(n, o) for n, o in BINARY.items()})
globals().update(ELEMENTWISE)


class ElementwiseOp(Protocol):
    """The type of dq.exp, dq.add, ...: tensors, arrays or numbers in, a tensor or array out."""

    def __call__(self, *operands: Any) -> Any: ...


if TYPE_CHECKING:
    # the names above, spelled out for a type checker (tests/test_types.py checks that they
    # are ELEMENTWISE's names)
    abs: ElementwiseOp
    add: ElementwiseOp
    ceil: ElementwiseOp
    cos: ElementwiseOp
    cosh: ElementwiseOp
    divide: ElementwiseOp
    equal: ElementwiseOp
    exp: ElementwiseOp
    expm1: ElementwiseOp
    floor: ElementwiseOp
    greater: ElementwiseOp
    greater_equal: ElementwiseOp
    less: ElementwiseOp
    less_equal: ElementwiseOp
    log: ElementwiseOp
    log1p: ElementwiseOp
    logical_and: ElementwiseOp
    logical_or: ElementwiseOp
    maximum: ElementwiseOp
    minimum: ElementwiseOp
    multiply: ElementwiseOp
    negative: ElementwiseOp
    not_equal: ElementwiseOp
    power: ElementwiseOp
    relu: ElementwiseOp
    round: ElementwiseOp
    rsqrt: ElementwiseOp
    sigmoid: ElementwiseOp
    sign: ElementwiseOp
    sin: ElementwiseOp
    sinh: ElementwiseOp
    softplus: ElementwiseOp
    sqrt: ElementwiseOp
    square: ElementwiseOp
    stop_gradient: ElementwiseOp
    subtract: ElementwiseOp
    tan: ElementwiseOp
    tanh: ElementwiseOp


def logical_not(x):
    return bind("not", [x], name="logical_not")


def where(cond, x, y):
    """`select x, y by cond`; a non-bool condition means `cond != 0`."""
    if not is_weak(cond) and dtype_of(cond) is not BOOL:
        cond = ELEMENTWISE["not_equal"](cond, 0)
    return bind("select", [x, y, cond], name="where", promote_only=(0, 1))


def astype(x, dtype):
    dtype = to_dtype(dtype)
    if isinstance(x, Tensor) and x.value.type.dtype is dtype:
        return x
    return bind("dataTypeCast", [x], name="astype", promote_only=(), dtype=dtype)


# ---------------------------------------------------------------- shapes


def shape_of(x) -> tuple[int, ...]:
    if isinstance(x, Tensor):
        return x.shape
    check_operand(x)  # None is not a scalar: np.shape(None) is ()
    return np.shape(x)


def normalize_axes(axis, shape, name: str) -> tuple[int, ...]:
    """None -> all axes of `shape`; int or tuple, negative counted from the end; sorted."""
    ndim = len(shape)
    if axis is None:
        return tuple(range(ndim))
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    out = []
    for a in axes:
        if not isinstance(a, (int, np.integer)) or not -ndim <= a < ndim:
            raise shape_error(f"{name}: axis {a} is out of range for shape {tuple(shape)}")
        out.append(int(a) % ndim)
    if len(set(out)) != len(out):
        raise shape_error(f"{name}: repeated axis in {axis}")
    return tuple(sorted(out))


def _kept_shape(shape, axes):
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def _reduce(x, combinator: str, axis, keepdims: bool, name: str):
    shape = shape_of(x)
    axes = normalize_axes(axis, shape, name)
    if not axes:
        return x
    init = COMBINATORS[combinator].init(promote([x]))  # the registry's identity
    out = bind("reduce", [x], name=name, combinator=combinator, init=init, axes=axes)
    if keepdims:
        out = bind("shapeCast", [out], name=name, shape=_kept_shape(shape, axes))
    return out


def sum(x, axis=None, keepdims=False):
    """Sum over `axis` (None: all; int; tuple; negative from the end). Bools sum as i32."""
    if promote([x]) is BOOL:
        x = astype(x, I32)
    return _reduce(x, "add", axis, keepdims, "sum")


def mean(x, axis=None, keepdims=False):
    """Arithmetic mean over `axis`; integers average in f32."""
    if not promote([x]).is_float:
        x = astype(x, F32)
    shape = shape_of(x)
    count = int(np.prod([shape[a] for a in normalize_axes(axis, shape, "mean")], dtype=np.int64))
    return ELEMENTWISE["divide"](sum(x, axis, keepdims), count)


def max(x, axis=None, keepdims=False):
    """Maximum over `axis` (for the elementwise maximum of two arrays use `maximum`)."""
    return _reduce(x, "max", axis, keepdims, "max")


def min(x, axis=None, keepdims=False):
    """Minimum over `axis` (for the elementwise minimum of two arrays use `minimum`)."""
    return _reduce(x, "min", axis, keepdims, "min")


def transpose(x, axes=None):
    """Reverse the axes, or permute them as `axes` says (negative axes allowed)."""
    if axes is None:
        return bind("transpose", [x], name="transpose")
    ndim = len(shape_of(x))
    perm = tuple(int(a) % ndim if -ndim <= a < ndim else a for a in axes)
    if sorted(perm) != list(range(ndim)):
        raise shape_error(
            f"transpose: axes {tuple(axes)} are not a permutation of the "
            f"{ndim} axes of shape {shape_of(x)}"
        )
    return bind("transpose", [x], name="transpose", perm=perm)


def reshape(x, shape):
    """`shapeCast` to `shape`; one dimension may be -1 (inferred)."""
    old = shape_of(x)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    size = int(np.prod(old, dtype=np.int64))
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise shape_error(f"reshape: invalid target shape {shape} for shape {old}")
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
        if known == 0 or size % known:
            raise shape_error(f"reshape: cannot reshape shape {old} ({size} elements) to {shape}")
        shape = tuple(size // known if d == -1 else d for d in shape)
    return bind("shapeCast", [x], name="reshape", shape=shape)


def concatenate(arrays, axis=0):
    """Join arrays along an existing axis (negative from the end)."""
    arrays = list(arrays)
    if not arrays:
        raise shape_error("concatenate: needs at least one array")
    first = shape_of(arrays[0])
    if not first:
        raise shape_error("concatenate: zero-dimensional arrays cannot be concatenated")
    (axis,) = normalize_axes(axis, first, "concatenate")
    return bind("concatenate", arrays, name="concatenate", axis=axis)
