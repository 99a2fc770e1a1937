"""The target cost model: estimated seconds of one e-node on a machine, from the shapes of its
e-class and its children's e-classes (`dlvm_eq.egraph.class_types`).

- Leaves (`Var`, `Const`, `Lit`) and primitives cost nothing; views (`Broadcast`, `ShapeCast`,
  `PadShape`, `SqueezeShape`) almost nothing: codegen fuses them into the reads of their users.
- A matmul (`Dot`, `Gemm`) costs a call plus 2·m·k·n flops at the BLAS rate, so a matrix chain
  extracts to the dynamic-programming optimum. `Gemm` reads its operands transposed through
  BLAS flags: the transpose is never materialized.
- An elementwise op costs its flops plus a fraction (`fused_fraction`) of its output traffic
  and of a launch: most of it fuses into a neighbouring kernel.
- Reductions, transposes, concatenations and slices are kernel boundaries: a launch plus their
  traffic (a slice is a copy of its result's bytes).
- Anything else in a Term class (e.g. `Adjoint`, helpers of other rule files) and analysis
  entries (`shape`, `dtype`, ...) are forbidden (infinite cost): they are not programs.

    >>> from dlvm_eq.ir.types import tensor, F32
    >>> cost = TargetCost("cpu", {})
    >>> cost.dot_seconds(30, 35, 15) > cost.dot_seconds(35, 15, 5)
    True
"""
from __future__ import annotations

import math
from typing import Mapping

from ..ir.ops import ELEMENTWISE_KINDS, OPS, WINDOW
from ..ir.types import TensorType
from .machine import Machine, machine
from .window_cost import window_seconds

INF = math.inf

_EGG_KIND = {spec.egg: spec.kind for spec in OPS.values()}
LEAVES = frozenset(("Var", "Const", "Lit"))
VIEWS = frozenset(("Broadcast", "ShapeCast", "PadShape", "SqueezeShape"))
MATMULS = frozenset(("Dot", "Gemm"))

# flops per output element; everything not listed is one flop (the fusion extractor's scalar
# ops cost the same: extract/fusion_cost.py)
FLOPS = {"Divide": 4, "Sqrt": 4, "Rsqrt": 4, "Power": 40}
FLOPS.update({op: 20 for op in ("Exp", "Log", "Tanh", "Sigmoid", "Softplus", "Log1p", "Expm1",
                                 "Sin", "Cos", "Tan", "Sinh", "Cosh")})


def flops_per_element(op: str, mc: Machine | None = None) -> float:
    """An elementwise constructor's cost per element in flops: measured on a calibrated
    machine (`dlvm-eq calibrate`), else the FLOPS table."""
    if mc is not None and op in mc.op_flops:
        return float(mc.op_flops[op])
    return float(FLOPS.get(op, 1))


class TargetCost:
    """A cost model (`node_cost(graph, node_id)`) for one target and one e-graph's class types."""

    def __init__(self, target: str | Machine, types: Mapping[str, TensorType]):
        self.machine = machine(target)
        self.types = types

    # ------------------------------------------------------------ formulas
    def dot_seconds(self, m: int, k: int, n: int) -> float:
        return self.machine.matmul_seconds(m, k, n)

    def elementwise_seconds(self, op: str, t: TensorType) -> float:
        mc = self.machine
        n = t.size
        return (mc.node_overhead + n * flops_per_element(op, mc) / mc.flop_rate
                + mc.fused_fraction * (n * t.dtype.itemsize / mc.bandwidth + mc.launch))

    def kernel_seconds(self, elements_in: int, t_out: TensorType, copies: int = 1) -> float:
        mc = self.machine
        return (mc.node_overhead + mc.launch + elements_in / (mc.reduce_rate or mc.flop_rate)
                + copies * t_out.size * t_out.dtype.itemsize / mc.bandwidth)

    # ------------------------------------------------------------ the cost model
    def node_cost(self, graph, node_id: str) -> float:
        node = graph.raw_nodes[node_id]
        op = node["op"]
        cls = node["eclass"]
        if graph.class_data.get(cls, {}).get("type") != "Term":
            # primitives (numbers, strings, vectors) are free; analysis rows are not terms
            return 0.0 if node_id.startswith("primitive") else INF
        if op in LEAVES:
            return 0.0
        kids = node["children"]
        child = (lambda i: self.types.get(graph.raw_nodes[kids[i]]["eclass"])) if kids else None
        flags = (graph.raw_nodes[kids[2]]["op"] == "1", graph.raw_nodes[kids[3]]["op"] == "1") \
            if op == "Gemm" else (False, False)
        return self.term_cost(op, self.types.get(cls), child, flags)

    def term_cost(self, op: str, t: TensorType | None, child, flags=(False, False)) -> float:
        """The cost of constructor `op` with result type t; child(i) is operand i's type (or
        None where unknown); flags: Gemm's transpose flags."""
        if op in LEAVES:
            return 0.0
        if t is None:
            return INF           # an ill-typed class: never extract it
        if op in VIEWS:
            return self.machine.node_overhead
        if op in MATMULS:
            a, b = child(0), child(1)
            if a is None or b is None:
                return INF
            sa = a.shape[::-1] if flags[0] else a.shape
            sb = b.shape[::-1] if flags[1] else b.shape
            m = sa[0] if len(sa) == 2 else 1
            k = sa[-1] if sa else 1
            n = sb[1] if len(sb) == 2 else 1
            return self.machine.node_overhead + self.dot_seconds(m, k, n)
        if op == "BatchMatmul":     # one BLAS product per batch index
            a, b = child(0), child(1)
            if a is None or b is None:
                return INF
            batch = math.prod(t.shape[:-2])
            return self.machine.node_overhead + self.dot_seconds(batch * a.shape[-2], a.shape[-1], b.shape[-1])
        kind = _EGG_KIND.get(op)
        if kind in ELEMENTWISE_KINDS or op == "DataTypeCast":
            return self.elementwise_seconds(op, t)
        if op == "Reduce":
            src = child(0)
            return INF if src is None else self.kernel_seconds(src.size, t)
        if op in ("Transpose", "Concatenate", "Slice", "Take", "ScatterAdd", "StridedSlice", "SliceScatter",
                  "Cumsum"):
            return self.kernel_seconds(0, t, copies=2)
        if kind == WINDOW:
            return window_seconds(self, op, t, child)
        return INF               # helper constructors (Adjoint, ...) are not programs
