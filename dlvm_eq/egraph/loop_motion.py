"""How a scan body's straight pieces are tied to the scan (rules/loops.egg's Once/StepOf facts),
and where what the rules lifted out of a body is computed (egraph/optimize_loops.py rebuilds
the function with it).

Every straight piece of a body that one scan of n >= 2 steps runs is tied to that scan, whether
the body is one piece or several (cut by a cond, a switch or a scan inside it): the piece's
parameters that are the body's `with` operands are Once, its per-step inputs StepOf, and
everything else it reads (carries, another piece's results) gets no fact.

    loop = loop_body(scan_inst, body_params, piece, unit_function)   # None: nothing to tie
    session.run_text(loop_facts(loop), "<loop facts>")

A while loop's body is tied the same way, its `with` operands Once (it has no per-step inputs),
priced as WHILE_TRIPS steps; what it lifts is computed before the loop by `before_while`,
unguarded where every op is speculatable, else under a `cond` on the loop's test.

What a body's units lifted (`Hoist`) is computed right before its scan. A hoist that reads only
operands which, in the body around that scan, are `with` operands of the outer scan (the same
at every outer step) is computed before the outer scan instead, and further out while that
holds: the outer body receives it as a new `with` and hands it on (`hoists`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.control_flow import COND, SCAN, WHILE
from ..ir.loop_rules import inline
from ..ir.module import Const, Function, FunctionBuilder, Value
from ..ir.ops import CAST, ELEMENTWISE_KINDS, LAYOUT, LITERAL, OPS, SLICE
from ..ir.types import TensorType
from .lets import egg_string, egg_vec

# A while loop's trip count is not known when it is compiled: what its body computes once is
# priced as if the loop ran this many steps, the fewest at which computing it once pays.
WHILE_TRIPS = 2
# Ops that may run before a while loop that runs zero times (speculation): they cannot fail
# (inf and NaN are values: the interpreter and the kernels run with floating-point errors off,
# ir/op_spec.py `quiet`) and cost at most one pass over values the loop reads. A product, a
# reduction, a gather, a window, attention or a loop is computed before the loop only under
# a `cond` on the loop's test at its initial carries (`before_while`).
SPECULATABLE_KINDS = frozenset((*ELEMENTWISE_KINDS, LAYOUT, CAST, SLICE, LITERAL))


@dataclass
class LoopBody:
    """A straight unit of the body of the one scan that runs it, of n >= 2 steps: its
    parameters tied to the scan's operands by rules/loops.egg's facts (loop_facts)."""

    label: str  # "u3": the unit's parameter prefix, and the Once/StepOf label
    trips: int
    carries: int
    xs: int
    index: dict[str, int]  # an outer leaf's name (`u3.x.all`, `u3.w.out`) -> operand index
    outer: dict[str, TensorType]  # the outer leaves' types


@dataclass
class Hoist:
    """A new parameter of a body, computed before the scan that runs it: `before` applied to
    the scan's operands `sources`; `step`: a per-step row (a new xs), else a new `with`."""

    name: str
    step: bool
    before: Function
    sources: list[int]


def loop_body(inst, body_params: list[Value], piece, fn: Function) -> LoopBody | None:
    """How a straight piece's unit (`fn`, its parameters renamed apart) of a scan or while
    body stands for the loop's operands; None for a scan of fewer than 2 steps (the loop rules
    inline one step) or a piece that reads none of the body's xs or withs."""
    a = inst.attrs
    if inst.op == WHILE:
        n, nc, nx = WHILE_TRIPS, a["carries"], 0
    else:
        n, nc, nx = int(a["length"]), a["carries"], a["xs"]
    if n < 2 or len(piece.inputs) != len(fn.params):
        return None
    at = {id(q): k for k, q in enumerate(body_params)}
    label = fn.params[0].name.split(".", 1)[0] if fn.params else ""
    index: dict[str, int] = {}
    outer: dict[str, TensorType] = {}
    for v, q in zip(piece.inputs, fn.params):
        k = at.get(id(v))
        if k is None or k < nc or not isinstance(q.type, TensorType):
            continue  # a carry or another piece's result: nothing built on it is invariant
        if k < nc + nx:
            name = f"{q.name}.all"
            outer[name] = q.type.with_shape((n, *q.type.shape))
        else:
            name = f"{q.name}.out"
            outer[name] = q.type
        index[name] = k
    return LoopBody(label, n, nc, nx, index, outer) if index else None


def loop_facts(loop: LoopBody) -> str:
    """rules/loops.egg's facts for a scan body's unit: each per-step parameter is a row of its
    whole stacked operand (StepOf), each `with` parameter the outer operand's value (Once)."""
    out = []
    for name, t in loop.outer.items():
        leaf = f"(Var {egg_string(name)})"
        out.append(f"(set (shape {leaf}) {egg_vec(t.shape)})")
        out.append(f"(set (dtype {leaf}) {egg_string(str(t.dtype))})")
        param = egg_string(name.rsplit(".", 1)[0])
        ctor = "StepOf" if name.endswith(".all") else "Once"
        out.append(f"(union (Var {param}) ({ctor} {egg_string(loop.label)} {loop.trips} {leaf}))")
    return "\n".join(out) + "\n"


def hoists(plans: dict, runs: dict, fn: Function) -> list[Hoist]:
    """The new parameters of body `fn` (plans: id(Function) -> its plan; runs: id(body) -> the
    scans running it): what its own units lifted, then what scans inside it lifted from operands
    that are `fn`'s withs, which `fn` receives whole (a new `with`) and hands on."""
    p = plans[id(fn)]
    out = []
    for u in p.units.values():
        if u.optimized is None or u.loop is None:
            continue
        for x in u.lifted:
            before = _reading(x.before)
            out.append(Hoist(x.name, x.step, before, [u.loop.index[q.name] for q in before.params]))
    mine = runs.get(id(fn), [])
    if len(mine) != 1 or mine[0].op != SCAN or int(mine[0].attrs["length"]) < 2:
        return out
    first_with = mine[0].attrs["carries"] + mine[0].attrs["xs"]
    at = {id(q): k for k, q in enumerate(p.params)}
    for piece in p.pieces:
        inst = piece.inst
        if inst is None or inst.op != SCAN or inst.attrs["body"] is None:
            continue
        for x in hoists(plans, runs, inst.attrs["body"]):
            ks = [at.get(id(inst.operands[s]), -1) for s in x.sources]
            if all(k >= first_with for k in ks):  # the same at every step of fn's scan
                out.append(Hoist(x.name, False, x.before, ks))
    return out


def emit_shared(b, fn: Function, args: list, memo: dict, location=None):
    """fn's (a lifted value's straight function) result emitted into builder `b` on `args`,
    an instruction equal to one emitted before through the same `memo` (the same op, operands
    and attributes) read from there: two pieces of a body lifting `w @ v` compute it once."""
    env: dict[int, object] = {id(q): a for q, a in zip(fn.params, args)}

    def get(o):
        return o if isinstance(o, Const) else env[id(o)]

    for inst in fn.body:
        ops = [get(o) for o in inst.operands]
        key = None
        if inst.op != "literal":  # (an array literal's attributes print abridged)
            ids = tuple(
                ("c", repr(o.value), str(o.type)) if isinstance(o, Const) else id(o) for o in ops
            )
            key = (inst.op, ids, repr(sorted(inst.attrs.items())))
        hit = memo.get(key) if key is not None else None
        if hit is None:
            hit = b.emit(inst.op, ops, location=inst.location or location, **inst.attrs)
            if key is not None:
                memo[key] = hit
        env[id(inst.result)] = hit
    return get(fn.ret)


def speculatable(fn: Function) -> bool:
    """Whether fn (a lifted value's function) may run before a loop that runs zero times:
    every op in SPECULATABLE_KINDS (total and at most one pass), nothing else."""
    return all(OPS[i.op].kind in SPECULATABLE_KINDS for i in fn.body)


def before_while(b, lifted: list[Hoist], operands: list, attrs: dict, memo: dict, location=None):
    """A while loop's operands and attributes with what its body lifted (`lifted`, in the
    order of the body's new trailing parameters) computed before it into builder `b`; its
    test (attrs["cond"]) takes the new operands as parameters it does not read. Speculatable
    values are computed unguarded; the rest under one `cond` on the test at the initial
    carries, whose other branch gives zeros the loop never reads (it runs zero times)."""
    made: dict[int, object] = {}
    guarded = [k for k, x in enumerate(lifted) if not speculatable(x.before)]
    for k, x in enumerate(lifted):
        if k not in guarded:
            made[k] = _value(b, emit_shared(b, x.before, _args(x, operands), memo, location))
    if guarded:
        test = inline(b, attrs["cond"], list(operands), location)[0]
        srcs = sorted({s for k in guarded for s in lifted[k].sources})
        types = [operands[s].type for s in srcs]
        names = [f"src{s}" for s in srcs]
        body_name = attrs["body"].name
        run = FunctionBuilder(f"{body_name}.hoisted", types, names)
        skip = FunctionBuilder(f"{body_name}.skipped", types, names)
        at = {s: q for s, q in zip(srcs, run.params)}
        mine: dict = {}
        outs = [
            _value(run, emit_shared(run, lifted[k].before, _args(lifted[k], at), mine))
            for k in guarded
        ]
        zeros = [
            skip.emit("literal", [], value=0, type=lifted[k].before.result_type) for k in guarded
        ]
        one = len(guarded) == 1
        branches = (run.finish(outs[0] if one else outs), skip.finish(zeros[0] if one else zeros))
        r = b.emit(COND, [test, *(operands[s] for s in srcs)], location=location, branches=branches)
        for j, k in enumerate(guarded):
            made[k] = r if one else b.emit("extract", [r], location=location, index=j)
    new = [made[k] for k in range(len(lifted))]
    cond = attrs["cond"]
    extra = [x.before.result_type for x in lifted]
    test_fn = FunctionBuilder(
        cond.name,
        [*cond.param_types, *extra],
        [q.name for q in cond.params] + [x.name for x in lifted],
    )
    (t,) = inline(test_fn, cond, test_fn.params[: len(cond.params)])
    test_fn_done = test_fn.finish(_value(test_fn, t))
    test_fn_done.location = cond.location
    return [*operands, *new], dict(attrs, cond=test_fn_done)


def _args(x: Hoist, operands) -> list:
    return [operands[s] for s in x.sources]


def _value(b, v):
    """v, a constant made a literal instruction (a function or operand needs a value)."""
    return b.emit("literal", [], value=v.value, type=v.type) if isinstance(v, Const) else v


def _reading(fn: Function) -> Function:
    """fn without the parameters it never reads (the unloader gives a lifted value's function
    every outer leaf of its unit; where it moves further out only what it reads matters)."""
    read = {id(o) for i in fn.body for o in i.operands} | {id(fn.ret)}
    params = [q for q in fn.params if id(q) in read]
    if len(params) == len(fn.params):
        return fn
    return Function(fn.name, params, fn.result_type, fn.body, fn.ret)


def row(t) -> TensorType:
    """The type of one row of a stacked tensor type."""
    return t.with_shape(t.shape[1:])
