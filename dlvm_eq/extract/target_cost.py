"""The target cost model: estimated seconds of one e-node on a machine, from the shapes of its
e-class and its children's e-classes (`dlvm_eq.egraph.class_types`).

- Leaves (`Var`, `Const`, `Lit`) and primitives cost nothing; views (`Broadcast`, `ShapeCast`,
  `PadShape`, `SqueezeShape`) almost nothing: codegen fuses them into the reads of their users.
- A matmul (`Dot`, `Gemm`) costs a call plus 2·m·k·n flops at the BLAS rate, so a matrix chain
  extracts to the dynamic-programming optimum, plus one memory pass over each operand and the
  result larger than a cache (BLAS packs both operands): a product of few flops per byte (a
  row times big weights) is priced by its bytes, and three products of one x pack x thrice. `Gemm`
  reads its operands transposed through BLAS flags: the transpose is never materialized.
- A batched product (`BatchMatmul`) costs its flops at the BLAS rate, and where one entry's
  operand or result does not fit in a core's cache, those bytes at the machine's measured
  `blas_stream` rate (`streamed_seconds`): plain attention's seq x seq scores.
- An elementwise op costs its flops plus a fraction (`fused_fraction`) of its output traffic
  and of a launch: most of it fuses into a neighbouring kernel.
- A slice is a view: the planner reads it in place (an alias of its operand's memory with the
  operand's strides; BLAS reads a column block through its leading dimension), so the merged
  product x@[Wq|Wk|Wv] costs its slices nothing.
- Reductions, transposes and concatenations are kernel boundaries: a launch plus their
  traffic (a concatenation copies its parts: small for weights, large for activations),
  except, on the CPU and where concat_place.PRICED_FREE is set, a concatenation of parts its
  producers write in place (concat_place.py).
- Anything else in a Term class (e.g. `Adjoint`, helpers of other rule files) and analysis
  entries (`shape`, `dtype`, ...) are forbidden (infinite cost): they are not programs.

    >>> from dlvm_eq.ir.types import tensor, F32
    >>> cost = TargetCost("cpu", {})
    >>> cost.dot_seconds(30, 35, 15) > cost.dot_seconds(35, 15, 5)
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..ir.op_spec import COST_FLOPS, MATMUL_COST, VIEW_COST
from ..ir.ops import ELEMENTWISE_KINDS, OPS, WINDOW
from ..ir.registry import EGRAPH_ONLY
from ..ir.registry.egraph_only import LOOP_MOTION as LOOP_MOTION_ROLE
from ..ir.types import TensorType
from . import concat_place
from .attention_cost import attention_backward_seconds, attention_seconds
from .concat_place import in_place_parts
from .machine import Machine, interpolate, machine
from .window_cost import window_seconds

INF = math.inf

_EGG_KIND = {spec.egg: spec.kind for spec in OPS.values()}
LEAVES = frozenset(("Var", "Const", "Lit"))
# rules/loops.egg: (Once s n v) and (StepOf s n v) read, in a loop body of n steps, a value
# computed once before the loop (or a row of it): Once priced as a view, a StepOf row by
# step_row_seconds, and v's term at 1/n a step
LOOP_MOTION = frozenset(e.egg for e in EGRAPH_ONLY.values() if e.role == LOOP_MOTION_ROLE)
# a fresh 4 KiB page's first write (measured on this kind of machine: a new 40 MB array takes
# 17 ms): what a large stacked value costs each call beyond its traffic. Without it, batching
# x_t @ W priced as a win at T = 2048 and measured 1.3x the loop's CPU (GRU hidden 64, load 13).
FRESH_PAGE_SECONDS = 1.7e-6
# the registry's views and products (their cost classes), and Gemm, the e-graph's dot of
# operands read transposed (rules/algebra.egg; ir/registry/egraph_only.py)
VIEWS = frozenset(s.egg for s in OPS.values() if s.cost == VIEW_COST)
MATMULS = frozenset(s.egg for s in OPS.values() if s.cost == MATMUL_COST) | {
    e.egg for e in EGRAPH_ONLY.values() if e.reads and e.op and OPS[e.op].cost == MATMUL_COST
}


def _read_flags(only, prims: list[str]) -> tuple[bool, ...]:
    """Which operands an e-graph-only product reads transposed (Gemm's flags), from its
    primitive arguments as the serialized e-graph spells them."""
    return only.reads(only.attrs(tuple(prims)))


# each entry of a batched product with a dimension of 1 beyond its flops: numpy's loop calls one
# small product an entry (codegen's batched GEMM declines such entries: 64 entries of 16x32 @
# 32x1 took 6.7 us and of 16x1 @ 1x32 49 us, where their flops take 0.2 us; one thread, this
# kind of machine). Without it such a product priced as one GEMM of its flops, and its
# multiply-and-reduce form (rules/layout.egg) lost to it. Entries of real products run in the
# batched GEMM's native loop: charged per entry, a pointwise convolution's weight adjoint
# (8 entries of 16x256x16) lost its product form and measured 1.15x slower.
BATCH_ENTRY_SECONDS = 1e-7


def batch_entries_seconds(batch: int, m: int, k: int, n: int) -> float:
    """The per-entry cost of `batch` products (m, k) @ (k, n) in one call (see above)."""
    return batch * BATCH_ENTRY_SECONDS if batch > 1 and min(m, k, n) == 1 else 0.0


# passes over the bytes a gather or a scatter moves (its source rows or g, its indices and its
# result), where a copy is one pass (the same figures price the planned steps:
# calibration/plan_cost.DEFAULT_PASSES). Priced by their output alone, a scatter of 512 rows
# into 64 cost less than the 64-row product it precedes. The executor runs both as native
# kernels (codegen/execution/index_steps.py), not numpy's loops: measured against a copy of as
# many bytes (one thread, 0.5-17 MB moved, session 17) a take took 0.84-1.6x, a scatter-add
# 1.6-2.2x. ScatterAdd was 8 (numpy's unbuffered np.add.at): it priced the scatter of a conv1d's
# shifted-taps adjoint 4x over, and with the shipped defaults the convolution adjoints stayed.
INDEX_PASSES = {"Take": 1.5, "ScatterAdd": 2.0}

# an operand up to this size is re-read from a core's cache (L2: 512 KiB on this EPYC), not memory
CACHE_BYTES = 512 * 1024

# flops per output element, from each op's cost class in the registry (ir/registry/); ops of
# no class are one flop (the fusion extractor's scalar ops cost the same: extract/fusion_cost.py)
FLOPS = {
    spec.egg: COST_FLOPS[spec.cost]
    for spec in OPS.values()
    if spec.cost in COST_FLOPS and COST_FLOPS[spec.cost] != 1
}


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
        self._once: tuple[int, dict[int, int]] | None = None  # (id(graph), class -> trips)

    # ------------------------------------------------------------ formulas
    def dot_seconds(self, m: int, k: int, n: int) -> float:
        return self.machine.matmul_seconds(m, k, n)

    def gemm_seconds(self, m: int, k: int, n: int, itemsize: int) -> float:
        """One (m, k) @ (k, n) call: its compute plus a memory pass over each operand and the
        result that does not fit in a core's cache (BLAS packs both operands; smaller ones are
        read again from cache, and a chain of small products is priced by its flops alone).
        Measured here (OpenBLAS sgemm, loaded 2-core EPYC, min of 300): x (1, 1024) times three
        1024x1024 weights 0.47-0.63 ms, one product of their concatenation with the copy
        1.4-1.7 ms; x (2048, 256) times three 256x256 weights 10.8-22.9 ms, merged 10.3-21.1 ms.
        On a calibrated machine the measured time of a product already includes reading and
        writing its arrays: the pass is not added again (it put a 1024^3 product 1 ms above its
        measured 41 ms; the 16 programs of benchmarks/egraph_value.py extract the same either way)."""
        if self.machine.matmul_grid:
            return self.dot_seconds(m, k, n)
        traffic = sum(
            b for b in (m * k * itemsize, k * n * itemsize, m * n * itemsize) if b > CACHE_BYTES
        )
        return self.dot_seconds(m, k, n) + traffic / self.machine.bandwidth

    def streamed_seconds(self, batch: int, types) -> float:
        """What a batched product's operands and result cost beyond its flops where one
        entry's share does not fit in a core's cache: their bytes at the machine's
        `blas_stream` rate (0, or a calibrated machine whose measured products include it:
        nothing). Plain attention's products write and read seq x seq scores; without this
        they were priced at their flops alone and lost to the fused kernel only by its fixed
        costs (see machine.BLAS_STREAM)."""
        mc = self.machine
        if not mc.blas_stream or mc.matmul_grid:
            return 0.0
        moved = sum(
            x.size * x.dtype.itemsize
            for x in types
            if x.size * x.dtype.itemsize > CACHE_BYTES * max(batch, 1)
        )
        return moved / mc.blas_stream

    def elementwise_seconds(self, op: str, t: TensorType) -> float:
        mc = self.machine
        n = t.size
        return (
            mc.node_overhead
            + n * flops_per_element(op, mc) / mc.flop_rate
            + mc.fused_fraction * (n * t.dtype.itemsize / mc.bandwidth + mc.launch)
        )

    def kernel_seconds(self, elements_in: int, t_out: TensorType, copies: int = 1) -> float:
        mc = self.machine
        return (
            mc.node_overhead
            + mc.launch
            + elements_in / (mc.reduce_rate or mc.flop_rate)
            + copies * t_out.size * t_out.dtype.itemsize / mc.bandwidth
        )

    def index_seconds(self, op: str, t: TensorType, child) -> float:
        """A gather (`Take`) or scatter (`ScatterAdd`): the bytes it moves (a gather reads as
        many rows as it writes, a scatter all of g) on the measured grid of that step kind, or a
        launch plus INDEX_PASSES passes over them at the machine's bandwidth."""
        src, ids = child(0), child(1)
        if src is None or ids is None:
            return INF
        out = t.size * t.dtype.itemsize
        read = out if op == "Take" else src.size * src.dtype.itemsize
        moved = read + ids.size * ids.dtype.itemsize + out
        mc = self.machine
        grid = mc.step_grids.get("take" if op == "Take" else "scatterAdd")
        if grid:
            return mc.node_overhead + interpolate(grid, max(moved, 1.0))
        return mc.node_overhead + mc.launch + INDEX_PASSES[op] * moved / mc.bandwidth

    # ------------------------------------------------------------ the cost model
    def node_cost(self, graph, node_id: str) -> float:
        cost = self.step_cost(graph, node_id)
        if cost == 0.0 or cost == INF:
            return cost
        index = graph.node_index.get(node_id)  # None: a raw node extraction pruned (a report's)
        if index is None:
            return cost
        trips = self.computed_once(graph).get(graph.node_class[index], 1)
        return cost / trips

    def computed_once(self, graph) -> dict[int, int]:
        """Class index -> n, for the classes under a (Once s n v) or (StepOf s n v): computed
        once before a loop of n steps (rules/loops.egg), so a step of that loop pays 1/n of
        them. A class under two loops takes the shorter's n."""
        if self._once is not None and self._once[0] == id(graph):
            return self._once[1]
        out: dict[int, int] = {}
        raw, ids = graph.raw_nodes, graph.node_ids
        stack: list[tuple[int, int]] = []
        for i, op in enumerate(graph.ops):
            if op in LOOP_MOTION:
                kids = raw[ids[i]]["children"]
                trips = max(1, int(raw[kids[1]]["op"]))
                stack.append((graph.children[i][2], trips))
        while stack:
            c, trips = stack.pop()
            if out.get(c, trips + 1) <= trips:
                continue
            out[c] = trips
            for n in graph.class_nodes[c]:
                stack.extend((k, trips) for k in graph.children[n])
        self._once = (id(graph), out)
        return out

    def step_row_seconds(self, row: TensorType | None) -> float:
        """A loop step's share of a value stacked over its steps, read a row a step: the row's
        traffic, and on cpu the fresh pages the stacked value fills each call (it is a new
        array of n rows: ir-level buffers over a cache's size are not reused across calls)."""
        if row is None:
            return INF
        nbytes = row.size * row.dtype.itemsize
        fresh = FRESH_PAGE_SECONDS / 4096 if self.machine.name != "gpu" else 0.0
        return self.machine.node_overhead + nbytes * (2 / self.machine.bandwidth + fresh)

    def step_cost(self, graph, node_id: str) -> float:
        """The cost of one e-node where it runs (node_cost: at 1/n of it where a loop of n
        steps computes it once)."""
        node = graph.raw_nodes[node_id]
        op = node["op"]
        cls = node["eclass"]
        if graph.class_data.get(cls, {}).get("type") != "Term":
            # primitives (numbers, strings, vectors) are free; analysis rows are not terms
            return 0.0 if node_id.startswith("primitive") else INF
        if op in LEAVES:
            return 0.0
        if op == "StepOf":
            return self.step_row_seconds(self.types.get(cls))
        if op in LOOP_MOTION:  # the body reads it in place
            return self.machine.node_overhead
        kids = node["children"]
        child = (lambda i: self.types.get(graph.raw_nodes[kids[i]]["eclass"])) if kids else None
        only = EGRAPH_ONLY.get(op)
        flags = (
            _read_flags(only, [graph.raw_nodes[k]["op"] for k in kids[only.terms :]])
            if only is not None and only.reads is not None  # Gemm's transpose flags
            else (graph.raw_nodes[kids[5]]["op"] == "1", False)  # causal
            if op == "Attention"
            else (graph.raw_nodes[kids[7]]["op"] == "1", False)
            if op == "AttentionBackward"
            else (False, False)
        )
        if op == "Concatenate" and self.types.get(cls) is not None:
            return self.concat_seconds(graph, node_id, self.types[cls])
        perm = _vec(graph, kids[1]) if op == "Transpose" else None
        return self.term_cost(op, self.types.get(cls), child, flags, perm)

    def concat_seconds(self, graph, node_id: str, t: TensorType) -> float:
        """A concatenation e-node: `concatenation_seconds`, its first part nested when that
        part's class holds a concatenation along the same axis."""
        node = graph.node_index[node_id]
        kids = graph.children[node]
        axis = _axis(graph, kids[2])
        if (
            concat_place.PRICED_FREE
            and self.machine.name == "cpu"
            and axis.isdigit()
            and in_place_parts(graph, node, t.shape, int(axis))
        ):
            return self.machine.node_overhead  # written in place: planning/concat_in_place.py
        nested = any(
            graph.ops[m] == "Concatenate" and _axis(graph, graph.children[m][2]) == axis
            for m in graph.class_nodes[kids[0]]
        )
        return self.concatenation_seconds(
            t, self.types.get(graph.class_ids[kids[0]]) if nested else None
        )

    def concatenation_seconds(self, t: TensorType, nested: TensorType | None = None) -> float:
        """A concatenation copies its parts, except a first part `nested` that is itself a
        concatenation along the same axis: the planner has the outer one copy that part's parts
        (planner.py, spliced_concats), so [[A|B]|C] is one copy of A, B and C (one launch, the
        inner's). Only the left nesting, which the merge rules build: [A|[B|C]] (concat-assoc)
        is priced dearer, so that a three-way merge reuses the two-way merge's [A|B]."""
        mc = self.machine
        copied, launch = t.size * t.dtype.itemsize, mc.launch
        if nested is not None:
            copied, launch = copied - nested.size * nested.dtype.itemsize, 0.0
        return mc.node_overhead + launch + 2 * copied / mc.bandwidth

    def term_cost(
        self, op: str, t: TensorType | None, child, flags=(False, False), perm=None
    ) -> float:
        """The cost of constructor `op` with result type t; child(i) is operand i's type (or
        None where unknown); flags: Gemm's transpose flags, Attention's causal first; perm: a
        Transpose's permutation."""
        if op in LEAVES:
            return 0.0
        if t is None:
            return INF  # an ill-typed class: never extract it
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
            return self.machine.node_overhead + self.gemm_seconds(m, k, n, t.dtype.itemsize)
        if op == "BatchMatmul":  # one small product per batch index
            a, b = child(0), child(1)
            if a is None or b is None:
                return INF
            batch = math.prod(t.shape[:-2])
            return (
                self.machine.node_overhead
                + self.dot_seconds(batch * a.shape[-2], a.shape[-1], b.shape[-1])
                + batch_entries_seconds(batch, a.shape[-2], a.shape[-1], b.shape[-1])
                + self.streamed_seconds(batch, (a, b, t))
            )
        if op == "Slice":  # read in place (planning/planner.py: an alias, strided reads)
            return self.machine.node_overhead
        kind = _EGG_KIND.get(op)
        if kind in ELEMENTWISE_KINDS or op == "DataTypeCast":
            return self.elementwise_seconds(op, t)
        if op == "Reduce":
            src = child(0)
            return INF if src is None else self.kernel_seconds(src.size, t)
        if op == "Transpose" and perm and perm[-1] == len(perm) - 1:
            # issue 36: the innermost axis kept, a strided view every kernel and batched product
            # reads in place (codegen/planning/views.py): priced like a map fused into its
            # reader; moving the innermost axis makes its readers' rows strided, priced a copy
            return self.elementwise_seconds(op, t)
        if op in INDEX_PASSES:
            return self.index_seconds(op, t, child)
        if op in (
            "Transpose",
            "Concatenate",
            "StridedSlice",
            "SliceScatter",
            "Cumsum",
        ):
            return self.kernel_seconds(0, t, copies=2)
        if kind == WINDOW:
            return window_seconds(self, op, t, child)
        if op == "Attention":  # issue 33: the fused kernel (attention_cost.py)
            return attention_seconds(self, t, child, causal=flags[0])
        if op == "AttentionBackward":  # the fused backward, a third each (attention_cost.py)
            return attention_backward_seconds(self, t, child, causal=flags[0])
        return INF  # helper constructors (Adjoint, ...) are not programs


def _vec(graph, node_id: str) -> tuple[int, ...] | None:
    """The (vec-of ...) a primitive child holds, None where it is not one."""
    node = graph.raw_nodes.get(node_id)
    if node is None or node["op"] != "vec-of":
        return None
    try:
        return tuple(int(graph.raw_nodes[c]["op"]) for c in node["children"])
    except (KeyError, ValueError):
        return None


def _axis(graph, cls: int) -> str:
    """The primitive an i64 class holds (a concatenation's axis), as egglog writes it."""
    nodes = graph.class_nodes[cls]
    return graph.ops[nodes[0]] if nodes else ""
