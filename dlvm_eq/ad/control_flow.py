"""Adjoints of functions with loops and branches. The function is cut at its control-flow ops
(ir/regions.py); the adjoint program runs the pieces forward, then backward in reverse order:

- a straight piece: its vector-Jacobian product, synthesized by the e-graph differentiator
  (driver.adjoint_function, seedable), inlined;
- `scan`: the forward scan also stacks the carries each step starts from (the residuals); the
  adjoint is a scan in the other direction over those stacks, whose body is the body's own
  VJP (synthesized the same way, so a body with loops of its own works, and grad of grad);
  it carries the carries' adjoints and sums the adjoints of the `with` operands;
- `cond`/`switch`: the same choice among the branches' VJPs (the taken branch's adjoint);
- `while`: an error (its number of steps is not known ahead), as in JAX; `dq.while_loop(...,
  max_steps=N)` is a scan and differentiates.

    g = adjoint_function(None, fn_with_a_scan, wrt=(0,), keeping=(0,))   # dispatches here

The body's forward values are recomputed in the backward step from the stored carry (memory
O(steps x carry), like checkpointing every step).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..errors import DlvmError
from ..ir.control_flow import COND, SCAN, SWITCH, WHILE, elements, reaches_control_flow
from ..ir.inline import live_instructions
from ..ir.loop_rules import inline
from ..ir.module import Const, Function, FunctionBuilder, Value
from ..ir.regions import Piece, normalize, split
from ..ir.types import TensorType, TupleType
from .scan_residuals import Split, emit_grads, forward_with_residuals, split_vjp

# False: the forward stores only the carries and the backward step runs the body again (less
# memory, more work: the GRU of benchmarks/rnn.py does 15 matmuls a backward step, not 9)
STORE_RESIDUALS = True


def _is_float(t) -> bool:
    return isinstance(t, TensorType) and t.dtype.is_float


def _zeros(b: FunctionBuilder, t: TensorType) -> Value:
    return b.emit("literal", [], value=0.0, type=t)


class _Adjoint:
    def __init__(self, module, fn: Function, cfg, name: str, tuple_result, options: dict):
        from .driver import adjoint_signature

        self.module, self.fn, self.cfg, self.options = module, fn, cfg, options
        self.tuple_result = tuple_result
        params, results = adjoint_signature(fn, cfg)
        names = [p.name for p in fn.params] + [
            "seed" if len(cfg.outputs) == 1 else f"seed{k}" for k in range(len(cfg.outputs))
        ][: len(params) - len(fn.params)]
        self.b = FunctionBuilder(name, params, names)
        self.env: dict[int, object] = {}
        self.active: set[int] = set()
        self.adj: dict[int, Value] = {}
        self.residuals: dict[int, _ScanPlan] = {}  # id(scan piece) -> how it differentiates

    # -- helpers
    def get(self, o):
        return o if isinstance(o, Const) else self.env[id(o)]

    def vjp(self, fn: Function, wrt: list[int], name: str) -> Function:
        from .driver import adjoint_function

        out = adjoint_function(
            None, fn, wrt=tuple(wrt), seedable=True, name=name, tuple_result=True, **self.options
        )
        return dataclasses.replace(out)  # our own object: a module may rename it

    def add_adjoint(self, v, g: Value) -> None:
        if not isinstance(v, Value) or id(v) not in self.active:
            return
        old = self.adj.get(id(v))
        self.adj[id(v)] = g if old is None else self.b.emit("add", [old, g])

    def seed(self, v: Value) -> Value:
        g = self.adj.get(id(v))
        return g if g is not None else _zeros(self.b, v.type)

    # -- the two passes
    def build(self) -> Function:
        fn, cfg, b = self.fn, self.cfg, self.b
        params, nodes, results = normalize(fn, self.module)
        pieces = split(params, nodes, results, f"{fn.name}.piece")
        for p, q in zip(params, b.params):
            self.env[id(p)] = q
        self.active = {id(params[i]) for i in cfg.wrt}
        for piece in pieces:
            self.forward(piece)
        seeds = b.params[len(fn.params) :]
        for k, i in enumerate(cfg.outputs):
            r = results[i]
            g = seeds[k] if cfg.seedable else b.emit("literal", [], value=1.0, type=r.type)
            self.add_adjoint(r, g)
        for piece in reversed(pieces):
            if any(id(v) in self.adj for v in piece.outputs):
                self.backward(piece)
        out = [self.get(results[i]) for i in cfg.keeping]
        out += [self.seed(params[i]) for i in cfg.wrt]
        out = [
            b.emit("literal", [], value=o.value, type=o.type) if isinstance(o, Const) else o
            for o in out
        ]
        if self.tuple_result or (self.tuple_result is None and len(out) > 1):
            fn = b.finish(out)
        else:
            fn = b.finish(out[0])
        fn.body = live_instructions(fn.body, [fn.ret])
        return fn

    def forward(self, piece: Piece) -> None:
        b = self.b
        if piece.region is None:
            for inst in piece.insts:
                ops = [self.get(o) for o in inst.operands]
                self.env[id(inst.result)] = b.emit(
                    inst.op, ops, location=inst.location, **inst.attrs
                )
                if _is_float(inst.result.type) and any(
                    isinstance(o, Value) and id(o) in self.active for o in inst.operands
                ):
                    self.active.add(id(inst.result))
            return
        inst = piece.region.inst
        live = any(isinstance(o, Value) and id(o) in self.active for o in inst.operands)
        if live and inst.op == WHILE:
            loc = inst.location
            where = f"{loc[0]}:{loc[1]}:{loc[2]}: " if loc else ""
            raise DlvmError(
                f"{where}a while loop cannot be differentiated: its number of steps is not "
                "known ahead (as in JAX); give while_loop max_steps=N to differentiate it "
                "as a scan of at most N steps"
            )
        ops = [self.get(o) for o in inst.operands]
        attrs = dict(inst.attrs)
        plan = self.scan_plan(inst) if live and inst.op == SCAN else None
        if plan is not None:  # the body also returns what the backward step reads
            attrs["body"] = plan.forward
        r = b.emit(inst.op, ops, location=inst.location, **attrs)
        outs = _elements_of(b, r)
        for v, o in zip(piece.outputs, outs):
            self.env[id(v)] = o
            if live and _is_float(v.type):
                self.active.add(id(v))
        if plan is not None:
            plan.stacks = outs[len(piece.outputs) :]
            self.residuals[id(piece)] = plan

    def scan_plan(self, inst) -> _ScanPlan | None:
        """How the scan `inst` is differentiated: the body's VJP, what the forward stores."""
        a = inst.attrs
        body, nc, nx = a["body"], a["carries"], a["xs"]
        ops = inst.operands
        carries, xs, withs = ops[:nc], ops[nc : nc + nx], ops[nc + nx :]
        outs = elements(body.result_type)
        p = _ScanPlan(
            fc=[k for k in range(nc) if _is_float(carries[k].type)],
            ax=[j for j, o in enumerate(xs) if isinstance(o, Value) and id(o) in self.active],
            aw=[j for j, o in enumerate(withs) if isinstance(o, Value) and id(o) in self.active],
            fy=[j for j in range(nc, len(outs)) if _is_float(outs[j])],
        )
        wrt = p.fc + [nc + j for j in p.ax] + [nc + nx + j for j in p.aw]
        if not wrt or not (p.fc or p.fy):
            return None
        p.vjp = self.vjp(body, wrt, f"{body.name}.vjp")
        if STORE_RESIDUALS and not reaches_control_flow(p.vjp):  # store the step's residuals
            p.split = split_vjp(p.vjp, nc, nx, len(p.fc) + len(p.fy))
            p.forward = forward_with_residuals(body, p.split)
            p.stored = [v.type for v in p.split.stored]
            p.names = [f"r.{v.name}" for v in p.split.stored]
        else:  # a body with loops: store the carries, run the body again backward
            p.forward = _with_residuals(body, nc)
            p.stored = body.param_types[:nc]
            p.names = [q.name for q in body.params[:nc]]
        return p

    def backward(self, piece: Piece) -> None:
        if piece.region is None:
            self.backward_straight(piece)
        elif piece.region.inst.op == SCAN:
            self.backward_scan(piece)
        elif piece.region.inst.op in (COND, SWITCH):
            self.backward_branches(piece)

    def backward_straight(self, piece: Piece) -> None:
        f = piece.function
        wrt = [k for k, v in enumerate(piece.inputs) if id(v) in self.active]
        if not wrt or not any(_is_float(v.type) for v in piece.outputs):
            return
        vjp = self.vjp(f, wrt, f"{f.name}.vjp")
        seeds = [self.seed(v) for v in piece.outputs if _is_float(v.type)]
        grads = inline(self.b, vjp, [self.get(v) for v in piece.inputs] + seeds)
        for k, g in zip(wrt, grads):
            self.add_adjoint(piece.inputs[k], g)

    def backward_branches(self, piece: Piece) -> None:
        inst = piece.region.inst
        args = inst.operands[1:]
        wrt = [k for k, o in enumerate(args) if isinstance(o, Value) and id(o) in self.active]
        if not wrt:
            return
        vjps = tuple(self.vjp(br, wrt, f"{br.name}.vjp") for br in inst.attrs["branches"])
        seeds = [self.seed(v) for v in piece.outputs if _is_float(v.type)]
        ops = [self.get(o) for o in inst.operands] + seeds
        r = self.b.emit(inst.op, ops, location=inst.location, branches=vjps)
        for k, g in zip(wrt, _elements_of(self.b, r)):
            self.add_adjoint(args[k], g)

    def backward_scan(self, piece: Piece) -> None:
        b, inst = self.b, piece.region.inst
        plan = self.residuals.get(id(piece))
        if plan is None:
            return
        a = inst.attrs
        body, nc, nx = a["body"], a["carries"], a["xs"]
        ops = inst.operands
        carries, xs, withs = ops[:nc], ops[nc : nc + nx], ops[nc + nx :]
        step = _adjoint_step(body, nc, nx, plan)
        final = [self.seed(piece.outputs[k]) for k in plan.fc]
        acc = [_zeros(b, withs[j].type) for j in plan.aw]
        ys = [self.seed(piece.outputs[j]) for j in plan.fy]
        over = plan.stacks + [self.get(o) for o in xs] + ys
        r = b.emit(
            SCAN,
            [*final, *acc, *over, *(self.get(o) for o in withs)],
            location=inst.location,
            body=step,
            length=a["length"],
            reverse=not a["reverse"],
            carries=len(final) + len(acc),
            xs=len(over),
        )
        got = _elements_of(b, r)
        fc, aw, ax = plan.fc, plan.aw, plan.ax
        for k, g in zip(fc, got):
            self.add_adjoint(carries[k], g)
        for j, g in zip(aw, got[len(fc) :]):
            self.add_adjoint(withs[j], g)
        for j, g in zip(ax, got[len(fc) + len(aw) :]):
            self.add_adjoint(xs[j], g)


@dataclass
class _ScanPlan:
    """A scan's differentiation: float carries (fc), active xs (ax) and withs (aw), float ys
    (fy); the body's VJP; the forward body that also returns the stored values (their types
    and names), their stacks once the forward scan is emitted."""

    fc: list[int]
    ax: list[int]
    aw: list[int]
    fy: list[int]
    vjp: Function | None = None
    split: Split | None = None
    forward: Function | None = None
    stored: list = field(default_factory=list)
    names: list = field(default_factory=list)
    stacks: list = field(default_factory=list)


def _elements_of(b: FunctionBuilder, r: Value) -> list[Value]:
    if not isinstance(r.type, TupleType):
        return [r]
    return [b.emit("extract", [r], index=i) for i in range(len(r.type.elements))]


def _with_residuals(body: Function, nc: int) -> Function:
    """`body` that also returns, after its own outputs, the carries it was given."""
    b = FunctionBuilder(f"{body.name}.keep", body.param_types, [p.name for p in body.params])
    outs = inline(b, body, list(b.params))
    return _finished(b, outs + list(b.params[:nc]))


def _adjoint_step(body, nc, nx, plan: _ScanPlan) -> Function:
    """The backward scan's body: (carry adjoints, with-adjoint sums; the step's stored values,
    xs and y adjoints; withs) -> (carry adjoints, sums, xs adjoints)."""
    fc, ax, aw, fy = plan.fc, plan.ax, plan.aw, plan.fy
    ts = body.param_types
    withs_t = ts[nc + nx :]
    outs = elements(body.result_type)
    params = (
        [ts[k] for k in fc]
        + [withs_t[j] for j in aw]
        + list(plan.stored)
        + ts[nc : nc + nx]
        + [outs[j] for j in fy]
        + withs_t
    )
    names = [p.name for p in body.params]
    b = FunctionBuilder(
        f"{body.name}.adjoint",
        params,
        [f"ct.{names[k]}" for k in fc]
        + [f"sum.{names[nc + nx + j]}" for j in aw]
        + list(plan.names)
        + names[nc : nc + nx]
        + [f"ct.y{j - nc}" for j in fy]
        + names[nc + nx :],
    )
    p = iter(b.params)
    ct = [next(p) for _ in fc]
    acc = [next(p) for _ in aw]
    stored = [next(p) for _ in plan.stored]
    x = [next(p) for _ in range(nx)]
    ct_y = [next(p) for _ in fy]
    w = list(p)
    if plan.split is not None:
        grads = emit_grads(b, plan.split, stored, x, w, ct + ct_y)
    else:
        grads = inline(b, plan.vjp, stored + x + w + ct + ct_y)
    g_c, g_x, g_w = grads[: len(fc)], grads[len(fc) : len(fc) + len(ax)], grads[len(fc) + len(ax) :]
    sums = [b.emit("add", [s, g]) for s, g in zip(acc, g_w)]
    return _finished(b, g_c + sums + g_x)


def _finished(b: FunctionBuilder, outs: list) -> Function:
    """b's function returning `outs`, without the instructions they do not need."""
    fn = b.finish(outs if len(outs) != 1 else outs[0])
    fn.body = live_instructions(fn.body, [fn.ret])
    return fn


def control_flow_adjoint(module, fn: Function, cfg, name: str, tuple_result, options) -> Function:
    """The adjoint of `fn` (which has control flow) for the normalized request `cfg`."""
    out = _Adjoint(module, fn, cfg, name, tuple_result, options).build()
    out.location = fn.location
    return out
