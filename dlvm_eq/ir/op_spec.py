"""What the compiler knows about one op (`OpSpec`), and the shape helpers op modules share.

An `OpSpec` is declared once, in the op's family module under `dlvm_eq/ir/registry/`; every
layer reads it there. Fields hold data and plain functions only: what a higher layer needs from
its own library (sympy, the kernel emitter) it passes in as an argument, so the IR imports none
of them.

    >>> OpSpec("exp", UNARY, 1, "Exp", result_type, evaluate, sympy=lambda sp, x: sp.exp(x))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import Any, NoReturn

import numpy as np

from ..errors import IRError
from ..records import dataclass
from .types import BOOL, DType, TensorType, Type, broadcast_shapes

# Kinds group ops that every stage treats alike.
UNARY, BINARY, COMPARE, LOGIC, SELECT = "unary", "binary", "compare", "logic", "select"
ELEMENTWISE_KINDS = (UNARY, BINARY, COMPARE, LOGIC, SELECT)
REDUCE, DOT, LAYOUT, CAST, LITERAL, TUPLE, CALL = (
    "reduce",
    "dot",
    "layout",
    "cast",
    "literal",
    "tuple",
    "call",
)
# A slice keeps part of its operand: not a LAYOUT view (views keep every element, and code that
# fuses views into reads relies on that); codegen copies it out of a buffer, like concatenate.
SLICE = "slice"
# take and scatterAdd read or write along an axis at integer indices (a plan step of their own:
# compiled index kernels on the CPU, codegen/runtime/index_kernel.py)
GATHER = "gather"
SCAN = "scan"  # cumsum: a plan step of its own (a compiled line scan on the CPU)
# convolution and pooling (window_ops.py): a sliding window over the two trailing axes
WINDOW = "window"
# scan, while, cond, switch (control_flow.py): bodies are functions; never in the e-graph
CONTROL = "control"

# Cost classes of elementwise ops: flops per output element before calibration (the extractor's
# prior, extract/target_cost.py); a calibrated machine measures one representative per class.
COST_FLOPS = {"cheap": 1, "divide": 4, "transcendental": 20, "power": 40}
# Cost classes the cost model prices by formula rather than per element (extract/target_cost.py):
# a view is free but its node (it fuses into its readers), a matmul is priced as a GEMM.
VIEW_COST, MATMUL_COST = "view", "matmul"


# How an attribute is written as an argument of the op's e-graph constructor, and read back
# (OpSpec.egg_attrs): sort -> (the schema's sort, to the term, from the term's primitive)
EGG_SORTS: dict[str, tuple[str, Callable, Callable]] = {
    "i64": ("i64", int, int),
    # 0 and 1 read as bools; any other number stays itself, for the type rule to reject
    "bool": ("i64", int, lambda v: bool(int(v)) if int(v) in (0, 1) else int(v)),
    "f64": ("f64", float, float),
    "String": ("String", str, str),
    "dtype": ("String", str, DType),
    "IVec": ("IVec", lambda v: tuple(int(d) for d in v), lambda v: tuple(int(d) for d in v)),
    # one axis of a one-axis reduction: the IR's axes tuple holds it alone
    "axis": ("i64", lambda axes: int(axes[0]), lambda v: (int(v),)),
}


@dataclass(frozen=True)
class OpSpec:
    """One op. The first fields are the IR's (parser, printer, verifier, interpreter, e-graph);
    the rest are what the layers above read instead of tables of their own:

    - dsl: names the DSL binds to this op (`dq.negative` -> negate); elementwise ops only.
    - kernel: the fused-kernel name (`neg`); scalar(k, *xs): the element formula written with
      the kernel vocabulary `k` that codegen passes in (`lambda k, x: k.math("exp", x)`).
    - sympy(sp, *xs): the element's exact meaning, with sympy passed in (verify/symbolic.py).
    - cost: a COST_FLOPS class for elementwise ops, VIEW_COST or MATMUL_COST for the views and
      products the cost model prices by formula; measured_as: the op a calibration times for
      it (None: not timed).
    - batch(bt, op, args, batched, attrs) -> Value: the vmap rule (ir/batching.py, shared ones in
      registry/batch_rules.py): operands with `batched[i]` carry the batch on axis 0, and so
      does the result.
    - symbolic(sv, args, attrs, rtype): the op on object arrays of sympy expressions, for ops
      whose meaning is not one sympy function per element (products, reductions, gathers);
      `sv` is verify's vocabulary (verify/symbolic.SymbolicVocabulary: sv.sp, sv.extremum,
      sv.number, sv.as_array, sv.indices).
    - egg_attrs: the attributes as the e-graph constructor's arguments after its Term operands,
      (name, sort) in order, a sort of EGG_SORTS: `(("axis", "i64"),)` for take; the loader
      writes them and every reader of terms reads them with `egg_attrs_from` (window ops pack
      theirs in one IVec instead, ir/window_ops.py).
    - infix: (Python operator, precedence) of ops the expression language (egraph/expr.py)
      reads and writes infix: `("+", 1)`, `("@", 2)`, `("**", 4)`.
    - regions: attributes that name body functions (structured control flow); a region op's
      batching rule batches a body with `bt.batch_body(body, batched)` (ir/batching.py).
    """

    name: str  # DLVM spelling, e.g. "add", "shapeCast"
    kind: str  # UNARY, BINARY, ... (see above)
    arity: int | None  # None: variadic
    egg: str  # e-graph constructor in rules/schema.egg
    result_type: Callable[[list[Type], dict], Type]
    evaluate: Callable[..., Any]  # numpy semantics: evaluate(args, attrs) -> array
    attrs: tuple[str, ...] = ()  # attribute names, in printed order
    float_only: bool = False  # operands must be f32/f64
    differentiable: bool = True  # has a derivative (may be zero) in its float operands
    nondiff_operands: tuple[int, ...] = field(default=())  # operands with no adjoint (masks)
    dsl: tuple[str, ...] = ()
    kernel: str | None = None
    scalar: Callable | None = None
    sympy: Callable | None = None
    cost: str | None = None
    measured_as: str | None = None
    batch: Callable | None = None
    regions: tuple[str, ...] = ()
    symbolic: Callable | None = None
    infix: tuple[str, int] | None = None
    egg_attrs: tuple[tuple[str, str], ...] = ()


def egg_attrs_from(spec: OpSpec, prims) -> dict[str, Any]:
    """The IR attributes of an e-node of `spec` from its primitive arguments (in order)."""
    if len(prims) != len(spec.egg_attrs):
        raise ValueError(
            f"({spec.egg} ...) takes {len(spec.egg_attrs)} attribute(s) after its operands, "
            f"got {len(prims)}"
        )
    return {name: EGG_SORTS[sort][2](p) for (name, sort), p in zip(spec.egg_attrs, prims)}


def egg_args_of(spec: OpSpec, attrs: dict) -> tuple:
    """The primitive arguments of `spec`'s constructor for IR attributes `attrs`."""
    return tuple(EGG_SORTS[sort][1](attrs[name]) for name, sort in spec.egg_attrs)


def pascal(name: str) -> str:
    """The e-graph constructor of a DLVM name: shapeCast -> ShapeCast."""
    return name[0].upper() + name[1:]


def fail(op: str, msg: str) -> NoReturn:
    raise IRError(f"{op}: {msg}")


def tensors(op: str, types: list[Type]) -> list[TensorType]:
    for t in types:
        if not isinstance(t, TensorType):
            fail(op, f"expected tensor operands, got tuple {t}")
    return types  # type: ignore[return-value]


def elementwise_type(
    op: str,
    types: list[Type],
    out_dtype: DType | None = None,
    float_only: bool = False,
    bool_only: bool = False,
) -> TensorType:
    ts = tensors(op, types)
    dtypes = {t.dtype for t in ts}
    if len(dtypes) != 1:
        fail(op, "operands have different data types: " + ", ".join(str(t) for t in ts))
    dtype = dtypes.pop()
    if float_only and not dtype.is_float:
        fail(op, f"expected a floating-point operand, got {dtype}")
    if bool_only and dtype is not BOOL:
        fail(op, f"expected bool operands, got {dtype}")
    if not bool_only and not float_only and dtype is BOOL and out_dtype is None:
        fail(op, "arithmetic on bool operands; cast them with dataTypeCast first")
    shape = broadcast_shapes(*(t.shape for t in ts))
    if shape is None:
        fail(op, "shapes do not broadcast: " + ", ".join(str(t) for t in ts))
    return TensorType(shape, out_dtype or dtype)


def quiet(fn):
    """fn with numpy's floating-point warnings off (inf and NaN are values, not errors)."""

    def run(*args):
        with np.errstate(all="ignore"):
            return fn(*args)

    return run
