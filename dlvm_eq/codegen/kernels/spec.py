"""Plain-data description of one fused kernel: what the code generators read.

A kernel is a scalar expression DAG evaluated at every element of an output shape. `Load(i)`
reads input i at the current element, honouring broadcasting through per-input element
strides (stride 0 = broadcast dim); an input with `strides=None` has the output's shape and is
C-contiguous, which is the fast path.

    >>> x = Load(0)
    >>> spec = KernelSpec("silu", (4, 8), [KernelInput("f32")], [unary("sigmoid", x * 1.5 + 0.25) * x])
    >>> spec.output_dtypes
    ('f32',)

A `ReduceSpec` folds an elementwise expression over some axes of its iteration shape:

    >>> row_max = ReduceSpec("rowmax", (4, 8), [KernelInput("f32")], Load(0), "max", axes=(1,))
    >>> row_max.out_shape
    (4,)

Op names are short (`neg sub mul div pow eq ne lt ...`); `DLVM_NAMES` maps the IR's spellings.
No dtype promotion happens here: operands of a binary op must agree (insert `Cast`); a Python
number in an expression is an untyped `Const` that takes the dtype of the other operand.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import fields

import numpy as np

from ...errors import DlvmError
from ...ir.ops import BINARY, BIT_OPS, COMPARE, LOGIC, OPS, UNARY
from ...ir.registry.reduction import COMBINATORS
from ...ir.types import DType
from ...records import dataclass


class KernelError(DlvmError):
    """A kernel description that cannot be generated (bad op, dtype, shape or stride)."""


DTYPES = {d.value: d.numpy for d in DType}  # 'f32' -> np.dtype(float32): the IR's dtypes
FLOATS = ("f32", "f64")


def dtype_name(dt) -> str:
    """'f32' for 'f32', the IR's DType.f32, np.float32 or np.dtype('float32')."""
    s = str(dt)
    if s in DTYPES:
        return s
    try:
        npdt = np.dtype(dt)
    except TypeError:
        raise KernelError(f"unknown dtype {dt!r}; expected one of {', '.join(DTYPES)}") from None
    for name, d in DTYPES.items():
        if d == npdt:
            return name
    raise KernelError(
        f"dtype {npdt} is not supported by kernels; expected one of {', '.join(DTYPES)}"
    )


# ------------------------------------------------------------------ op tables (data, one row per op)
# A kernel op is an IR op under the short name its registry row gives (ir/registry/): the IR's
# (DLVM's) names that differ.
DLVM_NAMES = {n: s.kernel for n, s in OPS.items() if s.kernel is not None and s.kernel != n}


def _accepted(dlvm: str) -> tuple[str, ...]:
    if dlvm in BIT_OPS:
        return ("i32",)
    return FLOATS if OPS[dlvm].float_only else FLOATS + ("i32",)


# Unary: name -> dtypes it accepts (the op table's float_only). Result dtype = operand dtype.
UNARY_OPS: dict[str, tuple[str, ...]] = {
    **{DLVM_NAMES.get(n, n): _accepted(n) for n, s in OPS.items() if s.kind == UNARY},
    **{n: ("bool",) for n, s in OPS.items() if s.kind == LOGIC and s.arity == 1},  # not
}
# Binary: name -> (dtypes accepted, result dtype or None for "same as operands"), all from the
# op table's kinds. Kernels compare bools for equality only (the IR accepts any).
BOOL_EQUALITY = ("eq", "ne")


def _compared(dlvm: str) -> tuple[str, ...]:
    return (
        FLOATS + ("i32", "bool")
        if DLVM_NAMES.get(dlvm, dlvm) in BOOL_EQUALITY
        else FLOATS + ("i32",)
    )


BINARY_OPS: dict[str, tuple[tuple[str, ...], str | None]] = {
    **{DLVM_NAMES.get(n, n): (_accepted(n), None) for n, s in OPS.items() if s.kind == BINARY},
    **{DLVM_NAMES.get(n, n): (_compared(n), "bool") for n, s in OPS.items() if s.kind == COMPARE},
    **{n: (("bool",), "bool") for n, s in OPS.items() if s.kind == LOGIC and s.arity == 2},
}
# the registry's reduce combinators (ir/registry/reduction.py) under their kernel names
REDUCE_OPS = tuple(c.kernel for c in COMBINATORS.values())
REDUCE_INIT = {c.kernel: c.identity for c in COMBINATORS.values()}


def op_name(name: str) -> str:
    """The short op name for a short or DLVM name: op_name('multiply') == 'mul'."""
    return DLVM_NAMES.get(name, name)


# ------------------------------------------------------------------ the expression DAG
# Nodes are hash-consed (tinygrad's UOp): building a node equal to a live one returns that one,
# so equality is identity, a node's hash is computed once from its operands' hashes, and every
# walk memoized by node is linear in the DAG however much of it is shared.

_TABLE: weakref.WeakValueDictionary[tuple, Expr] = weakref.WeakValueDictionary()
_TABLE_LOCK = threading.Lock()  # compiles may build kernels on several threads


def _intern_key(cls, values: tuple) -> tuple:
    # a Const's value is keyed by type and repr: 1, 1.0 and True, and 0.0 and -0.0, are
    # distinct constants although they compare equal in Python
    return (cls,) + tuple((type(v), repr(v)) if not isinstance(v, Expr) else v for v in values)


class _Interned(type):
    """Metaclass of expression nodes: `Cls(...)` returns the live node with the same fields."""

    def __call__(cls, *args, **kwargs):
        node = super().__call__(*args, **kwargs)  # the dataclass __init__ fills in defaults
        values = tuple(getattr(node, n) for n in cls._names)
        key = _intern_key(cls, values)
        with _TABLE_LOCK:
            live = _TABLE.get(key)
            if live is not None:
                return live
            object.__setattr__(node, "_hash", hash((cls.__name__,) + key[1:]))
            object.__setattr__(node, "_src", _dtype_source(node))
            _TABLE[key] = node
        return node


def _node(cls):
    """An interned frozen dataclass: equality is identity, the hash is cached."""
    cls = dataclass(frozen=True, eq=False, repr=False)(cls)
    cls._names = tuple(f.name for f in fields(cls))
    return cls


class Expr(metaclass=_Interned):
    """Base of scalar expressions; arithmetic operators build nodes: `Load(0) * 2 + 1`.

    Nodes are interned: `Load(0) + 1 is Load(0) + 1`."""

    _names: tuple[str, ...] = ()

    def __hash__(self):
        return self._hash

    def __reduce__(self):  # pickling and copying rebuild through the interning table
        return type(self), tuple(getattr(self, n) for n in self._names)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __repr__(self):
        return expr_text(self)

    def __add__(self, o):
        return Binary("add", self, as_expr(o))

    def __radd__(self, o):
        return Binary("add", as_expr(o), self)

    def __sub__(self, o):
        return Binary("sub", self, as_expr(o))

    def __rsub__(self, o):
        return Binary("sub", as_expr(o), self)

    def __mul__(self, o):
        return Binary("mul", self, as_expr(o))

    def __rmul__(self, o):
        return Binary("mul", as_expr(o), self)

    def __truediv__(self, o):
        return Binary("div", self, as_expr(o))

    def __rtruediv__(self, o):
        return Binary("div", as_expr(o), self)

    def __pow__(self, o):
        return Binary("pow", self, as_expr(o))

    def __neg__(self):
        return Unary("neg", self)


def expr_text(root: Expr, limit: int = 2000) -> str:
    """`Binary('add', Load(0), Const(1.0))`: the expression as a tree, cut off with '...' after
    about `limit` characters (a shared DAG's tree can be exponentially large). Iterative."""
    out: list[str] = []
    size = 0
    stack: list = [root]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
            size += len(item)
        elif size > limit:
            return "".join(out) + "..."
        else:
            parts: list = [f"{type(item).__name__}("]
            for i, n in enumerate(item._names):
                v = getattr(item, n)
                if i:
                    parts.append(", ")
                parts.append(v if isinstance(v, Expr) else repr(v))
            parts.append(")")
            stack.extend(reversed(parts))
    return "".join(out)


@_node
class Load(Expr):
    """Input `index` at the current element."""

    index: int


@_node
class Const(Expr):
    """A constant; dtype None means 'the dtype of the other operand' (see module docstring)."""

    value: float | int | bool
    dtype: str | None = None


@_node
class Unary(Expr):
    """`op(x)`: a unary elementwise op of a kernel expression."""

    op: str
    x: Expr


@_node
class Binary(Expr):
    """`a op b`: a binary elementwise op of a kernel expression."""

    op: str
    a: Expr
    b: Expr


@_node
class Select(Expr):
    """`a` where `cond` (bool) holds, else `b`."""

    cond: Expr
    a: Expr
    b: Expr


@_node
class Cast(Expr):
    """`x` converted to `dtype` in a kernel expression."""

    x: Expr
    dtype: str


def as_expr(v) -> Expr:
    """A kernel expression from an Expr or a Python/numpy number (a Const)."""
    if isinstance(v, Expr):
        return v
    if isinstance(v, (bool, int, float, np.generic)):
        return Const(v.item() if isinstance(v, np.generic) else v)
    raise KernelError(f"cannot use {v!r} in a kernel expression")


def unary(op: str, x) -> Unary:
    """unary('exp', Load(0)); accepts DLVM names too ('negate')."""
    return Unary(op_name(op), as_expr(x))


def binary(op: str, a, b) -> Binary:
    """binary('max', Load(0), 0.0); accepts DLVM names too ('multiply')."""
    return Binary(op_name(op), as_expr(a), as_expr(b))


# ------------------------------------------------------------------ dtype checking


def _natural_dtype(value) -> str:
    if isinstance(value, bool):
        return "bool"
    return "i32" if isinstance(value, int) else "f64"


def resolve(expr: Expr, input_dtypes: tuple[str, ...], memo: dict | None = None) -> Expr:
    """The same DAG with every Const typed; raises KernelError on an ill-typed op.

    Iterative (an explicit stack of `_resolve_steps` generators): no recursion limit applies
    to deep expressions. A node is resolved once (memo by node; an untyped Const by node and
    the dtype its sibling asks for)."""
    memo = {} if memo is None else memo
    root = _memo_key(expr, None)
    if root in memo:
        return memo[root]
    stack = [(root, _resolve_steps(expr, input_dtypes, None))]
    sent = None
    while stack:
        key, steps = stack[-1]
        try:
            child, want = steps.send(sent)
        except StopIteration as done:
            memo[key] = sent = done.value
            stack.pop()
            continue
        ckey = _memo_key(child, want)
        sent = memo.get(ckey)
        if sent is None:
            stack.append((ckey, _resolve_steps(child, input_dtypes, want)))
    return memo[root]


def _memo_key(e: Expr, want: str | None):
    # only an untyped Const's result depends on the dtype asked for; any other node is
    # resolved once, under the hint of its first use
    return (e, want) if isinstance(e, Const) and e.dtype is None else e


def _untyped(x: Expr) -> bool:
    return isinstance(x, Const) and x.dtype is None


def _resolve_steps(e: Expr, ins: tuple[str, ...], want: str | None):
    """Resolve one node: yields (operand, dtype hint) and is sent the resolved operand."""
    if isinstance(e, Load):
        if not 0 <= e.index < len(ins):
            raise KernelError(f"Load({e.index}): the kernel has {len(ins)} inputs")
        return e
    if isinstance(e, Const):
        dt = dtype_name(e.dtype) if e.dtype is not None else (want or _natural_dtype(e.value))
        value = bool(e.value) if dt == "bool" else int(e.value) if dt == "i32" else float(e.value)
        return Const(value, dt)
    if isinstance(e, Unary):
        if e.op not in UNARY_OPS:
            raise KernelError(f"unknown unary op {e.op!r}")
        x = yield e.x, want
        _check(e.op, dtype_of(x, ins), UNARY_OPS[e.op])
        return Unary(e.op, x)
    if isinstance(e, Binary):
        if e.op not in BINARY_OPS:
            raise KernelError(f"unknown binary op {e.op!r}")
        accepted, result = BINARY_OPS[e.op]
        a, b = yield from _resolve_pair(e.a, e.b, ins, want if result is None else None)
        ta, tb = dtype_of(a, ins), dtype_of(b, ins)
        if ta != tb:
            raise KernelError(
                f"{e.op}: operands have different dtypes {ta} and {tb}; insert a Cast"
            )
        _check(e.op, ta, accepted)
        return Binary(e.op, a, b)
    if isinstance(e, Select):
        c = yield e.cond, "bool"
        if dtype_of(c, ins) != "bool":
            raise KernelError(f"select: the condition must be bool, got {dtype_of(c, ins)}")
        a, b = yield from _resolve_pair(e.a, e.b, ins, want)
        ta, tb = dtype_of(a, ins), dtype_of(b, ins)
        if ta != tb:
            raise KernelError(f"select: branches have different dtypes {ta} and {tb}")
        return Select(c, a, b)
    if isinstance(e, Cast):
        x = yield e.x, None
        return Cast(x, dtype_name(e.dtype))
    raise KernelError(f"not a kernel expression: {e!r}")


def _resolve_pair(a: Expr, b: Expr, ins, hint):
    """Both operands; an untyped constant takes the dtype of the other operand."""
    if _untyped(a) and not _untyped(b):
        b = yield b, hint
        a = yield a, dtype_of(b, ins)
        return a, b
    a = yield a, hint
    b = yield b, dtype_of(a, ins)
    return a, b


def _check(op: str, dt: str, accepted: tuple[str, ...]):
    if dt not in accepted:
        raise KernelError(f"{op}: operand dtype {dt} not supported (accepts {', '.join(accepted)})")


def dtype_of(e: Expr, input_dtypes: tuple[str, ...]) -> str:
    """Dtype of a resolved expression (Consts typed). O(1): each node knows at build time
    which leaf decides its dtype (`_dtype_source`)."""
    src = e._src
    return input_dtypes[src] if type(src) is int else src


def _dtype_source(e: Expr):
    """What decides e's dtype: an input index (a Load's), a dtype name, or None (an untyped
    Const): the leaf that dtype_of's rule (a binary op's left operand, a select's first
    branch, a unary op's operand) reaches, read from the operands' own sources."""
    if isinstance(e, Load):
        return e.index
    if isinstance(e, (Const, Cast)):
        return e.dtype
    if isinstance(e, Binary) and BINARY_OPS.get(e.op, (None, None))[1] is not None:
        return BINARY_OPS[e.op][1]
    return (e.x if isinstance(e, Unary) else e.a)._src


def walk(roots, seen: set | None = None, skip=()) -> list[Expr]:
    """Nodes of the DAG under `roots`, each once, operands before users. Nodes in `seen` (a set
    this walk adds its nodes to: pass one set to several walks to visit each node once in all)
    or in `skip` (only read) are left out, with what is below them unless reached otherwise."""
    order, stack = [], [(r, False) for r in reversed(list(roots))]
    if seen is None:
        seen = set()
    while stack:
        e, done = stack.pop()
        if done:
            order.append(e)
            continue
        if e in seen or e in skip:
            continue
        seen.add(e)
        stack.append((e, True))
        stack.extend((c, False) for c in reversed(children(e)) if c not in seen)
    return order


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, (Unary, Cast)):
        return (e.x,)
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    return ()
