"""Every small assignment of a rule's variables that type-checks and satisfies its guards.

Tensor variables range over shapes of rank 0..2 with dims in {1, 2, 3} and over the dtypes
f32 and bool (plus any dtype the rule names); primitive variables over values that make sense
where they occur: a `Reduce` axis over the operand's axes, a `Transpose` permutation over its
permutations, a `Slice` axis and bounds over the operand's axes and sizes, a `ShapeCast` shape over shapes of the same size, a `Broadcast` shape over the
shapes the operand broadcasts to, f64 constants over {0, 1, 2, -1, 0.5} and the rule's own.
The search is depth-first; each subterm and guard is checked as soon as its variables are set.

    asgs, truncated = assignments(obligation, evaluator, Space())
    asgs[0]     # {"a": TensorType((), f32), "b": TensorType((), f32)}
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, replace

from ..ir.ops import BIT_OPS, OPS, REDUCE_COMBINATORS
from ..ir.types import DType, TensorType, broadcast_shapes
from .obligation import Obligation
from .pattern import CAUSAL_KEEP, PRIM_SORTS, VEC, PCall, PVar, variables
from .terms import Evaluator, Untypable, check_constant
from .window_search import HEADS as WINDOW_HEADS
from .window_search import window_attr_domain


@dataclass(frozen=True)
class Space:
    max_rank: int = 2
    dims: tuple[int, ...] = (1, 2, 3)
    dtypes: tuple[str, ...] = ("f32", "bool")
    floats: tuple[float, ...] = (0.0, 1.0, 2.0, -1.0, 0.5)
    extra_shapes: tuple[tuple[int, ...], ...] = ((2, 2, 2),)  # rank 3: permutations beyond swaps
    limit: int = 400  # assignments kept (evenly sampled when there are more)
    max_nodes: int = 200_000  # search steps
    windows: str = "small"  # window attributes searched (verify/window_search.py)

    def shapes(self):
        out = [()]
        for r in range(1, self.max_rank + 1):
            out += list(itertools.product(self.dims, repeat=r))
        return out + [s for s in self.extra_shapes if s not in out]

    def widened(self, rank: int) -> Space:
        """A later try for rules whose guards ask for higher ranks (smaller dims keep it small)."""
        return replace(self, max_rank=rank, dims=(1, 2), extra_shapes=())

    def for_windows(self) -> Space:
        """The last try: rank-4 shapes of dims 1 and 3 with same-padded 3x3 and 1x3 windows,
        for rules whose guards ask for such a kernel (no kernel of the other tries is that
        big)."""
        return replace(self, max_rank=4, dims=(1, 3), extra_shapes=(), windows="3x3")


_DTYPE_TEXT = re.compile(r'"(f32|f64|i32|bool)"')
_WORD_OPS = re.compile(r"\(S?(?:" + "|".join(OPS[n].egg for n in BIT_OPS) + r")\s")


# Constructors whose operand 1 is a vector of i32 indices (take, scatterAdd): such a variable
# ranges over short index vectors, valued all zeros (in range for every axis) by rules.py.
INDEX_OPERANDS = {"Take": 1, "ScatterAdd": 1}


def index_variables(ob: Obligation) -> set[str]:
    """The tensor variables of `ob` used as index operands."""
    out: set[str] = set()
    exprs = list(ob.patterns) + list(ob.guards) + [e for c in ob.claims for e in (c.lhs, c.rhs)]
    stack = [e for e in exprs if isinstance(e, PCall)]
    while stack:
        e = stack.pop()
        i = INDEX_OPERANDS.get(e.head)
        if i is not None and len(e.args) > i and isinstance(e.args[i], PVar):
            out.add(e.args[i].name)
        stack.extend(a for a in e.args if isinstance(a, PCall))
    return out


def _dyadic(x: float) -> bool:
    return x == x and abs(x) < 1e6 and (x * 1024).is_integer()


def _shapes_of_size(size: int, max_rank: int = 3):
    out = [()] if size == 1 else []
    for r in range(1, max_rank + 1):
        for dims in itertools.product(range(1, size + 1), repeat=r):
            p = 1
            for d in dims:
                p *= d
            if p == size:
                out.append(dims)
    return out


class _Search:
    def __init__(self, ob: Obligation, ev: Evaluator, space: Space):
        self.ob, self.ev, self.space = ob, ev, space
        exprs = list(ob.patterns) + list(ob.guards)
        for c in ob.claims:
            exprs += [c.lhs] + ([c.rhs] if c.kind != "assume" else [])
        self.order: list[str] = []
        for e in exprs:
            variables(e, self.order)
        self.roles: dict[str, tuple] = {}
        for e in exprs:
            self._roles(e)
        pos = {v: i for i, v in enumerate(self.order)}
        self.checks: dict[int, list] = {}
        nodes = []
        for p in ob.patterns:
            nodes += [
                t
                for t in _subterms(p)
                if isinstance(t, PCall)
                and t.head in ev.sigs
                and ev.sigs[t.head].kind == "constructor"
            ]
        for t in dict.fromkeys(nodes):
            at = max((pos[v] for v in variables(t)), default=-1)
            self.checks.setdefault(at, []).append(("type", t))
        for g in ob.guards:
            at = max((pos[v] for v in variables(g)), default=-1)
            self.checks.setdefault(at, []).append(("guard", g))
        for x, c in ob.constants.items():  # a constant tensor's value must suit its dtype
            self.checks.setdefault(max(pos[x], pos[c]), []).append(("constant", (x, c)))
        text = ob.text
        named = tuple(_DTYPE_TEXT.findall(text))
        if _WORD_OPS.search(text):  # bit operations take i32 words only
            named += ("i32",)
        self.dtypes = tuple(dict.fromkeys(space.dtypes + named))
        lits = [float(x) for x in re.findall(r"(?<![\w.])-?\d+\.\d*(?:e-?\d+)?", text)]
        self.floats = tuple(dict.fromkeys(space.floats + tuple(x for x in lits if _dyadic(x))))
        self.index_vars = index_variables(ob)
        self.results: list[dict] = []
        self.steps = 0
        self.truncated = False

    def _roles(self, e):
        """Where each primitive variable first occurs as a constructor argument (innermost first:
        the operand it describes is typed by then)."""
        if isinstance(e, PCall):
            for a in e.args:
                self._roles(a)
            sig = self.ev.sigs.get(e.head)
            if sig is not None and sig.kind == "constructor":
                prim_i = 0
                for a, s in zip(e.args, sig.args):
                    if s in PRIM_SORTS:
                        if isinstance(a, PVar) and a.name not in self.roles:
                            self.roles[a.name] = (e.head, prim_i, e)
                        prim_i += 1

    # -------------------------------------------------- domains
    def domain(self, var: str, asg: dict):
        sort = self.ob.sorts[var]
        if var in self.index_vars:
            return [TensorType((n,), DType.i32) for n in self.space.dims]
        if sort not in PRIM_SORTS:
            dtypes = self.dtypes
            if self.ob.assumptions.get(var) == CAUSAL_KEEP:  # a bool mask (issue 33)
                dtypes = ("bool",)
            elif var in self.ob.assumptions:
                dtypes = tuple(d for d in dtypes if DType(d).is_float)
            return [TensorType(s, DType(d)) for s in self.space.shapes() for d in dtypes]
        role = self.roles.get(var)
        if role is not None:
            dom = self._role_domain(role, asg)
            if dom is not None:
                return dom
        if sort == "i64":
            return list(range(0, 4))
        if sort == "f64":
            return list(self.floats)
        if sort == "String":
            return list(self.dtypes)
        if sort == "bool":
            return [True, False]
        if sort == VEC:
            return self.space.shapes()
        return []

    def _operand(self, parent: PCall, asg) -> TensorType | None:
        kids, _ = self.ev.split(parent)
        try:
            return self.ev.type(kids[0], asg) if kids else None
        except (Untypable, KeyError):
            return None

    def _role_domain(self, role, asg):
        head, i, parent = role
        head = self.ev.vocab.ir_ctor(head) or head  # a scalar form ranges like its IR op
        helper = self.ev.vocab.helper(head)
        if helper is not None:
            if helper.hints is None:
                return None
            return helper.hints(i, self._operand(parent, asg))
        if head == "Const":
            return list(self.floats) if i == 0 else list(self.dtypes)
        if head == "Reduce" and i == 0:
            return list(REDUCE_COMBINATORS)
        if head == "Reduce" and i == 1:
            return list(self.floats)
        if head == "DataTypeCast":
            return list(dict.fromkeys(("f32", "f64", "bool") + self.dtypes))
        if head == "Adjoint":
            return [0, 1, 2]
        if head in WINDOW_HEADS:  # convolution and pooling: packed attribute vectors
            return window_attr_domain(head, self.space.windows)
        t = self._operand(parent, asg)
        if t is None:
            return None
        r = t.rank
        if head == "Transpose":
            return [tuple(p) for p in itertools.permutations(range(r))]
        if head == "Slice":  # axis, then bounds within the largest axis
            return list(range(r)) if i == 0 else list(range(max(t.shape, default=0) + 1))
        if head in ("Reduce", "Concatenate"):
            return list(range(r))
        if head == "PadShape":
            return list(range(r + 1))
        if head == "SqueezeShape":
            return [k for k in range(r) if t.shape[k] == 1]
        if head == "ShapeCast":
            return _shapes_of_size(t.size)
        if head == "Broadcast":
            out = []
            for s in self.space.shapes():
                if len(s) >= r and broadcast_shapes(t.shape, s) == s:
                    out.append(s)
            return out
        return None

    # -------------------------------------------------- search
    def ok(self, at: int, asg: dict, memo: dict) -> bool:
        for kind, x in self.checks.get(at, ()):
            if kind == "type":
                try:
                    self.ev.type(x, asg, memo)
                except (Untypable, KeyError):
                    return False
            elif kind == "constant":
                try:
                    check_constant(asg[x[1]], asg[x[0]].dtype)
                except Untypable:
                    return False
            elif not self.ev.holds(x, asg, memo):
                return False
        return True

    def run(self, cap: int) -> list[dict]:
        asg: dict = {}
        memo: dict = {}
        if not self.ok(-1, asg, memo):
            return []
        self._dfs(0, asg, cap, memo)
        return self.results

    def _dfs(self, k: int, asg: dict, cap: int, memo: dict):
        """memo holds types of subterms whose variables are all set above level k."""
        if len(self.results) >= cap or self.steps > self.space.max_nodes:
            self.truncated = True
            return
        if k == len(self.order):
            self.results.append(dict(asg))
            return
        var = self.order[k]
        for val in self.domain(var, asg):
            self.steps += 1
            asg[var] = val
            local = dict(memo)
            if self.ok(k, asg, local):
                self._dfs(k + 1, asg, cap, local)
            if self.truncated:
                break
        asg.pop(var, None)


def _subterms(e):
    yield e
    if isinstance(e, PCall):
        for a in e.args:
            yield from _subterms(a)


_SHAPE_VAR = re.compile(r"\(= (\S+) \(shape ")
_RANK_GUARD = re.compile(r"\(= (\d+) \(vec-length (\S+?)\)\)")


def required_rank(ob: Obligation) -> int:
    """The largest rank a guard `(= N (vec-length s))` asks of a shape `(= s (shape x))` of
    the rule (0 without one): a space without shapes that long has no assignment (an
    attention rule of rank 4 searched 200,000 steps in each of two such spaces first)."""
    shapes = set(_SHAPE_VAR.findall(ob.text))
    ranks = [int(n) for n, v in _RANK_GUARD.findall(ob.text) if v in shapes]
    return max(ranks, default=0)


def assignments(ob: Obligation, ev: Evaluator, space: Space) -> tuple[list[dict], bool]:
    """(assignments, truncated): at most space.limit, spread evenly over what the search found."""
    s = _Search(ob, ev, space)
    found = s.run(cap=space.limit * 3)
    if len(found) > space.limit:
        step = len(found) / space.limit
        found = [found[int(i * step)] for i in range(space.limit)]
        s.truncated = True
    return found, s.truncated
