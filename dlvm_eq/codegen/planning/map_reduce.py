"""Multi-output fusion of maps with reductions: a map kernel and the reductions over its
iteration space that read its outputs or its inputs become one pass (MapReduceStep,
kernels.map_reduce.MapReduceSpec), whatever axes they reduce: a conv's bias gradient (sum over
N, H, W) with the ReLU-adjoint select it sums; batch norm's two moments over N, H, W.

A mixin of the planner (planner._Planner), run on the CPU after row and epilogue fusion. Which
reductions may share a pass is the fusion stage's decision (egraph/fusion_decision.py prices
each one with its map group by bytes moved: `FusionDecision.shared_pass`); here they are
fused where that is possible:
- the reduction's iteration shape is the map's shape, it starts from its op's identity, and it
  reads the map's outputs element for element (at another order it needs them whole first);
- nothing in the map reads a reduction of the same pass, and no input of the fused kernel
  depends, through other steps, on one of its outputs (a cycle);
- each reduction folds its own axes; a reduction with no such map shares a pass with another
  over the same space that reads one of its inputs.

    nodes = self.fuse_map_reductions(nodes)   # some map + reduction nodes -> MapReduceStep nodes

It also answers for row fusion (rowfusion.py) whether a row kernel may recompute the per-row
values between its reductions that other kernels read (`copies_per_row_maps`: where the fusion
stage priced the row pass, `FusionDecision.row_pass`, and rows are not short), which puts a
layer norm's two moments in one row pass; and it writes the report's list of shared passes
(`note_passes`: each kernel, its reductions, its map outputs, the model's saving).
"""

from __future__ import annotations

from ..kernels.map_reduce import MapReduceSpec
from ..kernels.rows import loads, rebuild
from ..kernels.spec import REDUCE_INIT, op_name
from .plan import KernelStep, MapReduceStep, RowStep
from .rowfusion import short_op
from .steps_order import Node, reached
from .values import ReduceNode
from .views import is_contiguous

# A row pass that recomputes per-row values pays from rows of this many elements: a post-norm
# layer norm's value and gradient, one pass against the moments in kernels of their own, one
# thread, load 16-17 (2-core Xeon): 256 columns 1.22x, 64 columns 1.06x, 32 columns 0.82x,
# 16 columns 0.90x (short rows: the separate kernels vectorize across rows, a row loop cannot).
ROW_PASS_MIN_COLS = 64


def _identity_init(r: ReduceNode) -> bool:
    op = op_name(r.op)
    return float(r.init) == float(REDUCE_INIT[op]) or r.init == REDUCE_INIT[op]


class MapReduceFusion:
    """Needs the planner's `decision`, `fusion` (its report), `leaves`, `group_exprs`, `_inputs`, `_localize`,
    `_kernel_name` and `_pos` (kernel_groups.KernelGrouping)."""

    def fuse_map_reductions(self, nodes: list[Node]) -> list[Node]:
        """Each reduction the fusion stage chose (those reading a map's outputs first, each in
        program order) joins the first pass it can: one it already shares, the map whose outputs it reads, a map or a reduction of
        its space that reads one of its inputs. One merge at a time, each checked against
        the nodes as they are then, so that no merge closes a cycle."""
        shared = getattr(self.decision, "shared_pass", None) or {}
        reds = [
            n
            for n in nodes
            if isinstance(n.source, ReduceNode)
            and n.source.names & set(shared)
            and _identity_init(n.source)
        ]
        clusters: dict[int, dict] = {}  # id(fused node) -> {"map": Node | None, "reds": [Node]}
        maps = {o for n in nodes if isinstance(n.source, list) for o in n.outputs}
        # first those that read a map's outputs (they save its write-then-read), then the rest
        for rn in sorted(reds, key=lambda n: (not (set(n.inputs) & maps), n.order)):
            if not any(n is rn for n in nodes):
                continue  # taken into an earlier pass
            for target in self._targets(rn, nodes, clusters, reds):
                c = clusters.get(id(target))
                if c is None:
                    mapped = isinstance(target.source, list)
                    c = {"map": target if mapped else None, "reds": [] if mapped else [target]}
                if not self._can_join(rn, c, target, nodes):
                    continue
                c = {"map": c["map"], "reds": c["reds"] + [rn]}
                new = self._pass_node(c)
                nodes = [n for n in nodes if n is not target and n is not rn] + [new]
                clusters.pop(id(target), None)
                clusters[id(new)] = c
                break
        self.pass_saving = {}  # id(MapReduceStep) -> model seconds its pass saves
        for node_id, c in clusters.items():
            step = next(n.payload for n in nodes if id(n) == node_id)
            self.pass_saving[id(step)] = sum(
                max((shared[n] for n in r.source.names if n in shared), default=0.0)
                for r in c["reds"]
            )
        if self.fusion is not None:  # the report: the passes the plan holds, and their saving
            self.fusion.shared = sum(len(c["reds"]) for c in clusters.values())
            self.fusion.shared_saving = sum(self.pass_saving.values())
        return nodes

    def note_passes(self, steps: list) -> None:
        """The report's list of the kernels whose reductions share a pass (a map-reduce pass,
        or a row pass holding a reduction the fusion stage priced in one pass with its rows'),
        each with its reductions, its map outputs and the model's saving; `steps` are the
        plan's steps with their final kernel names."""
        if self.fusion is None:
            return
        from ...units import seconds_text

        row = getattr(self.decision, "row_pass", None) or {}
        lines, n_row, row_saving = [], 0, 0.0
        for step in steps:
            if isinstance(step, MapReduceStep):
                at = len(step.outputs)
                names = step.values[at : at + len(step.reductions)]
                saving = getattr(self, "pass_saving", {}).get(id(step), 0.0)
            elif isinstance(step, RowStep):
                names = step.values[: len(step.reductions)]
                saving = sum(row[v] for v in set(step.values) if v in row)
                if not saving or len(names) + len(step.outputs) < 2:
                    continue
                n_row += len(names)
                row_saving += saving
            else:
                continue
            ops = [short_op(op) for _, op, *_ in step.spec.reductions]
            lines.append(
                f"{step.name}: "
                + ", ".join(f"{op} %{v}" for op, v in zip(ops, names))
                + f" with {len(step.outputs)} map output{'s' * (len(step.outputs) != 1)}, "
                f"saving {seconds_text(saving)} (model)"
            )
        self.fusion.passes = lines
        self.fusion.row_shared, self.fusion.row_shared_saving = n_row, row_saving

    def copies_per_row_maps(self, reds, rows: int, cols: int) -> bool:
        """Whether a row kernel over `rows` x `cols` holding the reduction nodes `reds` may
        recompute the per-row maps between them that other kernels read, those maps keeping
        their own (per-row sized) kernels for those readers (rowfusion.RowFusion.row_node):
        where the fusion stage priced every one of them cheaper in one row pass
        (`FusionDecision.row_pass`), and the rows are not short (ROW_PASS_MIN_COLS, measured).
        On the gpu target the decision prices no row pass (its row kernels are one thread per
        row of at most GPU_ROW_COLS: fusion_rows is False there), so nothing is copied."""
        priced = getattr(self.decision, "row_pass", None) or {}
        if not priced or not reds:
            return False
        if cols < ROW_PASS_MIN_COLS:
            return False
        return all(n.source.names & priced.keys() for n in reds)

    def _targets(self, rn: Node, nodes: list[Node], clusters: dict, reds: list[Node]):
        """The nodes the reduction may share a pass with, best first."""
        r = rn.source
        mine = set(rn.inputs)

        def space(n: Node) -> bool:
            if id(n) in clusters:
                step = n.payload
                return step.spec.shape == tuple(r.shape)
            if isinstance(n.source, list) and isinstance(n.payload, KernelStep):
                return tuple(n.source[0].shape) == tuple(r.shape)
            if isinstance(n.source, ReduceNode) and any(n is x for x in reds):
                s = n.source
                return s.shape == r.shape
            return False

        near = [n for n in nodes if n is not rn and space(n)]
        near.sort(key=lambda n: (not (mine & set(n.outputs)), id(n) not in clusters, n.order))
        return [n for n in near if mine & (set(n.outputs) | set(n.inputs))]

    def _can_join(self, rn: Node, c: dict, target: Node, nodes: list[Node]) -> bool:
        r = rn.source
        mapped = set(c["map"].outputs) if c["map"] is not None else set()
        # the map's outputs are read element for element, else they are needed whole first
        for ld in loads(r.body):
            slot, st = self.leaves[ld.index]
            if slot in mapped and not is_contiguous(r.shape, st):
                return False
        red_outs = {o for m in c["reds"] for o in m.outputs}
        if set(rn.inputs) & red_outs or set(target.inputs) & set(rn.outputs):
            return False  # a reduction feeding the map (or a reduction) of its own pass
        outs = set(target.outputs) | set(rn.outputs)
        ins = (set(target.inputs) | set(rn.inputs)) - outs
        return not reached(ins, outs, nodes, [target, rn])

    def _pass_node(self, c: dict) -> Node:
        shape = tuple(c["reds"][0].source.shape)
        members = c["map"].source if c["map"] is not None else []
        outs = self.group_exprs(members) if members else []
        by_slot = {m.slot: e for m, e in zip(members, outs)}
        rnodes = [n.source for n in c["reds"]]
        bodies = []
        for r in rnodes:  # the map's outputs it reads: from registers
            repl = {}
            for ld in loads(r.body):
                slot, st = self.leaves[ld.index]
                if slot in by_slot and is_contiguous(shape, st):
                    repl[ld] = by_slot[slot]
            bodies.append(rebuild(r.body, repl) if repl else r.body)
        (slots, kinputs), local = self._inputs(outs + bodies, shape)
        names = tuple(m.name for m in members) + tuple(r.name for r in rnodes)
        fused = set().union(*(m.names for m in members), *(r.names for r in rnodes)) - set(names)
        values = names + tuple(sorted(fused, key=self._pos))
        label = "_".join(dict.fromkeys(short_op(r.op) for r in rnodes))
        label += "_" + self._kernel_name(
            sorted(set(values) - {r.name for r in rnodes}, key=self._pos), 2
        )
        spec = MapReduceSpec(
            label,
            shape,
            kinputs,
            [self._localize(e, local) for e in outs],
            [(self._localize(b, local), r.op, r.axes) for b, r in zip(bodies, rnodes)],
        )
        order = min([r.order for r in rnodes] + [m.order for m in members])
        step = MapReduceStep(
            spec,
            tuple(slots),
            tuple(m.slot for m in members),
            tuple(r.slot for r in rnodes),
            values,
            order,
        )
        new = Node(set(slots), list(step.outputs + step.reductions), order, step)
        new.source = step
        return new


__all__ = ["MapReduceFusion"]
