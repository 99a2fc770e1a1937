"""What a scan's forward pass stores for its backward pass, read off the body's VJP.

The VJP of a straight-line body, `vjp(carries, x, withs, seeds) -> grads`, splits into the
instructions that do not read the seeds (the forward values it recomputes) and those that do.
Of the former, the ones that read a carry and that the latter read are the residuals: the forward scan's body computes them beside its own outputs
(the e-graph that compiles it shares the work) and stacks them; the backward body reads them
instead of recomputing them. Values that read only `with` operands and constants are the same
every step, and values that read only the step's x, are recomputed (the loop rules hoist
the former out of the loop). Two residuals are cheaper to store otherwise: a transposed
matrix is stored as it is and transposed where it is read (h_t, not h_t^T: a whole copy per
step, and the weight gradients after the loop read the stack transposed in place), and one
that a few arithmetic ops make of other residuals (sigmoid's s - s^2 beside s) is recomputed
in the backward step instead of written and read back.

    split = split_vjp(vjp, nc, nx)
    fwd = forward_with_residuals(body, split)      # body's outputs, then split.stored
    grads = emit_grads(b, split, stored, x, w, seeds)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.inline import live_instructions
from ..ir.loop_rules import inline
from ..ir.module import Const, Function, FunctionBuilder, Instruction, Value
from ..ir.types import TupleType

# the two storage choices of the module docstring (off: every residual stored as the VJP has
# it; benchmarks/rnn.py --choice residuals measures both in one process)
STORE_UNTRANSPOSED = True
RECOMPUTE_CHEAP = True


@dataclass
class Split:
    vjp: Function
    nc: int
    nx: int
    n_primal: int  # the vjp's parameters before its seeds
    stored: list[Value]  # carry parameters and step values of the vjp that the backward reads
    seeded: set[int]  # ids of the vjp's values that read a seed
    backward: list[Instruction]  # what runs in the backward step, in order
    results: list  # the vjp's returned operands (Values or Consts)


def _returned(fn: Function) -> tuple[list, Instruction | None]:
    if not isinstance(fn.result_type, TupleType):
        return [fn.ret], None
    made = next((i for i in fn.body if i.result is fn.ret), None)
    if made is not None and made.op == "tuple":
        return list(made.operands), made
    return [fn.ret], None


def split_vjp(vjp: Function, nc: int, nx: int, n_seeds: int) -> Split:
    """The residuals of a straight-line body's vjp (parameters: nc carries, nx steps of xs,
    the withs, then n_seeds seeds)."""
    n_primal = len(vjp.params) - n_seeds
    seeded = {id(p) for p in vjp.params[n_primal:]}
    # stored: what reads a carry; what reads only x (and withs) is recomputed from x, which
    # the backward step has anyway (a reshape of x stored per step would be a waste)
    varies = {id(p) for p in vjp.params[:nc]}
    for i in vjp.body:
        reads = [id(o) for o in i.operands if isinstance(o, Value)]
        if any(r in seeded for r in reads):
            seeded.add(id(i.result))
        if any(r in varies for r in reads):
            varies.add(id(i.result))
    returned, tuple_inst = _returned(vjp)
    backward = [
        i
        for i in vjp.body
        if i is not tuple_inst and (id(i.result) in seeded or id(i.result) not in varies)
    ]
    read = {id(o) for i in backward if id(i.result) in seeded for o in i.operands}
    read |= {id(o) for o in returned if isinstance(o, Value)}
    # a transposed matrix is stored untransposed and transposed again where it is read: the
    # forward step then copies it whole instead of element by element, and a product over
    # all steps (ir/loop_sums.py) reads the stack transposed in place (h_t^T of an RNN)
    relaid = {
        id(i.result)
        for i in vjp.body
        if id(i.result) in read and id(i.result) in varies and id(i.result) not in seeded
        if i.op == "transpose" and _is_matrix_transpose(i)
    }
    if not STORE_UNTRANSPOSED:
        relaid = set()
    if relaid:
        read |= {id(i.operands[0]) for i in vjp.body if id(i.result) in relaid}
        kept = {id(i) for i in backward}
        backward = [i for i in vjp.body if id(i) in kept or id(i.result) in relaid]
    stored = [p for p in vjp.params[:nc] if id(p) in read]
    stored += [
        i.result
        for i in vjp.body
        if id(i.result) in read and id(i.result) in varies and id(i.result) not in seeded
        if id(i.result) not in relaid
    ]
    chains: set[int] = set()
    if RECOMPUTE_CHEAP:
        stored, chains = _recomputed(vjp, stored, nc, n_primal)
    if chains:
        kept = {id(i) for i in backward}
        backward = [i for i in vjp.body if id(i) in kept or id(i.result) in chains]
    return Split(vjp, nc, nx, n_primal, stored, seeded, backward, returned)


# cheap to recompute where the backward step reads it: one pass over operands it loads anyway
_CHEAP = {"add", "subtract", "multiply", "negate", "square"}
_DEPTH = 3


def _recomputed(vjp: Function, stored: list[Value], nc: int, n_primal: int) -> tuple:
    """(the residuals still stored, ids of the values the backward step recomputes instead):
    a residual that a few elementwise arithmetic ops make of other residuals, the step's x,
    the withs and constants (sigmoid's s - s^2 beside s, tanh's 1 - t^2 beside t) is not
    written by the forward step and read back, but recomputed where it is read."""
    producer = {id(i.result): i for i in vjp.body}

    def cheap(v) -> bool:
        i = producer.get(id(v))
        return i is not None and i.op in _CHEAP

    base = {id(v) for v in stored if not cheap(v)} | {id(p) for p in vjp.params[nc:n_primal]}
    chains: set[int] = set()

    def derivable(v, depth: int, into: set) -> bool:
        if isinstance(v, Const) or id(v) in base:
            return True
        if depth == _DEPTH or not cheap(v):
            return False
        into.add(id(v))
        return all(derivable(o, depth + 1, into) for o in producer[id(v)].operands)

    kept = []
    for v in stored:
        chain: set[int] = set()
        if id(v) not in base and derivable(v, 0, chain):
            chains |= chain
        else:
            kept.append(v)
    return kept, chains


def _is_matrix_transpose(i: Instruction) -> bool:
    """A transpose of a rank-2 value (its operand a Value, not a constant)."""
    x = i.operands[0]
    return isinstance(x, Value) and x.tensor_type.rank == 2


def forward_with_residuals(body: Function, split: Split) -> Function:
    """`body` that also returns, after its outputs, the step's residuals (split.stored)."""
    b = FunctionBuilder(f"{body.name}.keep", body.param_types, [p.name for p in body.params])
    outs = inline(b, body, list(b.params))
    vjp = split.vjp
    env: dict[int, object] = {id(p): q for p, q in zip(vjp.params[: split.n_primal], b.params)}
    primal = [i for i in vjp.body if id(i.result) not in split.seeded]
    for i in live_instructions(primal, list(split.stored)):
        ops = [o if isinstance(o, Const) else env[id(o)] for o in i.operands]
        env[id(i.result)] = b.emit(i.op, ops, location=i.location, **i.attrs)
    results = outs + [env[id(v)] for v in split.stored]
    fn = b.finish(results if len(results) > 1 else results[0])  # no one-element tuple
    fn.body = live_instructions(fn.body, [fn.ret])
    return fn


def emit_grads(b: FunctionBuilder, split: Split, stored, x, w, seeds) -> list:
    """The vjp's gradients in builder `b`, reading the stored residuals instead of
    recomputing them (x, w: the step's xs and the withs; seeds: the vjp's seeds)."""
    vjp, nc, nx, n = split.vjp, split.nc, split.nx, split.n_primal
    env: dict[int, object] = {}
    env.update({id(p): q for p, q in zip(vjp.params[nc : nc + nx], x)})
    env.update({id(p): q for p, q in zip(vjp.params[nc + nx : n], w)})
    env.update({id(p): q for p, q in zip(vjp.params[n:], seeds)})
    env.update({id(v): q for v, q in zip(split.stored, stored)})

    def get(o):
        return o if isinstance(o, Const) else env[id(o)]

    for i in split.backward:
        if id(i.result) not in env:
            ops = [get(o) for o in i.operands]
            env[id(i.result)] = b.emit(i.op, ops, location=i.location, **i.attrs)
    return [get(o) for o in split.results]
