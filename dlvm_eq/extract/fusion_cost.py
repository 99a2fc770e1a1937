"""Fusion extraction: which tensors of a fusion e-graph (rules/fusion.egg) are materialized.

In that e-graph an elementwise value's class holds both `(Add a b)` and `(Map s)`, and the
class of `(Load v)` holds `s` itself: every reader may load v from a buffer or recompute s.
Extraction picks the set M of materialized tensors; the cost of M (estimated seconds, from the
machine description) is a sum over kernels, one per materialized tensor (and per forced
buffer: results, BLAS and concatenate operands, reductions):

    kernel(K) = launch + bytes written by K / bandwidth
              + sum over the scalar classes its body evaluates: flops x |K| / flop rate
              + sum over the buffers it loads: bytes read (a broadcast read: the buffer once) / bandwidth

Maps over one iteration space are one multi-output kernel (as the planner groups them): one
launch. Inside one kernel a scalar class is evaluated once (LLVM's CSE), across kernels once per
kernel that inlines it; a materialized tensor's own kernel is paid once however many kernels
read it (DAG cost across buffers, tree-like recompute across kernels). At a scalar class a
kernel loads when a buffer is available, else expands the class's cheapest scalar op.

    problem = FusionProblem(graph, kernels, candidates, buffers, machine("cpu"))
    result = greedy_fusion(problem)       # FusionChoice: materialized classes, cost
    exhaustive_fusion(problem).cost       # the optimum, for tests on small graphs

A kernel's body is expanded to at most EXPAND_LIMIT scalar classes per member (beyond, a
tensor counts as written elsewhere and loaded): evaluations stay local in deep programs.

Greedy: candidates from the last consumer to the first producer, each materialized when that
lowers the total given the decisions below it (consumers decide first: they fix which kernels
would recompute a producer), then passes that toggle single candidates while the cost drops.
`work` bounds it in expansion steps (scalar classes visited by the cost evaluations, each O(1),
so work is proportional to time whatever the machine's load; a large program costs far more
than linear time here): past it, the candidates not yet decided stay inlined, a choice as valid
as any (the planner splits long expressions), and `FusionChoice.stopped` says so. The result
depends on the program and `work` only, never on the clock, so it may be cached. `time_limit`
(seconds) is a last-resort cap on top: a choice cut by it is reported as a time cut (not cached).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..cache import note_time_cut
from ..ir.inline import KERNEL_EXPR_OPS
from .extraction_error import ExtractionError
from .graph import SerializedEGraph
from .machine import Machine
from .target_cost import flops_per_element

LOAD = "Load"
# A kernel body expands at most this many scalar classes per member: the planner splits fused
# expressions there too (one constant: ir/inline.py KERNEL_EXPR_OPS), and the bound keeps each
# cost evaluation O(1) in the program's depth, so greedy fusion of a long chain is linear, not
# quadratic. Past it, a tensor is costed as written by another kernel and read here.
EXPAND_LIMIT = KERNEL_EXPR_OPS
VIEW_OPS = frozenset(("SBroadcast", "STranspose", "SShapeCast", "SPadShape", "SSqueezeShape"))


def scalar_flops(op: str, mc: Machine | None = None) -> float:
    """Flops per element of a scalar constructor ("SExp" -> Exp's, as measured on `mc` when it
    was calibrated); views are index maps."""
    if op in VIEW_OPS:
        return 0.0
    return flops_per_element(op[1:], mc)


@dataclass(frozen=True)
class Kernel:
    """A tensor class computed by a kernel: its body (a scalar class), iteration space and
    output bytes. Kernels with the same `group` (maps over one iteration space) run as one
    multi-output kernel: one launch, a scalar class or buffer they share evaluated or read
    once, a member read by another computed in registers (the planner groups them so)."""

    cls: int
    body: int
    space: int
    out_bytes: int
    group: object = None  # None: a kernel of its own
    reduction: bool = False  # its members read its result from registers (row kernels)


@dataclass
class FusionProblem:
    graph: SerializedEGraph
    forced: Sequence[Kernel]  # always kernels (results, BLAS operands, reductions)
    candidates: Sequence[Kernel]  # maps that may be materialized, producers first
    buffers: dict  # tensor class -> (elements, itemsize): always loadable
    machine: Machine
    free: frozenset = frozenset()  # tensor classes read for free (scalar constants)

    def __post_init__(self):
        g = self.graph
        self.cand_of = {k.cls: k for k in self.candidates}
        self.sizes = dict(self.buffers)
        for k in list(self.forced) + list(self.candidates):
            self.sizes.setdefault(k.cls, (k.space, 0))
        for k in self.candidates:  # size and itemsize of a candidate's own buffer
            self.sizes[k.cls] = (k.space, k.out_bytes // max(k.space, 1))
        self.loads: list[tuple[int, ...]] = []  # scalar class -> tensor classes it loads
        self.ops: list[tuple[float, tuple[int, ...]] | None] = []  # cheapest scalar op
        for c, nodes in enumerate(g.class_nodes):
            loads, best = [], None
            for n in nodes:
                op = g.ops[n]
                if op == LOAD:
                    loads.append(g.children[n][0])
                elif op.startswith("S") and op[1:2].isupper():
                    f = scalar_flops(op, self.machine)
                    kids = tuple(k for k in g.children[n] if _is_scalar(g, k))
                    if best is None or f < best[0]:
                        best = (f, kids)
            self.loads.append(tuple(loads))
            self.ops.append(best)


def _is_scalar(g: SerializedEGraph, c: int) -> bool:
    return g.class_data.get(g.class_ids[c], {}).get("type") == "Scalar"


@dataclass
class FusionChoice:
    materialized: frozenset  # candidate classes kept in buffers
    cost: float  # estimated seconds of the chosen kernels
    cost_unfused: float = 0.0  # every candidate materialized (one kernel per op)
    cost_inlined: float = 0.0  # no candidate materialized
    evaluations: int = 0  # kernel cost evaluations
    seconds: float = 0.0
    method: str = "greedy"
    stopped: str = ""  # why the search stopped early ("" when it did not)
    work: int = 0  # expansion steps of the evaluations (what the `work` budget counts)


@dataclass
class _KernelCost:
    cost: float
    expanded: frozenset  # candidates this kernel recomputes (inlines)
    loaded: frozenset  # candidates it loads


class _Evaluator:
    def __init__(self, p: FusionProblem):
        self.p = p
        mc = p.machine
        self.inv_bw, self.inv_flops, self.launch = 1.0 / mc.bandwidth, 1.0 / mc.flop_rate, mc.launch
        self.count = 0
        self.steps = 0  # scalar classes visited, over all evaluations: the work budget's unit

    def kernel(self, members: Sequence[Kernel], mat) -> _KernelCost:
        """The cost of one (multi-output) kernel when the candidates in `mat` are materialized.
        (The hot loop of fusion extraction: attributes are bound to locals.)"""
        self.count += 1
        p = self.p
        loads_of, ops_of, sizes, cand_of = p.loads, p.ops, p.sizes, p.cand_of
        free, buffers = p.free, p.buffers
        n = max(k.space for k in members)
        own = {k.cls for k in members}
        reduced = {k.cls for k in members if k.reduction}
        flops, read = 0.0, 0.0
        seen: set = set()
        loaded_t, expanded, loaded = set(), set(), set()
        stack: list = []
        for k in members:  # member by member: each may expand up to EXPAND_LIMIT classes
            stack.append(None)
            stack.append(k.body)
        depth = 0
        steps = 0
        while stack:
            c = stack.pop()
            steps += 1
            if c is None:
                depth = 0
                continue
            if c in seen:
                continue
            seen.add(c)
            loads = loads_of[c]
            if loads:
                choice = None
                in_register = False  # reads a reduction of this kernel
                for t in loads:
                    if t in reduced:  # a row kernel's own reduction: in a register
                        in_register = True
                        break
                    if t in own:
                        continue
                    if t in free or t in buffers or t in mat:
                        choice = t
                        break
                if choice is None and depth >= EXPAND_LIMIT:
                    # a view (a Broadcast of a scalar) has no size here: not a split, expand on
                    horizon = next(
                        (t for t in loads if t not in own and t not in reduced and t in sizes),
                        None,
                    )
                    if horizon is not None:  # the planner splits here: written once, read here
                        elems, itemsize = sizes[horizon]
                        read += 2 * min(elems, n) * itemsize
                        continue
                if in_register:
                    continue
                if choice is not None:
                    if choice not in loaded_t and choice not in free:
                        loaded_t.add(choice)
                        elems, itemsize = sizes[choice]
                        read += min(elems, n) * itemsize
                        if choice in cand_of:
                            loaded.add(choice)
                    continue
                for t in loads:
                    if t in cand_of and t not in own:
                        expanded.add(t)
            op = ops_of[c]
            if op is None:
                raise ExtractionError(
                    f"scalar e-class {p.graph.class_ids[c]!r} has no buffer to load "
                    "and no scalar op (fusion rules not saturated?)"
                )
            flops += op[0]
            depth += 1
            stack.extend(op[1])
        self.steps += steps
        out = sum(k.out_bytes for k in members)
        cost = self.launch + (out + read) * self.inv_bw + flops * n * self.inv_flops
        return _KernelCost(cost, frozenset(expanded), frozenset(loaded))

    def groups(self, mat) -> dict:
        out: dict = {}
        for k in list(self.p.forced) + [k for k in self.p.candidates if k.cls in mat]:
            out.setdefault(_key(k), []).append(k)
        return out

    def total(self, mat) -> float:
        return sum(self.kernel(ms, mat).cost for ms in self.groups(mat).values())


def _key(k: Kernel):
    return ("k", k.cls) if k.group is None else ("g", k.group)


def greedy_fusion(
    p: FusionProblem,
    passes: int = 3,
    time_limit: float | None = None,
    work: int | None = None,
) -> FusionChoice:
    """Materialized candidates by a backward greedy pass and toggle passes (see the module),
    within `work` expansion steps (None: no limit) and, as a last resort, `time_limit` seconds
    (None: no limit; a cut by time is noted with cache.note_time_cut, a cut by work is not:
    it gives the same choice on any machine under any load)."""
    t0 = time.perf_counter()
    deadline = math.inf if time_limit is None else t0 + time_limit
    ev = _Evaluator(p)
    mat: set[int] = set()
    groups = ev.groups(mat)
    state: dict = {g: ev.kernel(ms, mat) for g, ms in groups.items()}

    def out_of_budget() -> str:
        """Which budget is spent ("work", "time") or ""."""
        if work is not None and ev.steps > work:
            return "work"
        if time.perf_counter() > deadline:
            return "time"
        return ""

    def why(spent: str) -> str:
        if spent == "work":
            return f"work budget ({work:,} expansion steps) reached"
        return f"time limit ({time_limit:.2g} s) reached"

    def reads(c: int) -> bool:
        return any(c in s.expanded for s in state.values())

    def delta(c: int, add: bool):
        """(cost change, new groups, new states) of materializing (add) or inlining c."""
        new = set(mat)
        if add:
            new.add(c)
        else:
            new.discard(c)
        k = p.cand_of[c]
        gk = _key(k)
        members = dict(groups)
        ms = [m for m in members.get(gk, []) if m.cls != c] + ([k] if add else [])
        if ms:
            members[gk] = ms
        else:
            members.pop(gk, None)
        touched = {g for g, s in state.items() if c in s.expanded or c in s.loaded} | {gk}
        changes, d = {}, 0.0
        for g in touched:
            old = state[g].cost if g in state else 0.0
            if g in members:
                changes[g] = ev.kernel(members[g], new)
                d += changes[g].cost - old
            else:
                changes[g] = None
                d -= old
        return d, members, changes

    # Materializing c was priced (and rejected) against the decisions as they stood at
    # version rejected[c]; while no decision changes, pricing it again gives the same delta (a
    # pure function of the decisions): the improvement passes skip it (half of a long chain's
    # evaluations, where nothing is materialized).
    version = 0
    rejected: dict[int, int] = {}

    def apply(c: int, add: bool, members, changes):
        nonlocal groups, version
        version += 1
        if add:
            mat.add(c)
        else:
            mat.discard(c)
        groups = members
        for g, s in changes.items():
            if s is None:
                state.pop(g, None)
            else:
                state[g] = s

    cost_inlined = sum(s.cost for s in state.values())
    stopped, spent = "", ""
    for i, k in enumerate(reversed(p.candidates)):
        spent = out_of_budget()
        if spent:
            stopped = f"{why(spent)} after {i} of {len(p.candidates)} candidates: the rest inlined"
            break
        if not reads(k.cls):
            continue  # no kernel recomputes it: nothing to decide
        d, members, changes = delta(k.cls, True)
        if d < 0:
            apply(k.cls, True, members, changes)
        else:
            rejected[k.cls] = version
    for n in range(passes if not stopped else 0):
        improved = False
        for k in reversed(p.candidates):
            spent = out_of_budget()
            if spent:
                stopped = f"{why(spent)} in improvement pass {n + 1}"
                break
            add = k.cls not in mat
            if add and (rejected.get(k.cls) == version or not reads(k.cls)):
                continue
            d, members, changes = delta(k.cls, add)
            if d < -1e-15:
                apply(k.cls, add, members, changes)
                improved = True
            elif add:
                rejected[k.cls] = version
        if not improved or stopped:
            break
    if spent == "time":  # depends on this moment's load: not to be cached
        note_time_cut("fusion: " + stopped)
    cost = sum(s.cost for s in state.values())
    steps = ev.steps
    return FusionChoice(
        frozenset(mat),
        cost,
        ev.total({k.cls for k in p.candidates}),
        cost_inlined,
        ev.count,
        time.perf_counter() - t0,
        stopped=stopped,
        work=steps,
    )


def exhaustive_fusion(p: FusionProblem, limit: int = 16) -> FusionChoice:
    """The optimum over every subset of the candidates (at most `limit` of them): for tests."""
    t0 = time.perf_counter()
    cands = [k.cls for k in p.candidates]
    if len(cands) > limit:
        raise ExtractionError(
            f"{len(cands)} candidates: too many for exhaustive search (limit {limit})"
        )
    ev = _Evaluator(p)
    best, best_set = float("inf"), frozenset()
    for r in range(len(cands) + 1):
        for subset in itertools.combinations(cands, r):
            c = ev.total(set(subset))
            if c < best - 1e-15:
                best, best_set = c, frozenset(subset)
    return FusionChoice(
        best_set,
        best,
        ev.total(set(cands)),
        ev.total(set()),
        ev.count,
        time.perf_counter() - t0,
        "exhaustive",
    )


def shared_pass_saving(p: FusionProblem, materialized, k: Kernel) -> float:
    """Model seconds saved by running the forced kernel `k` (a reduction) inside its group, one
    pass with the maps of its space, rather than as a kernel of its own, given the
    `materialized` candidates: the launch and the bytes the two kernels would both move."""
    ev = _Evaluator(p)
    mat = set(materialized)
    members = ev.groups(mat).get(_key(k), [])
    others = [m for m in members if m.cls != k.cls]
    if k.group is None or not others:
        return 0.0
    together = ev.kernel(members, mat).cost
    alone = dataclasses.replace(k, group=None)
    return ev.kernel(others, mat).cost + ev.kernel([alone], mat).cost - together


def fusion_cost(p: FusionProblem, materialized) -> float:
    """The cost of materializing exactly `materialized` (candidate classes)."""
    return _Evaluator(p).total(set(materialized))


__all__ = [
    "FusionChoice",
    "FusionProblem",
    "Kernel",
    "exhaustive_fusion",
    "fusion_cost",
    "greedy_fusion",
    "scalar_flops",
    "shared_pass_saving",
]
