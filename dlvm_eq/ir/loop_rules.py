"""Loop rules, applied to a function's scans before they are compiled (pipeline/loops.py):

- invariant code motion: a body instruction that reads only `with` operands (values the same
  at every step) is computed once before the scan and passed in as a new `with` operand;
- batching: a product `x_t @ W` of a step of `xs` with an invariant W (the input projection
  of an RNN), and elementwise ops on such products and invariants, are computed for all steps
  at once before the scan (T small GEMMs become one GEMM) and passed in as a new `xs`;
- dead carries go: a carry whose final value nothing reads and that no other output depends
  on (the step counter of a fori_loop whose body ignores it);
- `cond`/`switch` on a constant selector is the taken branch, inlined; a scan of one step is
  its body, inlined.

    fn2 = apply_loop_rules(fn)     # a new Function; `fn` is not changed

Rules are plain IR rewrites (the e-graph sees a scan as an opaque op): the same ops on the
same numbers, regrouped (a batched product may round differently in the last bits).
"""

from __future__ import annotations

from .control_flow import COND, SCAN, SWITCH, elements
from .inline import live_instructions
from .loop_sums import defer_sums, summed_carries
from .module import Const, Function, FunctionBuilder, Instruction, Operand, Value
from .ops import CALL, CONTROL, ELEMENTWISE_KINDS, LITERAL, OPS, TUPLE
from .types import TensorType, TupleType

# a carry that only adds a per-step product leaves the loop as one product (ir/loop_sums.py)
DEFER_SUMS = True
# never moved out of a body: constants stay constants, tuples and calls are structure
_STAYS = (LITERAL, TUPLE, CALL, CONTROL)


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


def apply_loop_rules(fn: Function, batch: bool = True) -> Function:
    """`fn` with the loop rules applied to its scans and branches (nested ones too); `batch`:
    also batch per-step products with invariants."""
    if not any(i.op in (SCAN, COND, SWITCH) for i in fn.body):
        return fn
    b = FunctionBuilder(fn.name, fn.param_types, [p.name for p in fn.params])
    env: dict[int, object] = {id(p): q for p, q in zip(fn.params, b.params)}

    def get(o):
        return o if isinstance(o, Const) else env[id(o)]

    scalars: dict[int, float | int | bool] = {}  # id(Value) of a scalar literal -> its value
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
        selector = ops[0].value if ops and isinstance(ops[0], Const) else None
        if ops and selector is None:
            selector = scalars.get(id(ops[0]))
        if inst.op in (COND, SWITCH) and selector is not None:
            k = int(selector) if inst.op == SWITCH else (0 if selector else 1)
            branches = inst.attrs["branches"]
            taken = branches[min(max(k, 0), len(branches) - 1)]
            outs = inline(b, taken, ops[1:], inst.location)
            env[id(inst.result)] = (
                outs[0] if len(outs) == 1 else b.emit("tuple", outs, location=inst.location)
            )
        elif inst.op == SCAN and inst.attrs["length"] == 1:
            env[id(inst.result)] = _one_step(b, inst, ops, batch)
        elif inst.op == SCAN:
            dead = _dead_carries(inst, used.get(id(inst.result)))
            index = {k: k for k in range(len(elements(inst.result.type)))}
            if dead:
                inst, ops, index = _without_carries(inst, ops, dead)
            summed = summed_carries(inst) if DEFER_SUMS else {}
            finish = None
            if summed:  # carries that only sum a product per step (ir/loop_sums.py)
                inst, ops, finish = defer_sums(inst, ops, summed)
            r = env[id(inst.result)] = _scan(b, inst, ops, batch)
            if finish is not None:
                after = finish(b, r)
                index = {old: after[k] for old, k in index.items()}
            if dead or finish is not None:
                renumbered[id(r)] = index
        else:
            env[id(inst.result)] = b.emit(inst.op, ops, location=inst.location, **inst.attrs)
            t = inst.attrs.get("type")
            if inst.op == "literal" and isinstance(t, TensorType) and t.is_scalar:
                scalars[id(env[id(inst.result)])] = inst.attrs["value"]
    out = b.finish(get(fn.ret))
    out.body = live_instructions(out.body, [out.ret])
    out.location = fn.location
    return out


def _one_step(b: FunctionBuilder, inst: Instruction, ops: list, batch: bool):
    """A scan of one step, inlined: the body on xs[0]; each y given its axis of one step."""
    a = inst.attrs
    body, nc, nx = apply_loop_rules(a["body"], batch), a["carries"], a["xs"]
    loc = inst.location
    steps = [
        b.emit("shapeCast", [x], location=loc, shape=x.type.shape[1:]) for x in ops[nc : nc + nx]
    ]
    outs = inline(b, body, [*ops[:nc], *steps, *ops[nc + nx :]], loc)
    outs = [
        o
        if isinstance(o, Value)
        else b.emit("literal", [], location=loc, value=o.value, type=o.type)
        for o in outs
    ]
    ys = [b.emit("shapeCast", [y], location=loc, shape=(1, *y.type.shape)) for y in outs[nc:]]
    results = outs[:nc] + ys
    return results[0] if len(results) == 1 else b.emit("tuple", results, location=loc)


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


def _scan(b: FunctionBuilder, inst: Instruction, ops: list, batch: bool) -> Value:
    a = inst.attrs
    body, n, nc, nx = apply_loop_rules(a["body"], batch), a["length"], a["carries"], a["xs"]
    params = body.params
    withs = {id(p) for p in params[nc + nx :]}
    steps = {id(p) for p in params[nc : nc + nx]}
    hoisted: dict[int, Value] = {}  # body value -> its value outside (computed once)
    batched: dict[int, Value] = {}  # body value -> all steps' values stacked, outside
    outer = {id(p): o for p, o in zip(params, ops)}
    loc = inst.location
    for i in body.body:
        vals = [o for o in i.operands if isinstance(o, Value)]
        if OPS[i.op].kind in _STAYS:
            continue
        if vals and all(id(v) in withs or id(v) in hoisted for v in vals):
            hoisted[id(i.result)] = b.emit(
                i.op, [_outside(o, outer, hoisted) for o in i.operands], location=loc, **i.attrs
            )
        elif batch and n > 0:
            stacked = _batch(b, i, n, steps, withs, outer, hoisted, batched, loc)
            if stacked is not None:
                batched[id(i.result)] = stacked
    if not hoisted and not batched:
        return b.emit(SCAN, ops, location=loc, **dict(a, body=body))
    # the body reads the moved values as new parameters: batched ones as xs, hoisted as withs
    moved = set(hoisted) | set(batched)
    new_x = [i for i in body.body if id(i.result) in batched and _used(body, i.result, moved)]
    new_w = [i for i in body.body if id(i.result) in hoisted and _used(body, i.result, moved)]
    types = (
        body.param_types[: nc + nx]
        + [i.result.type for i in new_x]
        + body.param_types[nc + nx :]
        + [i.result.type for i in new_w]
    )
    names = [p.name for p in params]
    fb = FunctionBuilder(
        body.name,
        types,
        names[: nc + nx]
        + [f"{i.result.name}.t" for i in new_x]
        + names[nc + nx :]
        + [f"{i.result.name}.once" for i in new_w],
    )
    fp = fb.params
    env: dict[int, Operand] = {id(p): q for p, q in zip(params[: nc + nx], fp)}
    env.update({id(i.result): q for i, q in zip(new_x, fp[nc + nx :])})
    k = nc + nx + len(new_x)
    env.update({id(p): q for p, q in zip(params[nc + nx :], fp[k:])})
    env.update({id(i.result): q for i, q in zip(new_w, fp[k + len(params) - nc - nx :])})
    for i in body.body:
        if id(i.result) in env or id(i.result) in moved:
            continue  # a parameter now, or dead in the body (only moved values read it)
        ops_ = [o if isinstance(o, Const) else env[id(o)] for o in i.operands]
        env[id(i.result)] = fb.emit(i.op, ops_, location=i.location, **i.attrs)
    ret = body.ret if isinstance(body.ret, Const) else env[id(body.ret)]
    new_body = fb.finish(ret)
    new_body.body = live_instructions(new_body.body, [new_body.ret])
    operands = (
        ops[: nc + nx]
        + [batched[id(i.result)] for i in new_x]
        + ops[nc + nx :]
        + [hoisted[id(i.result)] for i in new_w]
    )
    return b.emit(SCAN, operands, location=loc, **dict(a, body=new_body, xs=nx + len(new_x)))


def _outside(o, outer, hoisted):
    if isinstance(o, Const):
        return o
    return hoisted.get(id(o)) or outer[id(o)]


def _used(body: Function, v: Value, moved: set) -> bool:
    """Whether the body, once the moved instructions are gone, still reads `v`."""
    if body.ret is v:
        return True
    return any(v is o for i in body.body if id(i.result) not in moved for o in i.operands)


def _batch(b, i, n, steps, withs, outer, hoisted, batched, loc) -> Value | None:
    """All steps' values of body instruction `i`, stacked on a new axis 0, computed outside;
    None when `i` reads the carries or cannot be batched."""
    rank = i.result.type.rank if isinstance(i.result.type, TensorType) else -1
    if i.op == "dot":
        x, w = i.operands
        if not (isinstance(x, Value) and isinstance(w, Value)):
            return None
        xs = _stacked(x, steps, outer, batched)
        if xs is None or w.tensor_type.rank != 2 or x.tensor_type.rank not in (1, 2):
            return None
        if not (id(w) in withs or id(w) in hoisted):
            return None
        wv = _outside(w, outer, hoisted)
        if x.tensor_type.rank == 1:  # (T, D) @ (D, H)
            return b.emit("dot", [xs, wv], location=loc)
        rows, d = x.tensor_type.shape
        flat = b.emit("shapeCast", [xs], location=loc, shape=(n * rows, d))
        out = b.emit("dot", [flat, wv], location=loc)
        return b.emit("shapeCast", [out], location=loc, shape=(n, rows, w.tensor_type.shape[1]))
    if OPS[i.op].kind not in ELEMENTWISE_KINDS or rank < 0:
        return None
    operands, any_step = [], False
    for o in i.operands:
        if isinstance(o, Const):
            operands.append(o)
            continue
        s = _stacked(o, steps, outer, batched)
        if s is not None:
            if o.type.rank != rank:  # a lower-rank step value would broadcast differently
                return None
            operands.append(s)
            any_step = True
        elif (id(o) in withs or id(o) in hoisted) and o.type.rank <= rank:
            operands.append(_outside(o, outer, hoisted))
        else:
            return None
    if not any_step:
        return None
    return b.emit(i.op, operands, location=loc, **i.attrs)


def _stacked(v: Value, steps, outer, batched):
    if id(v) in batched:
        return batched[id(v)]
    if id(v) in steps:
        return outer[id(v)]
    return None


__all__ = ["apply_loop_rules", "inline"]
