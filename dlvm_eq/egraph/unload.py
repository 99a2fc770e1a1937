"""The unloader: an extracted choice (e-class -> e-node) becomes an IR function again.

Explicit broadcasts feeding elementwise ops become implicit again, scalar constants become
`1.0: f32` operands, and chains of one-axis reductions merge back into one multi-axis `reduce`.

A loop body's (Once s n v) and (StepOf s n v) (rules/loops.egg) become new parameters of the
body, appended after its own; v, over the loop's outer leaves (`prog.outer_vars`), becomes a
function to run before the loop (a `Lifted` in `prog.lifted`).
"""

from __future__ import annotations

import math

from ..errors import IRError
from ..ir.module import Const, Function, FunctionBuilder, Value
from ..ir.ops import ELEMENTWISE_KINDS, OPS
from ..ir.registry import EGRAPH_ONLY
from ..ir.types import TensorType, broadcast_shapes
from .loader import REDUCE_IDENTITY, Lifted, LoadedProgram
from .serialized import LOOP_MOTION, Graph


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


class _Unloader:
    def __init__(self, g: Graph, choice: dict[str, str], prog: LoadedProgram, name: str, extra=()):
        self.g, self.choice, self.prog = g, choice, prog
        extra = list(extra)  # (e-class of a Once/StepOf, its parameter's name and type)
        self.b = FunctionBuilder(
            name,
            [p.type for p in prog.params] + [t for _, _, t in extra],
            [p.name for p in prog.params] + [n for _, n, _ in extra],
        )
        self.params = {p.name: v for p, v in zip(prog.params, self.b.params)}
        self.lifted = {c: v for (c, _, _), v in zip(extra, self.b.params[len(prog.params) :])}
        self.values: dict[str, Value | Const] = {}
        self.uses: dict[str, int] = {}
        self.reads: dict[tuple[str, str], Value] = {}  # (class, op) -> x read through op (Gemm)

    def node(self, cls: str):
        try:
            return self.g.decode(self.choice[cls])
        except KeyError:
            raise IRError(f"extraction chose no node for e-class {cls}") from None

    def count_uses(self, roots: list[str]) -> None:
        seen: set[str] = set()
        stack = list(roots)
        while stack:
            cls = stack.pop()
            if cls in seen:
                continue
            seen.add(cls)
            if self.node(cls).egg in LOOP_MOTION:
                continue  # computed before the loop, by its own function
            for c in self.node(cls).children:
                cc = self.g.eclass(c)
                self.uses[cc] = self.uses.get(cc, 0) + 1
                stack.append(cc)

    # Emission is iterative: each method below is a generator that yields an e-class whose
    # Value it needs and is sent that Value (`value` runs them on an explicit stack), in the
    # order a recursive walk would emit them; no recursion limit applies to deep programs.

    def value(self, root: str) -> Value:
        """The IR value of e-class `root`, emitting what it needs first."""
        v = self.values.get(root)
        if v is not None:
            return v
        stack = [(root, self.emit(root))]
        sent = None
        while stack:
            cls, steps = stack[-1]
            try:
                need = steps.send(sent)
            except StopIteration as done:
                self.values[cls] = sent = done.value
                stack.pop()
                continue
            sent = self.values.get(need)
            if sent is None:
                stack.append((need, self.emit(need)))
        return self.values[root]

    def operand(self, cls: str, want_value: bool):
        """The IR operand for an e-class; a scalar constant stays a Const unless a Value is needed."""
        d = self.node(cls)
        if d.egg == "Const" and not want_value:
            return Const.of(d.attrs["value"], d.attrs["dtype"])
        return (yield cls)

    def emit(self, cls: str):
        d = self.node(cls)
        b = self.b
        if d.egg == "Var":
            v = self.params.get(d.attrs["name"])
            if v is None:  # an outer leaf of a loop outside a Once/StepOf: not a program
                raise IRError(f"%{d.attrs['name']} is not a parameter of @{self.b.name}")
            return v
        if d.egg in LOOP_MOTION:
            if cls not in self.lifted:
                raise IRError(f"{d.egg} outside a loop body in @{self.b.name}")
            return self.lifted[cls]
        if d.egg == "Const":
            t = TensorType((), d.attrs["dtype"])
            return b.emit("literal", [], value=Const.of(d.attrs["value"], t.dtype).value, type=t)
        if d.egg == "Lit":
            arr = self.prog.literals[d.attrs["key"]]
            t = TensorType(arr.shape, self.prog_literal_dtype(arr))
            return b.emit("literal", [], value=arr, type=t)
        spec = OPS[d.op]
        kids = [self.g.eclass(k) for k in d.children]
        only = EGRAPH_ONLY.get(d.egg)
        if only is not None and only.reads is not None:  # Gemm: its reads (transposes), then dot
            args = []
            for k, read in zip(kids, only.reads(d.attrs)):
                args.append((yield from self.read_through(k, only.through)) if read else (yield k))
            return b.emit(d.op, args)
        if spec.kind in ELEMENTWISE_KINDS:
            return b.emit(d.op, (yield from self.elementwise_operands(kids)))
        if d.op == "reduce":
            return (yield from self.emit_reduce(d, kids[0]))
        attrs = dict(d.attrs)
        if d.op == "transpose" and tuple(attrs["perm"]) == tuple(
            reversed(range(len(attrs["perm"])))
        ):
            attrs["perm"] = None
        args = []
        for k in kids:
            args.append((yield k))
        return b.emit(d.op, args, **attrs)

    def read_through(self, cls: str, op: str):
        """Class `cls` read through `op` (default attributes), emitted once per (class, op)."""
        v = self.reads.get((cls, op))
        if v is None:
            x = yield cls
            v = self.reads[cls, op] = self.b.emit(op, [x])
        return v

    @staticmethod
    def prog_literal_dtype(arr):
        from ..ir.types import DType

        return DType.from_numpy(arr.dtype)

    def elementwise_operands(self, kids: list[str]):
        # Implicit broadcasts must still give the full shape: a unary op of a broadcast (as
        # adjoint rules build) keeps its broadcast explicit.
        ops = []
        for k in kids:
            ops.append((yield from self.elementwise_operand(k)))
        d = self.node(kids[0])
        full = tuple(d.attrs["shape"]) if d.egg == "Broadcast" else ops[0].type.shape
        if broadcast_shapes(*(o.type.shape for o in ops)) != full:
            i = next(i for i, k in enumerate(kids) if self.node(k).egg == "Broadcast")
            ops[i] = yield kids[i]
        return ops

    def elementwise_operand(self, cls: str):
        # (Broadcast x s) feeding an elementwise op is implicit again when numpy rules allow it.
        d = self.node(cls)
        if d.egg == "Broadcast":
            inner = self.g.eclass(d.children[0])
            inner_op = yield from self.operand(inner, want_value=False)
            if isinstance(inner_op, Const):
                return inner_op
            shape = tuple(d.attrs["shape"])
            if broadcast_shapes(inner_op.type.shape, shape) == shape and len(
                inner_op.type.shape
            ) <= len(shape):
                return inner_op
        return (yield from self.operand(cls, want_value=False))

    def emit_reduce(self, d, child: str):
        comb, init = d.attrs["combinator"], d.attrs["init"]
        chain = [d.attrs["axes"][0]]  # outermost first
        cls = child
        # merge inner one-axis reductions that nobody else uses
        while True:
            inner = self.node(cls)
            if (
                inner.egg == "Reduce"
                and inner.attrs["combinator"] == comb
                and _same(inner.attrs["init"], REDUCE_IDENTITY[comb])
                and self.uses.get(cls, 0) <= 1
                and cls not in self.values
            ):
                chain.append(inner.attrs["axes"][0])
                cls = self.g.eclass(inner.children[0])
            else:
                break
        x = yield cls
        removed: list[int] = []
        for ax in reversed(chain):  # innermost first: map to x's original axes
            remaining = [i for i in range(x.type.rank) if i not in removed]
            removed.append(remaining[ax])
        return self.b.emit("reduce", [x], combinator=comb, init=init, axes=tuple(sorted(removed)))


def unload(
    g: Graph, choice: dict[str, str], prog: LoadedProgram, roots: list[str], name: str | None = None
) -> Function:
    """The IR function computing the root e-classes with the chosen e-nodes (a loop body's
    Once/StepOf picks as new parameters, each with its function in `prog.lifted`)."""
    prog.lifted = []
    extra = []
    for cls in _lifted_classes(g, choice, roots):
        if not prog.outer_vars:
            raise IRError(f"a Once/StepOf term in @{name or prog.name}, which is not a loop body")
        d = g.decode(choice[cls])
        before = _outer(g, choice, prog, g.eclass(d.children[0]), len(prog.lifted))
        t = before.result_type
        if not isinstance(t, TensorType):  # pragma: no cover - a Term is a tensor
            raise IRError(f"{d.egg} of a tuple")
        step = d.egg == "StepOf"
        # named after this unit (its outer leaves' prefix), not the node's label: a constant's
        # Once may carry another loop's label, and two units' names must not meet in a body
        label = next(iter(prog.outer_vars)).split(".", 1)[0]
        pname = f"{label}.{'t' if step else 'once'}{len(prog.lifted)}"
        extra.append((cls, pname, t.with_shape(t.shape[1:]) if step else t))
        prog.lifted.append(Lifted(step, pname, before))
    u = _Unloader(g, choice, prog, name or prog.name, extra)
    u.count_uses(roots)
    outs = [u.value(r) for r in roots]
    if prog.result_is_tuple:
        return u.b.finish(outs)
    return u.b.finish(outs[0])


def _lifted_classes(g: Graph, choice: dict[str, str], roots: list[str]) -> list[str]:
    """The Once/StepOf e-classes the chosen terms of `roots` read, in a stable order."""
    out, seen, stack = [], set(), list(reversed(roots))
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        nid = choice.get(cls)
        if nid is None:
            continue
        d = g.decode(nid)
        if d.egg in LOOP_MOTION:
            out.append(cls)
            continue
        stack.extend(reversed([g.eclass(c) for c in d.children]))
    return out


def _outer(g: Graph, choice: dict[str, str], prog: LoadedProgram, cls: str, k: int) -> Function:
    """The function of the loop's outer leaves (prog.outer_vars) that computes e-class cls."""
    names = list(prog.outer_vars)
    b = FunctionBuilder("p", [prog.outer_vars[n] for n in names], names)
    outer = LoadedProgram(f"{prog.name}.before{k}", params=list(b.params))
    outer.literals, outer.var_types = prog.literals, dict(prog.outer_vars)
    return unload(g, choice, outer, [cls])
