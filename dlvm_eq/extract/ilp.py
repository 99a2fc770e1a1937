"""Optimal DAG extraction as a 0-1 integer program, solved by ``scipy.optimize.milp`` (HiGHS).

Model, on the pruned e-graph (see :mod:`.prune`):

* ``x_n`` in {0, 1} per e-node: the node is chosen. A class is chosen when one of its nodes
  is (``sum x_n`` over the class is the class's "chosen" variable: at most 1, exactly 1 at a root).
* a chosen node's child classes are chosen: ``x_n <= sum x_m`` over each child class.
* acyclic: an order value ``o_c`` per class, and for node n of class c with child class d:
  ``o_c >= o_d + 1 - M (1 - x_n)``, only where c and d share a strongly connected component of
  the class graph (no other edge can close a cycle), M the size of that component. The ``o_c`` are
  continuous: a cycle of chosen nodes is infeasible over the reals too, and an acyclic choice
  has integer levels < M, so integrality would only slow HiGHS down.
* minimize ``sum cost_n x_n``: with costs >= 0 this is the DAG cost of what the roots use.

Solving runs in two steps, each under a work budget (HiGHS's branch-and-bound node limit,
``node_limit``: the same answer on a busy machine as on a quiet one) and within ``time_limit``
in all (a safety net: an answer it cuts says "time limit", which extract() notes as a time cut). First without the order constraints
(a quarter of the time at most): on Tensat's e-graphs this takes a second where the full model
finds nothing in a minute; an acyclic answer is then optimal outright, and otherwise its value
is a lower bound (greedy meeting it is proven optimal) and its cycles become cuts. Then the full
model, without HiGHS's presolve (on bert it runs for minutes, deaf to the time limit), with a
cutoff "cheaper than the best answer so far" that prunes HiGHS's search (HiGHS saying
"infeasible" then proves the incumbent optimal). scipy's ``milp`` takes no warm start,
so greedy's answer is the incumbent outside the solver: when HiGHS finds nothing better in
time, greedy's answer is returned with ``fallback`` set.

>>> from dlvm_eq.extract.graph import load_json
>>> g = load_json({"nodes": {
...     "s": {"op": "s", "children": [], "eclass": "S", "cost": 3.0},
...     "a": {"op": "a", "children": ["s"], "eclass": "A", "cost": 0.0},
...     "h": {"op": "h", "children": ["a", "s"], "eclass": "R", "cost": 1.0}},
...     "root_eclasses": ["R"]})
>>> r = ilp_choice(g, g.costs, g.roots, time_limit=5.0)
>>> r.status, sorted(g.node_ids[n] for n in r.choice if n >= 0)
('optimal', ['a', 'h', 's'])
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from .choice import chosen_cycles, dag_cost_of, find_problem
from .graph import SerializedEGraph
from .greedy import greedy_dag_choice
from .prune import prune, strongly_connected

_HIGHS_STATUS = {0: "optimal", 1: "time limit", 2: "infeasible", 3: "unbounded"}
# branch-and-bound nodes per solve: the work budget (tensat's e-graphs: step 1 takes 1-40 nodes)
NODE_LIMIT = 5_000


@dataclass
class IlpResult:
    choice: list[int]  # per class: node index or -1 (only classes the roots use)
    status: str  # "optimal" or what stopped the search, and whose answer this is
    optimal: bool  # proven optimal (within rel_gap)
    fallback: bool  # greedy's choice was returned instead of a solver's
    cuts: int = 0  # cycle cuts from step 1
    lower_bound: float = float("-inf")


def ilp_choice(
    graph: SerializedEGraph,
    costs,
    roots,
    *,
    time_limit: float = 10.0,
    greedy=None,
    rel_gap: float = 1e-6,
    node_limit: int = NODE_LIMIT,
) -> IlpResult:
    """Solve the extraction ILP within ``time_limit`` seconds in all. ``greedy`` (a choice
    list, computed when not given) is the fallback and the yardstick. Never raises on solver
    trouble: it falls back."""
    deadline = time.perf_counter() + time_limit
    if greedy is None:
        greedy = greedy_dag_choice(graph, costs, roots)
    g_order, g_problem = find_problem(graph, greedy, roots)
    if g_problem is not None:  # extract() never passes an invalid greedy choice
        raise ValueError(f"greedy choice is invalid: {g_problem[0]}")
    model = _Model(graph, costs, roots)
    run = _Run(graph, costs, roots, model, rel_gap, greedy, dag_cost_of(costs, greedy, g_order))
    if model.missing_root:
        return run.result("no extractable term for a root")

    def left(share: float = 1.0) -> float:
        return min(deadline - time.perf_counter(), share * time_limit)

    def stopped(res) -> bool:
        """HiGHS stopped on the clock (the safety net), not on its node limit (work)."""
        return res.status == 1 and time.perf_counter() >= deadline - 0.01 * time_limit

    # 1. No acyclicity: fast, a lower bound, and optimal outright when its answer is acyclic.
    model.node_limit = node_limit
    res = model.solve(left(0.25), rel_gap)
    timed = stopped(res)
    run.bound(res)
    if res.x is not None:
        choice = model.decode(res.x)
        cycles = chosen_cycles(graph, choice, roots)
        if not cycles:
            run.offer(choice, proven=res.status == 0)
        else:
            model.cut(cycles)  # valid in the full model too
    if run.done():
        return run.result()
    # 2. The full model, told to beat the best answer so far (a cutoff prunes HiGHS's search).
    if left() > 0:
        model.order_all()
        # No presolve: on bert's e-graph with order rows, HiGHS's presolve runs for minutes
        # without looking at the time limit, and without it HiGHS finds far better answers.
        res = model.solve(
            left(), rel_gap, cutoff=run.best_cost * (1 + 1e-9) + 1e-12, presolve=False
        )
        timed = timed or stopped(res)
        if res.x is not None:
            run.offer(model.decode(res.x), proven=res.status == 0)
        elif res.status == 2:  # nothing beats the incumbent: it is optimal
            run.proven = True
        elif res.status != 1:
            run.why = _HIGHS_STATUS.get(res.status, "solver error")
        if res.status == 1:
            run.why = "node limit"
    else:
        timed = True
    if timed:  # whatever else stopped it, the clock shaped the answer: a time cut
        run.why = "time limit"
    return run.result()


class _Run:
    """The best valid answer so far, the best lower bound, and what to say about them."""

    def __init__(self, graph, costs, roots, model, rel_gap, greedy, greedy_cost):
        self.graph, self.costs, self.roots, self.model, self.rel_gap = (
            graph,
            costs,
            roots,
            model,
            rel_gap,
        )
        self.best, self.best_cost, self.from_greedy = greedy, greedy_cost, True
        self.lower = float("-inf")
        self.proven = False
        self.why = "node limit"

    def offer(self, choice, proven: bool = False) -> None:
        """A solver's answer: kept if valid and cheaper (``proven``: HiGHS proved it optimal)."""
        order, problem = find_problem(self.graph, choice, self.roots)
        if problem is not None:
            return
        cost = dag_cost_of(self.costs, choice, order)
        if cost < self.best_cost or (proven and cost <= self.best_cost):
            reached = [-1] * self.graph.num_classes
            for c in order:  # keep what the roots use (HiGHS may set a zero-cost extra node)
                reached[c] = choice[c]
            self.best, self.best_cost, self.from_greedy = reached, cost, False
        self.proven = self.proven or proven

    def bound(self, res) -> None:
        """A relaxation's dual bound is a lower bound on the true optimum."""
        b = getattr(res, "mip_dual_bound", None)
        if b is None or not np.isfinite(b):
            b = res.fun if res.status == 0 and res.fun is not None else None
        if b is not None:
            self.lower = max(self.lower, float(b))

    def done(self) -> bool:
        if self.best_cost <= self.lower + self.rel_gap * abs(self.lower) + 1e-12:
            self.proven = True
        return self.proven

    def result(self, why: str | None = None) -> IlpResult:
        n = len(self.model.cuts)
        if why is not None:
            return IlpResult(self.best, f"{why}: greedy result", False, True, n, self.lower)
        if self.proven:
            status = (
                "optimal (greedy's answer meets the lower bound)" if self.from_greedy else "optimal"
            )
            return IlpResult(self.best, status, True, False, n, self.lower)
        if self.from_greedy:
            return IlpResult(
                self.best,
                f"{self.why}, nothing better found: greedy result",
                False,
                True,
                n,
                self.lower,
            )
        return IlpResult(
            self.best, f"{self.why}, best found (not proven optimal)", False, False, n, self.lower
        )


class _Model:
    """The MILP: its fixed rows (one node per class, children chosen), cycle cuts, and the
    order variables once :meth:`order_all` has been called."""

    def __init__(self, graph: SerializedEGraph, costs, roots):
        self.graph = graph
        p = prune(graph, costs, roots)
        self.nodes, self.classes = p.nodes, p.classes
        class_set = set(self.classes)
        self.missing_root = any(r not in class_set for r in roots)
        col = {n: j for j, n in enumerate(self.nodes)}
        self.members: dict[int, list[int]] = {c: [] for c in self.classes}
        for n in self.nodes:
            self.members[graph.node_class[n]].append(col[n])
        kids_of, node_class = graph.child_sets, graph.node_class

        # Strongly connected components of the kept class graph: only edges inside one can
        # close a cycle, so only those get order constraints.
        local = {c: i for i, c in enumerate(self.classes)}
        edges = [set() for _ in self.classes]
        for n in self.nodes:
            edges[local[node_class[n]]].update(local[k] for k in kids_of[n])
        comp = strongly_connected(len(self.classes), [list(e) for e in edges])
        self.component = {c: comp[local[c]] for c in self.classes}

        rows, cols, vals, lo, hi = [], [], [], [], []
        root_set = set(roots)
        for c in self.classes:  # at most one node per class; exactly one at a root
            for j in self.members[c]:
                rows.append(len(lo))
                cols.append(j)
                vals.append(1.0)
            lo.append(1.0 if c in root_set else 0.0)
            hi.append(1.0)
        for n in self.nodes:  # a chosen node's child classes are chosen
            for k in kids_of[n]:
                r = len(lo)
                rows.append(r)
                cols.append(col[n])
                vals.append(1.0)
                for m in self.members[k]:
                    rows.append(r)
                    cols.append(m)
                    vals.append(-1.0)
                lo.append(-np.inf)
                hi.append(0.0)
        self.base = (rows, cols, vals, lo, hi)
        self.objective = np.array([costs[n] for n in self.nodes], dtype=float)
        self.col = col
        self.cuts: set[frozenset] = set()
        self.ordered: dict[int, int] = {}
        self.node_limit = NODE_LIMIT
        self.comp_size: dict[int, int] = {}

    def cut(self, cycles) -> None:
        """Forbid each class cycle c1 -> ... -> ck -> c1 whatever nodes realize it: at most
        k-1 of its classes may pick a node pointing to the next class on the cycle."""
        rows, cols, vals, lo, hi = self.base
        kids_of = self.graph.child_sets
        for cyc in cycles:
            key = frozenset(zip(cyc, cyc[1:] + cyc[:1]))
            if key in self.cuts:
                continue
            self.cuts.add(key)
            r = len(lo)
            for c, nxt in zip(cyc, cyc[1:] + cyc[:1]):
                for j in self.members[c]:
                    if nxt in kids_of[self.nodes[j]]:
                        rows.append(r)
                        cols.append(j)
                        vals.append(1.0)
            lo.append(-np.inf)
            hi.append(len(cyc) - 1.0)

    def order_all(self) -> None:
        """Give every class inside a cycle of the class graph an order variable."""
        size: dict[int, int] = {}
        for c in self.classes:
            size[self.component[c]] = size.get(self.component[c], 0) + 1
        for c in self.classes:
            if size[self.component[c]] > 1:
                self.ordered.setdefault(c, len(self.ordered))
        self.comp_size = size

    def solve(
        self, time_limit: float, rel_gap: float, cutoff: float | None = None, presolve: bool = True
    ):
        rows, cols, vals, lo, hi = (list(x) for x in self.base)
        nx, no = len(self.nodes), len(self.ordered)
        kids_of, node_class, comp = self.graph.child_sets, self.graph.node_class, self.component
        upper_o = np.zeros(no)
        for c, oc in self.ordered.items():
            upper_o[oc] = self.comp_size[comp[c]] - 1
        for n in self.nodes:
            c = node_class[n]
            oc = self.ordered.get(c)
            if oc is None:
                continue
            big_m = float(self.comp_size[comp[c]])
            for k in kids_of[n]:
                ok = self.ordered.get(k)
                if ok is not None and comp[k] == comp[c]:
                    # x_n = 1  =>  o_c >= o_k + 1; otherwise vacuous since |o_c - o_k| <= M - 1
                    r = len(lo)
                    rows += [r, r, r]
                    cols += [nx + oc, nx + ok, self.col[n]]
                    vals += [1.0, -1.0, -big_m]
                    lo.append(1.0 - big_m)
                    hi.append(np.inf)
        if cutoff is not None:
            r = len(lo)
            for j, v in enumerate(self.objective):
                rows.append(r)
                cols.append(j)
                vals.append(v)
            lo.append(-np.inf)
            hi.append(cutoff)
        nvar = nx + no
        a = coo_matrix((vals, (rows, cols)), shape=(len(lo), nvar)).tocsr()
        objective = np.concatenate([self.objective, np.zeros(no)])
        integrality = np.concatenate([np.ones(nx), np.zeros(no)])
        upper = np.concatenate([np.ones(nx), upper_o])
        return milp(
            objective,
            integrality=integrality,
            bounds=Bounds(np.zeros(nvar), upper),
            constraints=LinearConstraint(a, lo, hi),
            options={
                "time_limit": max(time_limit, 0.01),
                "node_limit": self.node_limit,
                "mip_rel_gap": rel_gap,
                "presolve": presolve,
                "disp": False,
            },
        )

    def decode(self, x) -> list[int]:
        choice = [-1] * self.graph.num_classes
        node_class = self.graph.node_class
        for n, v in zip(self.nodes, x[: len(self.nodes)]):
            if v > 0.5:
                choice[node_class[n]] = n
        return choice
