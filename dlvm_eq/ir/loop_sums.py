"""A loop rule for the adjoint of a scan: a carry that only accumulates a per-step product,

    acc' = acc + A_t @ B_t        (or a slice of such a product, one gate of merged gates)

leaves the loop. Its final value is acc0 + sum_t A_t @ B_t = acc0 + [A_0 | A_1 | ...] @
[B_0; B_1; ...]: ONE product over all steps, after the loop, of the per-step factors stacked
by the scan (a factor that is a step of `xs` is stacked already). This is how the weight
gradients of an RNN (sum_t x_t^T dG_t, sum_t h_t^T dG_t) are computed by cuDNN and PyTorch:
instead of T rank-`batch` updates of a weight-sized accumulator (each a read and a write of
the whole matrix), one large GEMM.

    plan = summed_carries(scan_instruction)           # carry index -> its product, or {}
    inst, ops, finish = defer_sums(inst, ops, plan)    # the scan without those carries
    r = b.emit(SCAN, ops, **inst.attrs)
    values = finish(b, r)                              # old result index -> Value or new index

The rule is priced: a carry is deferred only where the factors it stores per step (B_t, and
A_t when it is not a step of `xs`) are fewer elements than the accumulator it stops reading
and writing each step (`pays`). Same ops on the same numbers, regrouped: a float sum in
another order.
"""

from __future__ import annotations

from dataclasses import dataclass

from .inline import live_instructions
from .module import Const, Function, FunctionBuilder, Instruction, Operand, Value
from .types import TupleType


@dataclass
class Summed:
    """Carry `k` accumulates `dot(a, b)` (sliced by `cut`, the slice's attrs, when not None)."""

    k: int
    dot: Instruction
    cut: dict | None


def body_outputs(fn: Function) -> list | None:
    """The operands fn returns, one per result element; None if its result is not spelled out."""
    if not isinstance(fn.result_type, TupleType):
        return [fn.ret]
    made = next((i for i in fn.body if i.result is fn.ret), None)
    return list(made.operands) if made is not None and made.op == "tuple" else None


def summed_carries(inst: Instruction) -> dict[int, Summed]:
    """The carries of scan `inst` whose body only adds a per-step product to them and that
    pay to defer (see the module docstring), by carry index."""
    a = inst.attrs
    body, nc, nx = a["body"], a["carries"], a["xs"]
    outs = body_outputs(body)
    if outs is None or a["length"] < 2 or nc == 0:
        return {}
    uses: dict[int, int] = {}
    for i in live_instructions(body.body, [body.ret]):  # (a dead duplicate reads nothing)
        for o in i.operands:
            uses[id(o)] = uses.get(id(o), 0) + 1
    if not isinstance(body.result_type, TupleType):  # (a tuple's operands counted above)
        uses[id(body.ret)] = uses.get(id(body.ret), 0) + 1
    producer = {id(i.result): i for i in body.body}
    steps = {id(p) for p in body.params[nc : nc + nx]}
    withs = {id(p) for p in body.params[nc + nx :]}
    found: dict[int, Summed] = {}
    for k in range(nc):
        p, o = body.params[k], outs[k]
        add = producer.get(id(o)) if isinstance(o, Value) else None
        if add is None or add.op != "add" or uses.get(id(p)) != 1 or uses.get(id(o)) != 1:
            continue
        x, y = add.operands
        term = y if x is p else x if y is p else None
        if not isinstance(term, Value) or term is p or term.type != p.type:
            continue
        made = producer.get(id(term))
        cut = None
        if made is not None and made.op == "slice" and isinstance(made.operands[0], Value):
            cut = dict(made.attrs)
            made = producer.get(id(made.operands[0]))
        if made is None or made.op != "dot":
            continue
        fa, fb = made.operands
        if not all(isinstance(f, Value) and f.tensor_type.rank == 2 for f in (fa, fb)):
            continue
        if any(id(f) in withs for f in (fa, fb)):
            continue  # an invariant factor: sum_t W B_t = W sum_t B_t, another rule
        found[k] = Summed(k, made, cut)
    if not found:
        return {}
    return found if pays(found, producer, steps) else {}


def pays(found: dict[int, Summed], producer: dict, steps: set) -> bool:
    """Whether the elements stored per step (each distinct factor, once) are fewer than the
    accumulators' elements that stop being read and written every step."""
    saved = sum(_size(s.dot.result) if s.cut is None else _sliced(s) for s in found.values())
    stored, seen = 0, set()
    for s in found.values():
        fa, fb = s.dot.operands
        for f, is_a in ((fa, True), (fb, False)):
            if id(f) in seen or id(f) in steps:
                continue
            t = producer.get(id(f))
            if is_a and t is not None and t.op == "transpose" and id(t.operands[0]) in steps:
                continue  # x_t^T: the stacked xs, read transposed by the product
            seen.add(id(f))
            stored += _size(f)
    return stored < saved


def is_zero(v: Operand, producer: dict) -> bool:
    """Whether `v` is the literal 0 or a broadcast of it (`producer`: id(Value) -> its
    instruction)."""
    if isinstance(v, Const):
        return v.value == 0
    made = producer.get(id(v))
    if made is not None and made.op == "broadcast":
        return is_zero(made.operands[0], producer)
    if made is not None and made.op == "literal":
        value = made.attrs.get("value")
        return isinstance(value, (int, float, bool)) and value == 0
    return False


def _size(v: Operand) -> int:
    return v.tensor_type.size


def _sliced(s: Summed) -> int:
    assert s.cut is not None
    t = s.dot.result.tensor_type
    return t.size * (s.cut["hi"] - s.cut["lo"]) // t.shape[s.cut["axis"]]


def defer_sums(inst: Instruction, ops: list, found: dict[int, Summed]):
    """(scan `inst` without the carries in `found`, its operands, finish): `finish(b, r)`
    emits, after the scan's result `r` is emitted in builder `b`, each deferred carry's final
    value, and returns old result index -> new index, or the Value that replaces it."""
    a = inst.attrs
    body, nc, nx, n = a["body"], a["carries"], a["xs"], a["length"]
    outs = body_outputs(body)
    assert outs is not None  # summed_carries found carries, so they are spelled out
    params = body.params
    producer = {id(i.result): i for i in body.body}
    steps = {id(p): k for k, p in enumerate(params[nc : nc + nx])}
    keep = [k for k in range(len(params)) if k not in found]
    stacked: list[Operand] = []  # body values output as new ys (stacked by the scan)

    def stack_of(v: Operand):
        """('xs', index) or ('y', index): where all steps of body value v are, stacked."""
        if id(v) in steps:
            return ("xs", steps[id(v)])
        for j, s in enumerate(stacked):
            if s is v:
                return ("y", j)
        stacked.append(v)
        return ("y", len(stacked) - 1)

    factors = {}  # id(dot) -> (how A is read, where B is)
    for s in found.values():
        if id(s.dot) in factors:
            continue
        fa, fb = s.dot.operands
        t = producer.get(id(fa))
        if t is not None and t.op == "transpose" and id(t.operands[0]) in steps:
            how_a = ("xsT", stack_of(t.operands[0]))  # x_t^T: (T*M, K) read transposed
        else:
            how_a = ("stack", stack_of(fa))
        factors[id(s.dot)] = (how_a, stack_of(fb))
    fb_ = FunctionBuilder(
        body.name, [body.param_types[k] for k in keep], [params[k].name for k in keep]
    )
    env: dict[int, Operand] = {id(params[k]): q for k, q in zip(keep, fb_.params)}
    new_outs = [o for j, o in enumerate(outs) if j >= nc or j not in found] + stacked
    for i in live_instructions(body.body, [o for o in new_outs if isinstance(o, Value)]):
        args = [o if isinstance(o, Const) else env[id(o)] for o in i.operands]
        env[id(i.result)] = fb_.emit(i.op, args, location=i.location, **i.attrs)
    made: list[Operand] = [o if isinstance(o, Const) else env[id(o)] for o in new_outs]
    made = [
        o if isinstance(o, Value) else fb_.emit("literal", [], value=o.value, type=o.type)
        for o in made
    ]
    new_body = fb_.finish(made if len(made) > 1 else made[0])
    new_nc = nc - len(found)
    n_old_ys = len(outs) - nc
    attrs = dict(a, body=new_body, carries=new_nc)
    new_inst = Instruction(
        inst.result, inst.op, [inst.operands[k] for k in keep], attrs, inst.location
    )
    new_ops = [ops[k] for k in keep]
    loc = inst.location

    def finish(b: FunctionBuilder, r: Value) -> dict:
        single = not isinstance(r.type, TupleType)
        made_in_b = {id(i.result): i for i in b.body}
        index: dict[int, object] = {}
        kept = [k for k in range(nc) if k not in found]
        for j, k in enumerate(kept):
            index[k] = j
        for j in range(n_old_ys):
            index[nc + j] = new_nc + j

        def whole(where):
            kind, j = where
            if kind == "xs":
                return ops[nc + j]
            return (
                r if single else b.emit("extract", [r], location=loc, index=new_nc + n_old_ys + j)
            )

        sums: dict[int, Value] = {}
        cats: dict[tuple, Value] = {}  # each stacked factor laid out once, however many read it

        def cat(how, where, rows, cols):
            hit = cats.get((how, where))
            if hit is not None:
                return hit
            if how == "B":  # [B_0; B_1; ...]: (T*M, N), the stack itself
                v = b.emit("shapeCast", [whole(where)], location=loc, shape=(n * rows, cols))
            elif how == "xsT":  # [x_0^T | x_1^T | ...]: the stacked xs read transposed
                flat = b.emit("shapeCast", [whole(where)], location=loc, shape=(n * cols, rows))
                v = b.emit("transpose", [flat], location=loc)
            else:  # [A_0 | A_1 | ...]: (K, T*M), a copy of the stack
                moved = b.emit("transpose", [whole(where)], location=loc, perm=(1, 0, 2))
                v = b.emit("shapeCast", [moved], location=loc, shape=(rows, n * cols))
            cats[(how, where)] = v
            return v

        for k, s in found.items():
            total = sums.get(id(s.dot))
            if total is None:
                (how, where_a), where_b = factors[id(s.dot)]
                fa, fb = s.dot.operands
                k_, m = fa.tensor_type.shape
                acat = cat(how, where_a, k_, m)
                bcat = cat("B", where_b, m, fb.tensor_type.shape[1])
                total = sums[id(s.dot)] = b.emit("dot", [acat, bcat], location=loc)
            if s.cut is not None:
                total = b.emit("slice", [total], location=loc, **s.cut)
            # acc0 + total; an accumulator starting at zero (a gradient's) is the total itself
            zero = is_zero(ops[k], made_in_b) and ops[k].type == total.type
            index[k] = total if zero else b.emit("add", [ops[k], total], location=loc)
        return index

    return new_inst, new_ops, finish


__all__ = ["Summed", "body_outputs", "defer_sums", "is_zero", "pays", "summed_carries"]
