"""Loops and branches that stay loops and branches in the IR, with JAX's names and contracts:

    h, ys = dq.scan(lambda h, x: (dq.tanh(x @ w + h),) * 2, h0, xs)    # one `scan` op
    x = dq.fori_loop(0, 10, lambda i, x: x * 0.5, x)                      # static bounds: a scan
    c = dq.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * 2), (0, h))
    y = dq.cond(p, lambda x: -x, dq.exp, x)
    y = dq.switch(k, [f0, f1, f2], x)

Each body is traced once into a function of the module (ir/control_flow.py). Carries, xs and
operands are pytrees. A body may close over values of the enclosing trace (parameters being
differentiated included): they become trailing `with` operands (closure conversion). A carry
whose type changes, or branches that disagree, raise a ShapeError at trace time naming the
caller's line and both types. Outside a trace the same program is traced and run by the
reference interpreter.
"""

from __future__ import annotations

import math
import re

from ..errors import DlvmError
from ..ir.interp import run_function
from ..ir.module import Function, FunctionBuilder, Value
from ..ir.types import BOOL, I32, TensorType, TupleType
from .context import Trace, current_trace, shape_error, user_location
from .ops import concatenate
from .primitive import lift_value
from .pytree import PyTreeDef, leaf_paths, tree_flatten, tree_map, tree_unflatten
from .tensor import Tensor
from .tracing import function_name, param_names, trace_closure, type_of


def _name(fn) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _where_defined(fn) -> str:
    code = getattr(fn, "__code__", None)
    return f" (defined at {code.co_filename}:{code.co_firstlineno})" if code else ""


def _values(leaves, t: Trace) -> list[Value]:
    return [lift_value(x, t) for x in leaves]


def _results(t: Trace, value: Value, loc) -> list[Value]:
    """The tensors of a control-flow op's result (each element of a tuple extracted)."""
    if not isinstance(value.type, TupleType):
        return [value]
    return [
        t.builder.emit("extract", [value], location=loc, index=i)
        for i in range(len(value.type.elements))
    ]


def _eager(run, *trees):
    """`run(*trees)` traced on the trees' leaves and run by the interpreter (no trace open)."""
    leaves, in_tree = tree_flatten(trees)
    types = [type_of(x) for x in leaves]
    builder = FunctionBuilder("eager", types)
    out_tree: list[PyTreeDef] = []
    with Trace(builder) as t:
        out = run(*tree_unflatten(in_tree, [Tensor(p, t) for p in builder.params]))
        out_leaves, tree = tree_flatten(out)
        out_tree.append(tree)
        fn = builder.finish([lift_value(x, t) for x in out_leaves])
    result = run_function(None, fn, [_array(x, ty) for x, ty in zip(leaves, types)])
    return tree_unflatten(out_tree[0], list(result))


def _array(x, t: TensorType):
    import numpy as np

    return np.asarray(x, dtype=t.dtype.numpy)


def _check_tree(who: str, what: str, want: PyTreeDef, got: PyTreeDef, loc) -> None:
    if want != got:
        raise shape_error(f"{who}: {what} has structure {got}, but it must be {want}", loc)


def _check_types(who, fn, what, tree, want, got, loc) -> None:
    """`got` leaf types must equal `want`; the error names the leaf, both types, and @fn."""
    for path, w, g in zip(leaf_paths(tree, what), want, got):
        if w != g:
            raise shape_error(
                f"{who}: {path} enters {_name(fn)} as {w} but {_name(fn)} returns it as {g}"
                f"{_where_defined(fn)}",
                loc,
            )


# ---------------------------------------------------------------- scan


def scan(f, init, xs=None, length=None, reverse=False, unroll=1, checkpoint=None):
    """`jax.lax.scan`: `f(carry, x) -> (carry, y)` over the leading axis of `xs`; returns
    (final carry, the ys stacked). `length` is needed when `xs` is None; `unroll` is accepted
    for JAX's signature (the body is compiled once either way). `checkpoint="sqrt"`: the
    gradient stores about 2 sqrt(T) carries instead of T (a scan of sqrt(T) segments, each a
    scan of sqrt(T) steps that the backward pass runs again)."""
    if checkpoint not in (None, "sqrt"):
        raise shape_error(f"scan: checkpoint must be None or 'sqrt', got {checkpoint!r}")
    if current_trace() is None:
        return _eager(lambda c, x: scan(f, c, x, length, reverse, unroll, checkpoint), init, xs)
    t, loc = current_trace(), user_location()
    c_leaves, c_tree = tree_flatten(init)
    x_leaves, x_tree = tree_flatten(xs)
    carries, steps = _values(c_leaves, t), _values(x_leaves, t)
    n = _length(length, steps, x_tree, loc)
    if checkpoint == "sqrt" and n >= 4:
        return _segmented(f, init, xs, n, reverse)
    step_types = [v.type.with_shape(v.type.shape[1:]) for v in steps]
    nc = len(carries)
    y_tree: list[PyTreeDef] = []

    def body(*leaves):
        out = f(tree_unflatten(c_tree, leaves[:nc]), tree_unflatten(x_tree, leaves[nc:]))
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise shape_error(
                f"scan: {_name(f)} must return a pair (carry, y), got {type(out).__name__}"
                f"{_where_defined(f)}",
                loc,
            )
        new_leaves, new_tree = tree_flatten(out[0])
        _check_tree("scan", f"the carry {_name(f)} returns", c_tree, new_tree, loc)
        y_leaves, tree = tree_flatten(out[1])
        y_tree.append(tree)
        outs = [*new_leaves, *y_leaves]
        if not outs:
            raise shape_error("scan: nothing to compute (no carry and no y)", loc)
        return outs[0] if len(outs) == 1 else outs

    c_name, x_name = param_names(f, 2)
    names = _ids(c_tree, c_name) + _ids(x_tree, x_name)
    fn, captured = trace_closure(body, [c.type for c in carries] + step_types, _name_of(f), names)
    outs = _elements(fn)
    _check_types("scan", f, "carry", c_tree, [c.type for c in carries], outs[:nc], loc)
    r = t.builder.emit(
        "scan",
        [*carries, *steps, *(c.value for c in captured)],
        location=loc,
        body=fn,
        length=n,
        reverse=bool(reverse),
        carries=nc,
        xs=len(steps),
    )
    results = [Tensor(v, t) for v in _results(t, r, loc)]
    return tree_unflatten(c_tree, results[:nc]), tree_unflatten(y_tree[0], results[nc:])


def _segmented(f, init, xs, n: int, reverse: bool):
    """scan(f) as a scan over k segments of m steps (k m <= n), each an inner scan, then a
    scan over the r = n - k m steps left; the same steps in the same order."""
    m = math.isqrt(n - 1) + 1  # ceil(sqrt(n))
    k, r = n // m, n % m
    seg = (slice(r, n), slice(0, r)) if reverse else (slice(0, k * m), slice(k * m, n))
    whole = lambda x: x if k * m == n else x[seg[0]]
    head = tree_map(lambda x: whole(x).reshape((k, m, *x.shape[1:])), xs)

    def segment(c, x):
        return scan(f, c, x, length=m, reverse=reverse)

    segment.__name__ = f"{_name_of(f)}_segment"
    c, ys = scan(segment, init, head, length=k, reverse=reverse)
    ys = tree_map(lambda y: y.reshape((k * m, *y.shape[2:])), ys)
    if r:
        c, tail_ys = scan(f, c, tree_map(lambda x: x[seg[1]], xs), length=r, reverse=reverse)
        parts = (tail_ys, ys) if reverse else (ys, tail_ys)
        ys = tree_map(lambda a, b: concatenate([a, b], axis=0), *parts)
    return c, ys


def _ids(tree: PyTreeDef, root: str) -> list[str]:
    """IR names for a tree's leaves: `h`, `c.0`, `params.w`."""
    return [re.sub(r"[^A-Za-z0-9_]+", ".", p).strip(".") or root for p in leaf_paths(tree, root)]


def _length(length, steps: list[Value], x_tree, loc) -> int:
    lengths = set()
    for path, v in zip(leaf_paths(x_tree, "xs"), steps):
        if v.tensor_type.rank == 0:
            raise shape_error(f"scan: {path} is a scalar ({v.type}); xs need a leading axis", loc)
        lengths.add(v.tensor_type.shape[0])
    if length is not None:
        length = int(length)
        lengths.add(length)
    if len(lengths) > 1:
        detail = ", ".join(f"{p}: {v.type}" for p, v in zip(leaf_paths(x_tree, "xs"), steps))
        raise shape_error(
            f"scan: the leading axes disagree (length={length}; {detail or 'no xs'})", loc
        )
    if not lengths:
        raise shape_error("scan: give length= when there are no xs", loc)
    n = lengths.pop()
    if n < 0:
        raise shape_error(f"scan: length {n} is negative", loc)
    return n


def _elements(fn: Function) -> list[TensorType]:
    t = fn.result_type
    return list(t.elements) if isinstance(t, TupleType) else [t]


def _name_of(f) -> str:
    name = function_name(f)
    return "body" if name == "lambda" else name


# ---------------------------------------------------------------- fori_loop and while_loop


def fori_loop(lower, upper, body_fun, init_val):
    """`jax.lax.fori_loop`: `body_fun(i, val) -> val` for i in [lower, upper). With Python
    int bounds it is a scan (and differentiates as one); with traced bounds a while loop."""
    if isinstance(lower, Tensor) or isinstance(upper, Tensor):
        carry = (lower, upper, init_val)
        return while_loop(
            lambda c: c[0] < c[1], lambda c: (c[0] + 1, c[1], body_fun(c[0], c[2])), carry
        )[2]
    lower, upper = int(lower), int(upper)

    def step(c, _):
        i, val = c
        return (i + 1, body_fun(i, val)), None

    step.__name__ = _name_of(body_fun)
    start = Tensor(_i32(lower), current_trace()) if current_trace() else _i32(lower)
    return scan(step, (start, init_val), None, length=max(upper - lower, 0))[0][1]


def _i32(v):
    import numpy as np

    t = current_trace()
    if t is None:
        return np.int32(v)
    return t.builder.emit(
        "literal", [], location=user_location(), value=int(v), type=TensorType((), I32)
    )


def while_loop(cond_fun, body_fun, init_val, max_steps=None):
    """`jax.lax.while_loop`: `body_fun` while `cond_fun(val)`. With `max_steps=N` it is a scan
    of N steps whose body runs `body_fun` only while `cond_fun` holds, so that it can be
    differentiated (a plain while loop cannot: its number of steps is not known ahead)."""
    if max_steps is not None:

        def step(c, _):
            return cond(cond_fun(c), body_fun, lambda v: v, c), None

        step.__name__ = _name_of(body_fun)
        return scan(step, init_val, None, length=int(max_steps))[0]
    if current_trace() is None:
        return _eager(lambda v: while_loop(cond_fun, body_fun, v), init_val)
    t, loc = current_trace(), user_location()
    c_leaves, c_tree = tree_flatten(init_val)
    carries = _values(c_leaves, t)
    types = [c.type for c in carries]
    if not carries:
        raise shape_error("while_loop: the loop carries nothing", loc)

    def test(*leaves):
        p = cond_fun(tree_unflatten(c_tree, leaves))
        p_type = type_of(p)
        if p_type != TensorType((), BOOL):
            raise shape_error(
                f"while_loop: {_name(cond_fun)} must return a bool scalar, got {p_type}"
                f"{_where_defined(cond_fun)}",
                loc,
            )
        return p

    def step(*leaves):
        out_leaves, out_tree = tree_flatten(body_fun(tree_unflatten(c_tree, leaves)))
        _check_tree("while_loop", f"the value {_name(body_fun)} returns", c_tree, out_tree, loc)
        return out_leaves[0] if len(out_leaves) == 1 else out_leaves

    fns, withs = _closed(
        [(test, _name_of(cond_fun)), (step, _name_of(body_fun))], types, c_tree, loc
    )
    _check_types("while_loop", body_fun, "carry", c_tree, types, _elements(fns[1]), loc)
    r = t.builder.emit(
        "while",
        [*carries, *withs],
        location=loc,
        cond=fns[0],
        body=fns[1],
        carries=len(carries),
    )
    return tree_unflatten(c_tree, [Tensor(v, t) for v in _results(t, r, loc)])


def _closed(fns, types, tree, loc) -> tuple[list[Function], list[Value]]:
    """Trace each (python function, name) on `types`; every function gets the union of what
    they capture as trailing parameters (one signature for all). (functions, captured values)."""
    traced = [trace_closure(f, types, name) for f, name in fns]
    union: dict[int, Value] = {}
    for _, captured in traced:
        for c in captured:
            union.setdefault(id(c.value), c.value)
    out = []
    for fn, captured in traced:
        own = {id(c.value): p for c, p in zip(captured, fn.params[len(types) :])}
        params = list(fn.params[: len(types)])
        taken = {p.name for p in fn.params} | {i.result.name for i in fn.body}
        for key, v in union.items():
            p = own.get(key)
            if p is None:  # a value only another function reads: an unused parameter here
                name, k = "unused", 0
                while name in taken:
                    k += 1
                    name = f"unused{k}"
                taken.add(name)
                p = Value(name, v.type)
            params.append(p)
        out.append(Function(fn.name, params, fn.result_type, fn.body, fn.ret, location=fn.location))
    return out, list(union.values())


# ---------------------------------------------------------------- cond and switch


def cond(pred, true_fun, false_fun, *operands):
    """`jax.lax.cond`: `true_fun(*operands)` if `pred` else `false_fun(*operands)`; both
    branches are traced and must return the same structure and types."""
    if current_trace() is None:
        return _eager(lambda p, ops: cond(p, true_fun, false_fun, *ops), pred, operands)
    t = current_trace()
    p = lift_value(pred, t)
    if p.type != TensorType((), BOOL):
        if p.type.shape != ():
            raise shape_error(f"cond: the predicate must be a scalar, got {p.type}")
        p = t.builder.emit("notEqual", [p, _zero(p.type)], location=user_location())
    return _branches("cond", p, [true_fun, false_fun], operands)


def switch(index, branches, *operands):
    """`jax.lax.switch`: `branches[index](*operands)`, the index clamped to the branches."""
    if current_trace() is None:
        return _eager(lambda k, ops: switch(k, branches, *ops), index, operands)
    t = current_trace()
    branches = list(branches)
    if not branches:
        raise shape_error("switch: needs at least one branch")
    k = lift_value(index, t)
    if k.type.shape != () or not (k.type.dtype is I32 or k.type.dtype is BOOL):
        raise shape_error(f"switch: the index must be an integer scalar, got {k.type}")
    if k.type.dtype is not I32:
        k = t.builder.emit("dataTypeCast", [k], location=user_location(), dtype=I32)
    return _branches("switch", k, branches, operands)


def _zero(t: TensorType):
    from ..ir.module import Const

    return Const.of(0, t.dtype)


def _branches(op: str, selector: Value, funs, operands):
    t, loc = current_trace(), user_location()
    assert t is not None  # cond and switch come here only inside a trace
    leaves, tree = tree_flatten(tuple(operands))
    args = _values(leaves, t)
    out_trees: list[PyTreeDef] = []

    def branch(f):
        def run(*xs):
            out_leaves, out_tree = tree_flatten(f(*tree_unflatten(tree, xs)))
            out_trees.append(out_tree)
            if not out_leaves:
                raise shape_error(f"{op}: {_name(f)} returns nothing{_where_defined(f)}", loc)
            return out_leaves[0] if len(out_leaves) == 1 else out_leaves

        return run, _name_of(f)

    fns, withs = _closed([branch(f) for f in funs], [a.type for a in args], tree, loc)
    for f, fn, out_tree in zip(funs[1:], fns[1:], out_trees[1:]):
        if out_tree != out_trees[0] or fn.result_type != fns[0].result_type:
            raise shape_error(
                f"{op}: the branches disagree: {_name(funs[0])} returns {out_trees[0]} of "
                f"{fns[0].result_type} but {_name(f)} returns {out_tree} of {fn.result_type}"
                f"{_where_defined(f)}",
                loc,
            )
    try:
        r = t.builder.emit(op, [selector, *args, *withs], location=loc, branches=tuple(fns))
    except DlvmError as e:  # pragma: no cover - the checks above come first
        raise shape_error(str(e), loc) from None
    return tree_unflatten(out_trees[0], [Tensor(v, t) for v in _results(t, r, loc)])
