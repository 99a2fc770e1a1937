"""Loop rewrites that drop or defer work, applied to a function's scans before they are
compiled (pipeline/loops.py) and after the e-graph (egraph/optimize_loops.py):

- dead carries go: a carry whose final value nothing reads and that no other output depends
  on (the step counter of a fori_loop whose body ignores it);
- a carry that only sums a per-step product leaves the loop as one product (ir/loop_sums.py).

    fn2 = apply_loop_rules(fn)     # a new Function; `fn` is not changed

What the e-graph decides is not here: invariant code motion, batching x_t @ W, a cond or
switch on a constant selector, and a scan of one step are rules of rules/loops.egg. Where
those put a body in place of its op, egraph/optimize_loops.py emits it with `inline` and
`one_step` below.
"""

from __future__ import annotations

from .control_flow import SCAN, elements
from .inline import live_instructions
from .loop_sums import defer_sums, summed_carries
from .module import Const, Function, FunctionBuilder, Instruction, Operand, Value
from .types import TupleType

# a carry that only adds a per-step product leaves the loop as one product (ir/loop_sums.py)
DEFER_SUMS = True


def inline(b: FunctionBuilder, fn: Function, args: list, location=None) -> list:
    """Copy `fn`'s body into builder `b` on `args`; the operands of its result, flattened."""
    env: dict[int, object] = {id(p): a for p, a in zip(fn.params, args)}

    def get(o):
        return o if isinstance(o, Const) else env[id(o)]

    producer: dict[int, Instruction] = {}
    for inst in fn.body:
        ops = [get(o) for o in inst.operands]
        out = b.emit(inst.op, ops, location=inst.location or location, **inst.attrs)
        env[id(inst.result)] = out
        producer[id(out)] = inst
    ret = get(fn.ret)
    if not isinstance(fn.result_type, TupleType):
        return [ret]
    made = producer.get(id(ret))
    if made is not None and made.op == "tuple":
        return [get(o) for o in made.operands]
    return [b.emit("extract", [ret], index=i) for i in range(len(fn.result_type.elements))]


def apply_loop_rules(fn: Function) -> Function:
    """`fn` with the loop rewrites applied to its scans (nested ones too)."""
    if not any(i.op == SCAN for i in fn.body):
        return fn
    b = FunctionBuilder(fn.name, fn.param_types, [p.name for p in fn.params])
    env: dict[int, object] = {id(p): q for p, q in zip(fn.params, b.params)}

    def get(o):
        return o if isinstance(o, Const) else env[id(o)]

    used = _used_outputs(fn)
    renumbered: dict[int, dict] = {}  # a scan without its dead carries: old index -> new
    for inst in fn.body:
        ops = [get(o) for o in inst.operands]
        if inst.op == "extract" and id(ops[0]) in renumbered:
            k = renumbered[id(ops[0])][inst.attrs["index"]]
            if isinstance(k, Value):  # a deferred sum's final value, computed after the loop
                env[id(inst.result)] = k
                continue
            single = not isinstance(ops[0].type, TupleType)
            env[id(inst.result)] = (
                ops[0] if single else b.emit("extract", ops, location=inst.location, index=k)
            )
            continue
        if inst.op == SCAN:
            dead = _dead_carries(inst, used.get(id(inst.result)))
            index = {k: k for k in range(len(elements(inst.result.type)))}
            if dead:
                inst, ops, index = _without_carries(inst, ops, dead)
            summed = summed_carries(inst) if DEFER_SUMS else {}
            finish = None
            if summed:  # carries that only sum a product per step (ir/loop_sums.py)
                inst, ops, finish = defer_sums(inst, ops, summed)
            r = env[id(inst.result)] = _scan(b, inst, ops)
            if finish is not None:
                after = finish(b, r)
                index = {old: after[k] for old, k in index.items()}
            if dead or finish is not None:
                renumbered[id(r)] = index
        else:
            env[id(inst.result)] = b.emit(inst.op, ops, location=inst.location, **inst.attrs)
    out = b.finish(get(fn.ret))
    out.body = live_instructions(out.body, [out.ret])
    out.location = fn.location
    return out


def one_step(b: FunctionBuilder, body: Function, attrs: dict, ops: list, location=None) -> list:
    """A scan of one step run as its body once, emitted into builder `b` (egraph/
    optimize_loops.py, where rules/loops.egg's scan-one-step decided it): the body on the
    carries, row 0 of each xs and the withs; each y given its axis of one step. The results."""
    nc, nx = attrs["carries"], attrs["xs"]
    steps = [
        b.emit("shapeCast", [x], location=location, shape=x.type.shape[1:])
        for x in ops[nc : nc + nx]
    ]
    outs = inline(b, body, [*ops[:nc], *steps, *ops[nc + nx :]], location)
    outs = [
        o
        if isinstance(o, Value)
        else b.emit("literal", [], location=location, value=o.value, type=o.type)
        for o in outs
    ]
    ys = [b.emit("shapeCast", [y], location=location, shape=(1, *y.type.shape)) for y in outs[nc:]]
    return outs[:nc] + ys


def _used_outputs(fn: Function) -> dict[int, set | None]:
    """For each scan result of fn: the indices that `extract`s read (None: used whole)."""
    scans = {id(i.result) for i in fn.body if i.op == SCAN}
    used: dict[int, set | None] = {k: set() for k in scans}
    for i in fn.body:
        for o in i.operands:
            seen = used.get(id(o))
            if id(o) in scans and seen is not None:
                if i.op == "extract":
                    seen.add(i.attrs["index"])
                else:
                    used[id(o)] = None
    if id(fn.ret) in scans:
        used[id(fn.ret)] = None
    return used


def _outputs(fn: Function) -> list | None:
    """The operands fn returns, one per result element; None if its result is not spelled out."""
    if not isinstance(fn.result_type, TupleType):
        return [fn.ret]
    made = next((i for i in fn.body if i.result is fn.ret), None)
    return list(made.operands) if made is not None and made.op == "tuple" else None


def _dead_carries(inst: Instruction, used: set | None) -> set[int]:
    """Carries whose final value nothing reads and that no other output depends on (a
    fori_loop's step counter the body ignores): they can be dropped from the loop."""
    nc = inst.attrs["carries"]
    body = inst.attrs["body"]
    outs = _outputs(body)
    if used is None or outs is None or nc == 0:
        return set()
    deps: dict[int, set] = {id(p): {k} for k, p in enumerate(body.params)}
    for i in body.body:
        deps[id(i.result)] = set().union(*(deps.get(id(o), set()) for o in i.operands))
    dead = {k for k in range(nc) if k not in used}
    while True:
        live = set().union(*(deps.get(id(o), set()) for j, o in enumerate(outs) if j not in dead))
        still = {k for k in dead if k not in live}
        if still == dead:
            break
        dead = still
    return dead if len(dead) < len(outs) else set()


def _without_carries(inst: Instruction, ops: list, dead: set[int]):
    """(the scan instruction without the dead carries, its operands, old -> new indices)."""
    a = inst.attrs
    body, nc = a["body"], a["carries"]
    keep = [k for k in range(len(body.params)) if k >= nc or k not in dead]
    outs = _outputs(body)
    assert outs is not None  # _dead_carries found carries to drop, so they are spelled out
    kept_outs = [o for j, o in enumerate(outs) if j >= nc or j not in dead]
    fb = FunctionBuilder(
        body.name, [body.param_types[k] for k in keep], [body.params[k].name for k in keep]
    )
    env: dict[int, Operand] = {id(body.params[k]): q for k, q in zip(keep, fb.params)}
    for i in live_instructions(body.body, [o for o in kept_outs if isinstance(o, Value)]):
        args = [o if isinstance(o, Const) else env[id(o)] for o in i.operands]
        env[id(i.result)] = fb.emit(i.op, args, location=i.location, **i.attrs)
    new_outs = [o if isinstance(o, Const) else env[id(o)] for o in kept_outs]
    new_body = fb.finish(new_outs if len(new_outs) > 1 else new_outs[0])
    index = {j: n for n, j in enumerate(j for j in range(len(outs)) if j >= nc or j not in dead)}
    attrs = dict(a, body=new_body, carries=nc - len(dead))
    operands = [inst.operands[k] for k in keep]
    return (
        Instruction(inst.result, SCAN, operands, attrs, inst.location),
        [ops[k] for k in keep],
        index,
    )


def _scan(b: FunctionBuilder, inst: Instruction, ops: list) -> Value:
    """The scan around its body with the rules applied."""
    body = apply_loop_rules(inst.attrs["body"])
    return b.emit(SCAN, ops, location=inst.location, **dict(inst.attrs, body=body))


__all__ = ["apply_loop_rules", "inline", "one_step"]
