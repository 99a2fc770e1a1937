"""Row fusion: a map and the reductions over trailing axes that it reads (and the small per-row
maps between them) become one row kernel (kernels.rows.RowSpec): softmax, log-softmax, layer norm.

A mixin of the planner (planner._Planner): it works on the planner's nodes after grouping.
A per-row map that other kernels read too is recomputed in the row kernel (and keeps its own
kernel) where map_reduce.MapReduceFusion.copies_per_row_maps allows it, else it is not fused.

    nodes = self.fuse_rows(nodes)     # some map + reduction nodes replaced by RowStep nodes
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels.kernel_spec import KernelInput, c_strides
from ..kernels.rows import RowSpec, loads, rebuild
from ..kernels.spec import Expr, Load
from .plan import CONST, RowStep
from .steps_order import Node, reached
from .views import NoView, broadcast_strides, reshape_strides

# a constant broadcast at plan time for a row kernel holds at most this many bytes
ROW_CONSTANT_BYTES = 1 << 20
# Per-row values on the reduced shape join a row kernel only for long rows or large row spaces:
# softmax cross-entropy's value and gradient in one row kernel against four kernels, one thread
# (2-core EPYC, load 8): (16, 32, 64) 0.95x, (256, 64, 64) 1.05x, (4, 8, 1024) 1.13x,
# (16, 32, 1024) 1.15x, (32, 128, 512) 1.12x. Short rows in cache: the separate kernels win.
ROW_VALUE_MIN_COLS = 256
ROW_VALUE_MIN_ELEMENTS = 1 << 20


def short_op(op: str) -> str:
    """Reduction names in kernel names: add -> sum, multiply -> prod."""
    return {"add": "sum", "multiply": "prod"}.get(op, op)


class RowFusion:
    def fuse_rows(self, nodes: list[Node]) -> list[Node]:
        """Fuse each map with the reductions over trailing axes it reads (and the small
        per-row maps between them) into one row kernel, largest maps first."""
        maps = sorted(
            (n for n in nodes if isinstance(n.source, list)),
            key=lambda n: -math.prod(n.source[0].shape),
        )
        for node in maps:
            if not any(n is node for n in nodes):
                continue
            fused = self.row_node(node, nodes)
            if fused is not None:
                new, gone = fused
                nodes = [n for n in nodes if not any(n is g for g in gone)] + [new]
        return nodes

    def row_node(self, node: Node, nodes: list[Node]):
        members = node.source
        shape = members[0].shape
        size = math.prod(shape)
        exprs = self.group_exprs(members)
        producer = {o: n for n in nodes for o in n.outputs}
        readers: dict[int, list[Node]] = {}
        for n in nodes:
            for i in n.inputs:
                readers.setdefault(i, []).append(n)
        results = {r.slot for r in self.results_views}
        # 1. candidates: reductions over `shape` along trailing axes, and smaller maps
        #    (per-row values) between them and this map
        reds: dict[int, Node] = {}
        rowmaps: dict[int, Node] = {}  # output slot -> node
        axes = None
        todo = list(exprs)
        seen: set[int] = set()
        walked: set = set()  # expression nodes: a load seen once has its slot in `seen`
        while todo:
            for ld in loads(todo.pop(), walked):
                slot = self.leaves[ld.index][0]
                if slot in seen:
                    continue
                seen.add(slot)
                n = producer.get(slot)
                if n is None or n is node:
                    continue
                if hasattr(n.source, "axes"):  # a reduction (planning.values.ReduceNode)
                    r = n.source
                    t = min(r.axes) if r.axes else len(shape)
                    if (
                        r.shape != shape
                        or r.axes != tuple(range(t, len(shape)))
                        or t == 0
                        or (axes is not None and r.axes != axes)
                    ):
                        continue
                    axes = r.axes
                    reds[slot] = n
                    todo.append(r.body)
                elif isinstance(n.source, list) and math.prod(n.source[0].shape) < size:
                    for o in n.outputs:
                        rowmaps[o] = n
                    todo.extend(m.expr for m in n.source)
        if not reds:
            return None
        t = axes[0]
        rows, cols = math.prod(shape[:t]), math.prod(shape[t:])
        if self.row_limit is not None and cols > self.row_limit:
            return None

        def row_shaped(m: Node) -> bool:
            sm = m.source[0].shape
            if tuple(sm) == tuple(shape[:t]):  # on the reduced shape, no kept 1s (log of a sum)
                return cols >= ROW_VALUE_MIN_COLS or rows * cols >= ROW_VALUE_MIN_ELEMENTS
            pad = (1,) * (len(shape) - len(sm)) + tuple(sm) if len(sm) <= len(shape) else None
            return (
                pad is not None
                and all(d == 1 for d in pad[t:])
                and all(a in (1, b) for a, b in zip(pad[:t], shape[:t]))
            )

        keep = {o: m for o, m in rowmaps.items() if row_shaped(m)}
        copied: set[int] = set()  # id() of per-row maps recomputed here and kept for others
        for _ in range(len(reds) + len(keep) + 1):
            # 2. a per-row map that something outside the fused set reads is recomputed in the
            #    row kernel (a value per row, hoisted out of the column loop) and keeps its own
            #    kernel for those readers, where the fusion stage priced the row pass
            #    (copies_per_row_maps); else it is not fused
            while True:
                ids = {id(node)} | {id(n) for n in reds.values()} | {id(m) for m in keep.values()}
                outside = {
                    id(m)
                    for m in keep.values()
                    if any(
                        x in results or any(id(r) not in ids for r in readers.get(x, []))
                        for x in m.outputs
                    )
                }
                copy = outside and self.copies_per_row_maps(reds.values(), rows, cols)
                drop = {i for i in outside if not copy}
                copied = outside - drop
                if not drop:
                    break
                keep = {o: m for o, m in keep.items() if id(m) not in drop}
            if not reds:
                return None
            built = self._row_parts(shape, t, rows, cols, exprs, node, reds, keep, copied)
            if built is None:
                return None
            group, inside, inputs = built[:3]
            # 3. an input computed from a fused value would make a cycle: unfuse what it reads
            bad = reached(set(inputs), inside, nodes, group)
            if not bad:
                break
            if any(b is node for b in bad):
                return None
            reds = {o: n for o, n in reds.items() if not any(n is b for b in bad)}
            keep = {o: m for o, m in keep.items() if not any(m is b for b in bad)}
        else:
            return None
        group, inside, inputs, kinputs, local, virtual, order, outs, bodies = built
        n_in = len(inputs)

        def local_expr(e):
            repl = {}
            for ld in loads(e):
                slot = self.leaves[ld.index][0]
                repl[ld] = Load(n_in + virtual[slot]) if slot in virtual else Load(local[ld.index])
            return rebuild(e, repl)

        rnodes = [n.source for n in order]
        names = tuple(r.name for r in rnodes) + tuple(m.name for m in members)
        fused_names = set().union(
            *(m.names for m in members),
            *(r.names for r in rnodes),
            *(mem.names for m in keep.values() if id(m) not in copied for mem in m.source),
        ) - set(names)
        all_names = names + tuple(sorted(fused_names, key=self._pos))
        label = (
            "_".join(dict.fromkeys(short_op(r.op) for r in rnodes))
            + "_"
            + self._kernel_name(sorted(set(all_names) - {r.name for r in rnodes}, key=self._pos), 2)
        )
        spec = RowSpec(
            label,
            rows,
            cols,
            kinputs,
            [(local_expr(b), r.op, r.init) for b, r in zip(bodies, rnodes)],
            [local_expr(e) for e in outs],
        )
        step = RowStep(
            spec,
            tuple(inputs),
            tuple(m.slot for m in members),
            tuple(r.slot for r in rnodes),
            all_names,
            min([node.order] + [r.order for r in rnodes]),
        )
        new = Node(set(inputs), list(step.outputs + step.reductions), step.order, step)
        new.source = step
        return new, group

    def row_constant(self, slot: int, shape, st) -> int | None:
        """A constant read through strides that do not flatten to (rows, cols) (a causal mask
        (T, T) broadcast over the batch of (B, T, T) scores), broadcast at plan time into a
        constant of `shape`, or None (not a constant, larger than ROW_CONSTANT_BYTES). Without
        it the mask kept the softmax's max, sum and map in three passes over the scores."""
        value = self.constants.get(slot)
        if value is None or min(st, default=0) < 0:
            return None
        if math.prod(shape) * value.itemsize > ROW_CONSTANT_BYTES:
            return None
        key = (slot, tuple(shape), tuple(st))
        made = self.row_constants.get(key)
        if made is None:
            info = self.slots[slot]
            wide = np.lib.stride_tricks.as_strided(
                value.reshape(-1), tuple(shape), tuple(s * value.itemsize for s in st)
            )
            made = self.new_slot(tuple(shape), info.dtype, CONST, info.name)
            self.constants[made] = np.ascontiguousarray(wide)
            self.row_constants[key] = made
        return made

    def _row_parts(self, shape, t, rows, cols, exprs, node, reds, keep, copied=frozenset()):
        """Expressions and inputs of a row kernel fusing `node` with the reductions `reds`
        and the per-row maps `keep` (those in `copied` recomputed, their kernels kept); None
        when some read cannot be expressed."""
        row_exprs = {}
        for m in {id(m): m for m in keep.values()}.values():
            for mem, e in zip(m.source, self.group_exprs(m.source)):
                row_exprs[mem.slot] = (e, m.source[0].shape)
        group = (
            [node]
            + list({id(n): n for n in reds.values()}.values())
            + list({id(m): m for m in keep.values() if id(m) not in copied}.values())
        )
        inside = {o for n in group for o in n.outputs}
        order = sorted({id(n): n for n in reds.values()}.values(), key=lambda n: n.source.order)
        virtual = {n.source.slot: k for k, n in enumerate(order)}

        def expand(e: Expr, at_shape):
            # per-row values substituted: LLVM hoists them out of the column loop
            for _ in range(len(row_exprs) + 1):
                hit = [ld for ld in loads(e) if self.leaves[ld.index][0] in row_exprs]
                if not hit:
                    return e
                repl = {}
                for ld in hit:
                    slot, st = self.leaves[ld.index]
                    me, ms = row_exprs[slot]
                    fn = _row_value_read(at_shape, t, st, tuple(ms))
                    if fn is None:
                        return None
                    try:
                        repl[ld] = self.reindex(me, fn)
                    except NoView:
                        return None
                e = rebuild(e, repl)
            return None

        bodies = [expand(n.source.body, shape) for n in order]
        outs = [expand(e, shape) for e in exprs]
        if any(x is None for x in bodies + outs):
            return None
        inputs, kinputs, local = [], [], {}
        for e in outs + bodies:
            for ld in loads(e):
                slot, st = self.leaves[ld.index]
                if slot in virtual:
                    if not _row_broadcast(shape, t, st):
                        return None
                    continue
                if ld.index in local:
                    continue
                if slot in inside:
                    return None
                st2 = reshape_strides(shape, st, (rows, cols))
                if st2 is None:
                    slot = self.row_constant(slot, shape, st)
                    if slot is None:
                        return None
                    st2 = (cols, 1)
                info = self.slots[slot]
                plain = st2 == (cols, 1) and math.prod(info.shape) == rows * cols
                local[ld.index] = len(inputs)
                inputs.append(slot)
                kinputs.append(
                    KernelInput(
                        info.dtype,
                        None if plain else (st2[0] if rows > 1 else 0, st2[1] if cols > 1 else 0),
                    )
                )
        return group, inside, inputs, kinputs, local, virtual, order, outs, bodies


def _row_value_read(shape, t: int, st, ms: tuple):
    """How a per-row value of shape `ms` read at strides `st` over `shape` maps its own
    strides onto `shape`, or None: either as a numpy broadcast (`ms` with kept 1s,
    right-aligned), or, where `ms` is the reduced shape shape[:t] itself, along the leading
    axes (the trailing ones broadcast)."""
    if ms == tuple(shape[:t]) and len(ms) < len(shape):
        pad = (0,) * (len(shape) - len(ms))
        if _same_read(shape, st, c_strides(ms) + pad):
            return lambda s2: tuple(s2) + pad
    if len(ms) <= len(shape) and _same_read(shape, st, broadcast_strides(c_strides(ms), ms, shape)):
        return lambda s2: broadcast_strides(s2, ms, shape)
    return None


def _same_read(shape, st, want) -> bool:
    """Two strides tuples that read the same elements of `shape` (size-1 dims ignored)."""
    return all(d == 1 or a == b for d, a, b in zip(shape, st, want))


def _row_broadcast(shape, t: int, st) -> bool:
    """Strides of a (rows,) vector read along the trailing axes t.. of `shape`."""
    want = c_strides(tuple(shape[:t])) + (0,) * (len(shape) - t)
    return all(d == 1 or s == w for d, s, w in zip(shape, st, want))
