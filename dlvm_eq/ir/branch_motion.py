"""Values that every branch of a `cond` or `switch` computes from the same operands move
before it (egraph/optimize_loops.py runs this after the e-graph, on the function and on every
body it reaches).

    f2 = hoist_branch_common(f)      # a new Function where something moved; else f itself

A branch's values are all functions of its parameters, which are the op's operands. Two
branches compute the same value where the same op reads the same operand positions (or the
same constants, or values that are the same) with the same attributes: such a value is
computed whichever branch runs, so computing it once before the op does the same work, and
it is safe for any op that is not control flow. A value only some branches compute never
moves (it is not paid on the other path). The branches receive the moved values they still
read as new trailing parameters.

Why not an e-graph rule: each branch is loaded as a unit of its own with its parameters
renamed apart (egraph/optimize_loops.py), so a value two branches share is two e-classes; the
match is structural, here, on the extracted branches.
"""

from __future__ import annotations

from .control_flow import COND, CONTROL_FLOW_OPS, SWITCH, bodies
from .inline import live_instructions
from .module import Const, Function, FunctionBuilder, Instruction, Operand

Key = tuple


def hoist_branch_common(fn: Function, done: dict | None = None) -> Function:
    """fn with every cond/switch's common branch values computed before it, in fn and in
    the bodies it runs (each body once: `done` maps id(old) -> new)."""
    done = {} if done is None else done
    hit = done.get(id(fn))
    if hit is not None:
        return hit
    done[id(fn)] = fn  # (a body reached twice is rebuilt once)
    if not any(i.op in CONTROL_FLOW_OPS for i in fn.body):
        return fn
    b = FunctionBuilder(fn.name, fn.param_types, [q.name for q in fn.params])
    env: dict[int, Operand] = {id(q): v for q, v in zip(fn.params, b.params)}

    def get(o):
        return o if isinstance(o, Const) else env[id(o)]

    changed = False
    for inst in fn.body:
        ops = [get(o) for o in inst.operands]
        attrs = dict(inst.attrs)
        for key in ("cond", "body"):
            if key in attrs:
                attrs[key] = hoist_branch_common(attrs[key], done)
        if "branches" in attrs:
            attrs["branches"] = tuple(hoist_branch_common(f, done) for f in attrs["branches"])
        if inst.op in (COND, SWITCH):
            moved = _moved(list(attrs["branches"]))
            if moved:
                ops, attrs = _before_branches(b, moved, ops, attrs, inst)
        changed = changed or any(_new(a, inst.attrs.get(k)) for k, a in attrs.items())
        env[id(inst.result)] = b.emit(inst.op, ops, location=inst.location, **attrs)
    if not changed:
        return fn
    out = b.finish(get(fn.ret))
    out.location, out.adjoint = fn.location, fn.adjoint
    done[id(fn)] = out
    return out


def _new(a, old) -> bool:
    """Whether attribute `a` is not `old` (a branch tuple: element by element)."""
    if isinstance(a, tuple) and isinstance(old, tuple):
        return len(a) != len(old) or any(x is not y for x, y in zip(a, old))
    return a is not old


def _keys(fn: Function) -> dict[int, Key]:
    """id(value) -> its structural key in fn: parameter k is ("p", k); an instruction is its
    op, its operands' keys and its attributes. Control-flow instructions get no key."""
    keys: dict[int, Key] = {id(q): ("p", k) for k, q in enumerate(fn.params)}

    def key(o) -> Key | None:
        if isinstance(o, Const):
            return ("c", repr(o.value), str(o.type))
        return keys.get(id(o))

    for inst in fn.body:
        if inst.op in CONTROL_FLOW_OPS or bodies(inst.attrs) or inst.op == "tuple":
            continue
        ks = [key(o) for o in inst.operands]
        if any(k is None for k in ks):
            continue
        keys[id(inst.result)] = (inst.op, tuple(ks), repr(sorted(inst.attrs.items())))
    return keys


def _moved(branches: list[Function]) -> list[tuple[Key, Instruction]]:
    """The values every branch computes that some branch still reads after the move (an
    instruction that is not itself moved, or a branch's result), in the first branch's
    order, each with its instruction in the first branch."""
    if len(branches) < 2:
        return []
    all_keys = [_keys(f) for f in branches]
    common = set(k for k in all_keys[0].values() if k[0] != "p")
    for ks in all_keys[1:]:
        common &= set(ks.values())
    if not common:
        return []
    needed: set[Key] = set()
    for f, ks in zip(branches, all_keys):
        for inst in f.body:
            if ks.get(id(inst.result)) in common:
                continue
            needed.update(ks[id(o)] for o in inst.operands if ks.get(id(o)) in common)
        needed.update(ks[id(o)] for o in _results(f) if ks.get(id(o)) in common)
    first = all_keys[0]
    out, seen = [], set()
    for inst in branches[0].body:
        k = first.get(id(inst.result))
        if k in needed and k not in seen:
            seen.add(k)
            out.append((k, inst))
    return out


def _results(f: Function) -> list:
    made = next((i for i in f.body if i.result is f.ret), None)
    return list(made.operands) if made is not None and made.op == "tuple" else [f.ret]


def _before_branches(b: FunctionBuilder, moved, ops: list, attrs: dict, inst: Instruction):
    """The op's operands and attributes with the moved values computed before it into `b`
    (from the first branch, on the op's own operands) and handed to each branch as new
    trailing parameters."""
    first = attrs["branches"][0]
    wanted = {id(i.result) for _, i in moved}
    # the first branch's instructions the moved values need, emitted on the op's operands
    env: dict[int, Operand] = {id(q): o for q, o in zip(first.params, ops[1:])}
    keys = _keys(first)
    need = {k for k, _ in moved}
    made: dict[Key, Operand] = {}
    for i in first.body:
        k = keys.get(id(i.result))
        if k is None or not _below(k, need, keys, first):
            continue
        args = [o if isinstance(o, Const) else env[id(o)] for o in i.operands]
        env[id(i.result)] = b.emit(i.op, args, location=i.location or inst.location, **i.attrs)
        if id(i.result) in wanted:
            made[k] = env[id(i.result)]
    new_ops = [*ops, *(made[k] for k, _ in moved)]
    types = [i.result.type for _, i in moved]
    branches = tuple(_with_values(f, moved, types) for f in attrs["branches"])
    return new_ops, dict(attrs, branches=branches)


def _below(k: Key, need: set, keys: dict, fn: Function) -> bool:
    """Whether the value keyed k is one of `need` or something one of them reads."""
    todo, seen = list(need), set()
    while todo:
        x = todo.pop()
        if x == k:
            return True
        if x in seen or x[0] in ("p", "c"):
            continue
        seen.add(x)
        todo.extend(x[1])
    return False


def _with_values(f: Function, moved, types) -> Function:
    """Branch f reading the moved values from new trailing parameters instead of computing
    them; what it no longer reads goes."""
    fb = FunctionBuilder(
        f.name,
        [*f.param_types, *types],
        [q.name for q in f.params] + [f"moved{j}" for j in range(len(moved))],
    )
    env: dict[int, Operand] = {id(q): v for q, v in zip(f.params, fb.params)}
    by_key = {k: fb.params[len(f.params) + j] for j, (k, _) in enumerate(moved)}
    keys = _keys(f)
    for i in f.body:
        k = keys.get(id(i.result))
        if k in by_key:
            env[id(i.result)] = by_key[k]
            continue
        args = [o if isinstance(o, Const) else env[id(o)] for o in i.operands]
        env[id(i.result)] = fb.emit(i.op, args, location=i.location, **i.attrs)
    outs = [o if isinstance(o, Const) else env[id(o)] for o in _results(f)]
    outs = [
        fb.emit("literal", [], value=o.value, type=o.type) if isinstance(o, Const) else o
        for o in outs
    ]
    made = next((i for i in f.body if i.result is f.ret), None)
    single = made is None or made.op != "tuple"
    out = fb.finish(outs[0] if single else outs)
    out.body = live_instructions(out.body, [out.ret])
    out.location = f.location
    return out
