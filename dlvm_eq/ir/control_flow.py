"""Structured control flow: `scan`, `while`, `cond` and `switch`, whose bodies are functions of
the module (like XLA's While/Conditional and MLIR's scf). Their spelling in `.dl` text:

    %r = scan @step carry (%h0: <4 x f32>) over (%xs: <8 x 3 x f32>) with (%w: <3 x 4 x f32>) length 8 reverse
    %r = while @test do @step carry (%i: i32, %h: <4 x f32>) with (%w: <4 x 4 x f32>)
    %r = cond %p: bool then @yes else @no(%x: <4 x f32>, %w: <4 x f32>)
    %r = switch %k: i32 of @b0, @b1, @b2(%x: <4 x f32>)

- scan: `@step: (carries..., one step of each xs..., withs...) -> (carries..., ys...)`; the
  result is (final carries..., each y stacked on a new axis 0 of size `length`). Each xs is
  read along axis 0 (`length` steps); `reverse` walks the steps from the last. `carry`,
  `over` and `with` groups may be left out when empty; `length` is always written.
- while: `@test: (carries..., withs...) -> bool` and `@step: (carries..., withs...) ->
  (carries...)`; the result is the carries when @test first says false.
- cond: `@yes` when the bool is true, else `@no`; switch: branch `k` clamped to the branches
  (as JAX's switch). Branches take the operands and share one signature.

A tuple (of results, of a body's outputs) is written as a single type when it has one element.
`with` values are what a body reads from outside (closure conversion puts them last).
Instruction attributes hold the body Function objects themselves (printed by name), so a
traced function is whole without a module; `module_with_bodies` puts a function and every
body it reaches into a module.
"""

from __future__ import annotations

import numpy as np

from ..errors import IRError
from .types import BOOL, I32, TensorType, TupleType

SCAN, WHILE, COND, SWITCH = "scan", "while", "cond", "switch"
CONTROL_FLOW_OPS = (SCAN, WHILE, COND, SWITCH)
# the attributes of each op, in the order an OpSpec lists them
ATTRS = {
    SCAN: ("body", "length", "reverse", "carries", "xs"),
    WHILE: ("cond", "body", "carries"),
    COND: ("branches",),
    SWITCH: ("branches",),
}


def elements(t) -> list[TensorType]:
    """The tensors of a result type: a tuple's elements, or the one tensor."""
    return list(t.elements) if isinstance(t, TupleType) else [t]


def joined(types) -> TensorType | TupleType:
    """The result type of several tensors: the one tensor alone, else a tuple."""
    types = list(types)
    return types[0] if len(types) == 1 else TupleType(tuple(types))


def bodies(attrs: dict) -> list:
    """The body Functions an instruction's attributes name, in printed order."""
    out = []
    for key in ("cond", "body"):
        if key in attrs:
            out.append(attrs[key])
    out.extend(attrs.get("branches", ()))
    return out


def _types(ts) -> str:
    return "(" + ", ".join(map(str, ts)) + ")"


def _fail(op: str, msg: str):
    raise IRError(f"{op}: {msg}")


def _match(op: str, fn, what: str, labels, got, want) -> None:
    """`got` (operand types, labelled) must equal `want` (parameter types of @fn)."""
    if len(got) != len(want):
        _fail(
            op,
            f"@{fn.name} takes {len(want)} {what} {_types(want)} but is given "
            f"{len(got)}: {', '.join(f'{n}: {t}' for n, t in zip(labels, got)) or 'none'}",
        )
    for label, g, w, p in zip(labels, got, want, fn.params):
        if g != w:
            _fail(op, f"{label} is {g} but @{fn.name}'s parameter %{p.name} is {w}")


def _tensor(op, label, t):
    if not isinstance(t, TensorType):
        _fail(op, f"{label} has tuple type {t}; only tensors flow through {op}")


def check(op: str, types, attrs: dict, labels=None) -> TensorType | TupleType:
    """The result type of a control-flow op on operand `types`; `labels` name the operands in
    messages (the verifier passes `%name`s)."""
    labels = list(labels or [f"operand {i}" for i in range(len(types))])
    for label, t in zip(labels, types):
        _tensor(op, label, t)
    if op == SCAN:
        return _scan_type(types, attrs, labels)
    if op == WHILE:
        return _while_type(types, attrs, labels)
    return _branch_type(op, types, attrs, labels)


def _scan_type(types, attrs, labels):
    body, n, nc, nx = attrs["body"], attrs["length"], attrs["carries"], attrs["xs"]
    if not isinstance(n, int) or n < 0:
        _fail(SCAN, f"length must be a non-negative integer, got {n!r}")
    if nc + nx > len(types):
        _fail(SCAN, f"{nc} carries and {nx} xs but only {len(types)} operands")
    steps = []
    for label, t in zip(labels[nc : nc + nx], types[nc : nc + nx]):
        if t.rank == 0 or t.shape[0] != n:
            _fail(SCAN, f"{label} is {t}, which does not have {n} steps along axis 0")
        steps.append(t.with_shape(t.shape[1:]))
    want = list(types[:nc]) + steps + list(types[nc + nx :])
    _match(SCAN, body, "parameters (carries, steps, withs)", labels, want, body.param_types)
    outs = elements(body.result_type)
    if len(outs) < nc:
        _fail(SCAN, f"@{body.name} returns {len(outs)} values but the scan has {nc} carries")
    for label, c, o in zip(labels, types[:nc], outs):
        if c != o:
            _fail(SCAN, f"@{body.name} returns the carry {label} as {o} but it enters as {c}")
    ys = [TensorType((n, *y.shape), y.dtype) for y in outs[nc:]]
    return joined(list(types[:nc]) + ys)


def _while_type(types, attrs, labels):
    cond, body, nc = attrs["cond"], attrs["body"], attrs["carries"]
    if not 1 <= nc <= len(types):
        _fail(WHILE, f"needs at least one carry, got {nc} of {len(types)} operands")
    _match(WHILE, cond, "parameters (carries, withs)", labels, list(types), cond.param_types)
    _match(WHILE, body, "parameters (carries, withs)", labels, list(types), body.param_types)
    if cond.result_type != TensorType((), BOOL):
        _fail(WHILE, f"@{cond.name} must return bool, but returns {cond.result_type}")
    outs = elements(body.result_type)
    if outs != list(types[:nc]):
        _fail(
            WHILE,
            f"@{body.name} returns {_types(outs)} but the carries are {_types(types[:nc])}",
        )
    return joined(types[:nc])


def _branch_type(op, types, attrs, labels):
    branches = list(attrs["branches"])
    if not types:
        _fail(op, "needs its predicate or index operand")
    want = TensorType((), BOOL if op == COND else I32)
    if types[0] != want:
        _fail(op, f"{labels[0]} is {types[0]} but must be {want}")
    if op == COND and len(branches) != 2:
        _fail(op, f"takes two branches, got {len(branches)}")
    if not branches:
        _fail(op, "needs at least one branch")
    first = branches[0]
    for b in branches:
        _match(op, b, "parameters", labels[1:], list(types[1:]), b.param_types)
        if b.result_type != first.result_type:
            _fail(
                op,
                f"branches disagree: @{first.name} returns {first.result_type} "
                f"but @{b.name} returns {b.result_type}",
            )
    return first.result_type


def result_type(op: str):
    """The op table's type rule for `op`."""
    return lambda types, attrs: check(op, types, attrs)


def unevaluable(args, attrs):
    raise IRError("control flow runs in the interpreter (ir/interp.py), not as a plain op")


# ---------------------------------------------------------------- printing


def format_control_flow(op: str, operands, attrs: dict, fmt) -> str:
    """The text after `%r = ` (fmt formats one operand)."""

    def group(word, ops):
        return f" {word} ({', '.join(fmt(o) for o in ops)})" if ops else ""

    if op == SCAN:
        nc, nx = attrs["carries"], attrs["xs"]
        text = (
            f"scan @{attrs['body'].name}"
            + group("carry", operands[:nc])
            + group("over", operands[nc : nc + nx])
            + group("with", operands[nc + nx :])
            + f" length {attrs['length']}"
        )
        return text + (" reverse" if attrs["reverse"] else "")
    if op == WHILE:
        nc = attrs["carries"]
        return (
            f"while @{attrs['cond'].name} do @{attrs['body'].name}"
            + group("carry", operands[:nc])
            + group("with", operands[nc:])
        )
    args = ", ".join(fmt(o) for o in operands[1:])
    b = attrs["branches"]
    if op == COND:
        return f"cond {fmt(operands[0])} then @{b[0].name} else @{b[1].name}({args})"
    return f"switch {fmt(operands[0])} of {', '.join('@' + f.name for f in b)}({args})"


# ---------------------------------------------------------------- running (the interpreter)


def evaluate(op: str, vals: list, attrs: dict, run, empty) -> object:
    """Run one control-flow instruction on numpy values. `run(fn, args)` runs a body (a tuple
    for tuple results); `empty(shape, t)` makes the zero-step stack of a y of type t."""
    if op == SCAN:
        return _run_scan(vals, attrs, run, empty)
    if op == WHILE:
        nc = attrs["carries"]
        carries, withs = list(vals[:nc]), list(vals[nc:])
        while bool(run(attrs["cond"], carries + withs)):
            carries = _as_list(run(attrs["body"], carries + withs))
        return _joined_value(carries)
    branches = attrs["branches"]
    if op == COND:
        fn = branches[0] if bool(vals[0]) else branches[1]
    else:  # clamped, as JAX's switch and lax.switch
        fn = branches[int(np.clip(int(vals[0]), 0, len(branches) - 1))]
    return run(fn, list(vals[1:]))


def _run_scan(vals, attrs, run, empty):
    body, n, nc, nx = attrs["body"], attrs["length"], attrs["carries"], attrs["xs"]
    carries, xs, withs = list(vals[:nc]), vals[nc : nc + nx], list(vals[nc + nx :])
    y_types = elements(body.result_type)[nc:]
    ys: list[list] = [[] for _ in y_types]
    for t in reversed(range(n)) if attrs["reverse"] else range(n):
        out = _as_list(run(body, carries + [x[t] for x in xs] + withs))
        carries = out[:nc]
        for acc, y in zip(ys, out[nc:]):
            acc.append(y)
    if attrs["reverse"]:
        for acc in ys:
            acc.reverse()
    stacked = [np.stack(acc) if acc else empty((0, *t.shape), t) for acc, t in zip(ys, y_types)]
    return _joined_value(carries + stacked)


def _as_list(out) -> list:
    return list(out) if isinstance(out, tuple) else [out]


def _joined_value(values: list):
    return values[0] if len(values) == 1 else tuple(values)


# ---------------------------------------------------------------- modules


def has_control_flow(fn) -> bool:
    return any(inst.op in CONTROL_FLOW_OPS for inst in fn.body)


def reaches_control_flow(fn, module=None) -> bool:
    """Whether `fn`, or a function it applies (found in `module`), has control flow."""
    seen: set[str] = set()
    todo = [fn]
    while todo:
        f = todo.pop()
        if f.name in seen or f.is_declaration:
            continue
        seen.add(f.name)
        if has_control_flow(f):
            return True
        if module is not None:
            todo.extend(module[i.attrs["callee"]] for i in f.body if i.op == "apply")
    return False


def reachable_bodies(fn) -> list:
    """Every body Function that `fn` reaches through control-flow ops, callees first."""
    seen: dict[int, object] = {}

    def visit(f):
        for inst in f.body:
            if inst.op in CONTROL_FLOW_OPS:
                for b in bodies(inst.attrs):
                    if id(b) not in seen:
                        visit(b)
                        seen[id(b)] = b

    visit(fn)
    return list(seen.values())


def module_with_bodies(module, fn) -> None:
    """Add `fn` and every body it reaches to `module` (`fn` first, by its own name); a body
    whose name is taken by another function is renamed (`step` -> `step.1`)."""
    module.add(fn)
    for f in reachable_bodies(fn):
        if module.functions.get(f.name) is not f:
            add_renamed(module, f)


def add_renamed(module, fn) -> None:
    """Add `fn` to `module`, renamed `name.1`, `name.2`, ... if its name is taken."""
    base, k = fn.name, 1
    while fn.name in module.functions:
        fn.name = f"{base}.{k}"
        k += 1
    module.functions[fn.name] = fn
