"""Row specs: fused reduce-then-map kernels over rows (softmax-style patterns), as plain data.

A `RowSpec` iterates a (rows, cols) space. Per row it runs its reductions in order (each body
may read the results of the earlier ones), then evaluates its map outputs over the row (which
may read every reduction's result). The CPU builds it with `cpu/rows_ir.py` and runs it with
`runtime/row_kernel.py`; the GPU with `gpu/llvm_ptx.py` and `gpu/gpu_runtime.py`.

    >>> x = Load(0)
    >>> m = Load(1)                  # reduction 0's result (inputs come first)
    >>> s = Load(2)                  # reduction 1's result
    >>> e = unary("exp", x - m)
    >>> spec = RowSpec("softmax", 4096, 4096, [KernelInput("f32")],
    ...                [(x, "max", None), (e, "add", None)], [e / s])

Inputs are 2-D views given by (row stride, col stride) in elements (0 = broadcast); strides
None means C-contiguous (rows, cols). Everything here is immutable.
"""

from __future__ import annotations

import math

from ...records import dataclass
from .kernel_spec import KernelInput
from .spec import (
    REDUCE_INIT,
    REDUCE_OPS,
    Binary,
    Cast,
    Const,
    Expr,
    KernelError,
    Load,
    Select,
    Unary,
    as_expr,
    children,
    dtype_of,
    op_name,
    resolve,
    walk,
)

MAX_STASH = 2  # subexpressions kept per row at most (see cpu/rows_ir.py)


@dataclass(frozen=True)
class RowSpec:
    """A row kernel: per row of `rows` x `cols`, reductions then outputs that may read them (softmax)."""

    name: str
    rows: int
    cols: int
    inputs: tuple[KernelInput, ...]
    reductions: tuple[tuple, ...]  # (body, op, init or None)
    outputs: tuple[Expr, ...]

    def __post_init__(self):
        object.__setattr__(self, "inputs", tuple(self.inputs))
        for i, inp in enumerate(self.inputs):
            if inp.strides is not None and (len(inp.strides) != 2 or min(inp.strides) < 0):
                raise KernelError(
                    f"{self.name}: input {i} needs (row stride, col stride), got {inp.strides}"
                )
        dtypes = list(i.dtype for i in self.inputs)
        reds = []
        for body, op, init in self.reductions:
            op = op_name(op)
            if op not in REDUCE_OPS:
                raise KernelError(f"{self.name}: unknown reduction {op!r}")
            body = resolve(as_expr(body), tuple(dtypes))
            dt = dtype_of(body, tuple(dtypes))
            if dt == "bool":
                raise KernelError(f"{self.name}: cannot reduce bool values")
            reds.append((body, op, _typed(REDUCE_INIT[op] if init is None else init, dt)))
            dtypes.append(dt)
        object.__setattr__(self, "reductions", tuple(reds))
        memo: dict = {}
        outs = tuple(resolve(as_expr(o), tuple(dtypes), memo) for o in self.outputs)
        object.__setattr__(self, "outputs", outs)

    @property
    def input_dtypes(self) -> tuple[str, ...]:
        return tuple(i.dtype for i in self.inputs)

    @property
    def reduction_dtypes(self) -> tuple[str, ...]:
        dts = list(self.input_dtypes)
        for body, _, _ in self.reductions:
            dts.append(dtype_of(body, tuple(dts)))
        return tuple(dts[len(self.inputs) :])

    @property
    def all_dtypes(self) -> tuple[str, ...]:
        return self.input_dtypes + self.reduction_dtypes

    @property
    def output_dtypes(self) -> tuple[str, ...]:
        return tuple(dtype_of(o, self.all_dtypes) for o in self.outputs)

    def strides(self, i: int) -> tuple[int, int]:
        s = self.inputs[i].strides
        return (self.cols, 1) if s is None else s


def _typed(v, dt: str):
    if dt == "i32":
        return int({math.inf: 2**31 - 1, -math.inf: -(2**31)}.get(v, v))
    return float(v)


def reduce_identity(op: str, dt: str):
    return _typed(REDUCE_INIT[op], dt)


def pattern(spec: RowSpec) -> tuple:
    """What the code depends on besides the spec's expressions: strides 0/1 or run-time."""
    cls = lambda s: s if s in (0, 1) else None
    return tuple(
        (cls(spec.strides(i)[0]), cls(spec.strides(i)[1])) for i in range(len(spec.inputs))
    )


def loads(expr: Expr, seen: set | None = None, skip=()) -> list[Load]:
    """The Load nodes of an expression DAG, each once (`seen`, `skip`: as spec.walk's)."""
    return [e for e in walk([expr], seen, skip) if isinstance(e, Load)]


class Rebuilt:
    """Nodes rebuilt so far by `rebuild` calls that share one replacement map (or maps that
    agree where they overlap): the outputs of one kernel share most of their DAG, and each node
    is then rebuilt once for all of them."""

    __slots__ = ("new", "seen")

    def __init__(self):
        self.new: dict = {}  # node -> its rebuilt node
        self.seen: set = set()  # the nodes walked (all in `new`)


def rebuild(expr: Expr, replace: dict, memo: Rebuilt | None = None) -> Expr:
    """`expr` with the nodes in `replace` (usually Loads) replaced by other expressions. memo:
    what earlier calls with the same `replace` rebuilt (see Rebuilt)."""
    if memo is None:
        memo = Rebuilt()
    new = memo.new
    for e in walk([expr], memo.seen):
        if e in replace:
            new[e] = replace[e]
        elif isinstance(e, (Load, Const)):
            new[e] = e
        elif isinstance(e, Unary):
            new[e] = Unary(e.op, new[e.x])
        elif isinstance(e, Binary):
            new[e] = Binary(e.op, new[e.a], new[e.b])
        elif isinstance(e, Select):
            new[e] = Select(new[e.cond], new[e.a], new[e.b])
        else:
            new[e] = Cast(new[e.x], e.dtype)
    return new[expr]


def stash_nodes(spec: RowSpec, body: Expr | None = None, outputs=None) -> list[Expr]:
    """The last reduction's subexpressions that the outputs read again (maximal ones); of
    `body` and `outputs` in place of the spec's last body and outputs when given."""
    if not spec.reductions:
        return []
    last = set(walk([spec.reductions[-1][0] if body is None else body]))
    out, seen, stack = [], set(), list(spec.outputs if outputs is None else outputs)
    while stack:
        e = stack.pop()
        if e in seen:
            continue
        seen.add(e)
        if e in last and not isinstance(e, (Load, Const)):
            out.append(e)
            continue
        stack.extend(children(e))
    return out[:MAX_STASH]


# ops worth a store and a load per element to compute once (polynomials of tens of flops)
COSTLY = frozenset(
    ("exp", "log", "tanh", "sigmoid", "log1p", "expm1", "softplus", "sin", "cos", "tan")
    + ("sinh", "cosh", "erf", "pow")
)


def early_stash(spec: RowSpec) -> tuple[list, list, list]:
    """Values an earlier reduction computes that a later reduction or the outputs compute
    again, kept in a row buffer instead (softmax's gradient with the softmax recomputed: the
    sum of exp(x - max), then the sum of dy * exp(x - max) / s, each computing the exp).
    Returns (bodies, outputs, stash): the reductions' bodies and the outputs with each kept
    value replaced by Load(len(spec.all_dtypes) + q), and stash[q] = (k, value, dtype), k the
    reduction that computes and stores it. Only maximal values holding a COSTLY op are kept,
    MAX_STASH in all (each a 32 KiB stack buffer, as the last reduction's MAX_STASH are)."""
    dtypes = list(spec.all_dtypes)
    bodies = [body for body, _, _ in spec.reductions]
    outputs = list(spec.outputs)
    stash: list = []
    for k in range(len(bodies) - 1):
        mine = set(walk([bodies[k]]))
        found: list = []
        seen: set = set()
        stack = bodies[k + 1 :] + outputs
        while stack and len(found) + len(stash) < MAX_STASH:  # with the last's: 4 at most
            e = stack.pop()
            if e in seen:
                continue
            seen.add(e)
            if e in mine and not isinstance(e, (Load, Const)):
                if any(isinstance(n, Unary) and n.op in COSTLY for n in walk([e])):
                    found.append(e)
                continue
            stack.extend(children(e))
        for e in found:
            q = len(dtypes)
            stash.append((k, e, dtype_of(e, tuple(dtypes))))
            dtypes.append(stash[-1][2])
            keep = {e: Load(q)}
            bodies[k + 1 :] = [rebuild(b, keep) for b in bodies[k + 1 :]]
            outputs = [rebuild(o, keep) for o in outputs]
    return bodies, outputs, stash


__all__ = [
    "COSTLY",
    "MAX_STASH",
    "RowSpec",
    "early_stash",
    "loads",
    "pattern",
    "Rebuilt",
    "rebuild",
    "reduce_identity",
    "stash_nodes",
]
