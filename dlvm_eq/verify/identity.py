"""Is a sympy expression zero? Exact first, then region by region; results cached by form.

    prover = ZeroProver()
    prover.status(sp.exp(sp.log(p)) - p)     # PROVEN
    prover.status(sp.Max(x, 0) - sp.Piecewise((x, x > 0), (0, True)))   # PROVEN_AE

Statuses: PROVEN (d == 0 identically), PROVEN_AE (d == 0 wherever the values it compares are
ordered: proven on each region of the total orders of the compared symbols and constants,
not on ties, a set of measure zero; how max/relu/abs derivatives are defined anyway),
NUMERIC_ONLY (the time limit ran out before any method decided: the load of the machine,
not the identity, decided it; callers report the numeric check, which they ran first), UNPROVEN
(every method ran to its end without showing d == 0: the same on any machine).

Steps, cheap first: expand; by regions (Piecewise/Max/Min/Heaviside/sign/Abs whose
comparisons are orders of symbols, see `_comparisons`); by groups of terms sharing the same
exponentials (a batch of rows); exp-rational cancellation (tanh, sigmoid, softplus);
simplify; `equals`. sympy works over the complex numbers (exp(log x) = x for any x != 0):
real domains are for the callers' numeric checks. The time limit uses SIGALRM, so it only
applies on the main thread.

Derivatives follow the usual AD convention (`derivative`): d/dx of floor, ceil, round and sign
is 0, and the derivative of Max(x, 0) at the tie is that of the `x > 0` branch.
"""

from __future__ import annotations

import itertools
import math
import signal
import threading
import time
from contextlib import contextmanager

import sympy as sp

from .hard_limit import MANY_SYMBOLS, can_fork, decided_in_child

PROVEN, PROVEN_AE, UNPROVEN = "proven", "proven a.e.", "unproven"
NUMERIC_ONLY = "checked numerically"
RANK = {PROVEN: 0, PROVEN_AE: 1, NUMERIC_ONLY: 2, UNPROVEN: 3}


class _Timeout(BaseException):  # BaseException: sympy's own `except Exception` must not eat it
    pass


@contextmanager
def time_limit(seconds: float):
    """Interrupt the block after `seconds` (main thread only; elsewhere, no limit)."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum, frame):
        raise _Timeout()

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _strict(rel):
    """A comparison of analytic expressions up to ties (a set of measure zero): non-strict
    becomes strict, `a == b` false unless a - b is identically 0. Comparisons that still
    contain a Piecewise are left alone (Eq(x, Max(x, y)) holds on a whole half-space)."""
    if rel.has(sp.Piecewise, sp.Max, sp.Min):
        return rel
    if isinstance(rel, (sp.Eq, sp.Ne)):
        same = sp.expand(rel.lhs - rel.rhs) == 0
        return sp.true if same == isinstance(rel, sp.Eq) else sp.false
    if isinstance(rel, sp.GreaterThan):
        return sp.StrictGreaterThan(rel.lhs, rel.rhs)
    if isinstance(rel, sp.LessThan):
        return sp.StrictLessThan(rel.lhs, rel.rhs)
    return rel


def heaviside_to_piecewise(e):
    return e.replace(sp.Heaviside, lambda u, *h: sp.Piecewise((1, u > 0), (0, True)))


def derivative(expr, sym):
    """d expr / d sym with the AD conventions above (no DiracDelta, no Heaviside)."""
    if expr.has(sp.Max, sp.Min):  # sympy's d Max builds (and compares) Max of the rest: slow
        expr = expr.replace(
            lambda e: isinstance(e, (sp.Max, sp.Min)) and e.has(sym),
            lambda e: e.rewrite(sp.Piecewise),
        )
    d = sp.diff(expr, sym)
    if d.has(sp.DiracDelta):
        d = d.replace(sp.DiracDelta, lambda *a: sp.S.Zero)
    if d.has(sp.Derivative):  # floor, ceiling: piecewise constant
        d = d.replace(
            lambda e: isinstance(e, sp.Derivative) and isinstance(e.expr, (sp.floor, sp.ceiling)),
            lambda e: sp.S.Zero,
        )
    if d.has(sp.Heaviside):
        d = heaviside_to_piecewise(d)
    return d


def ae_normalize(e):
    """e with Max/Min/Heaviside as Piecewise, folded, and every comparison strict."""
    e = heaviside_to_piecewise(e)
    e = e.replace(lambda x: isinstance(x, (sp.Max, sp.Min)), lambda x: x.rewrite(sp.Piecewise))
    e = sp.piecewise_fold(e)
    e = e.replace(lambda x: isinstance(x, sp.core.relational.Relational), _strict)
    return sp.piecewise_fold(e)


# ---------------------------------------------------------------- proof by cells
# A piecewise expression whose conditions compare symbols with each other and with constants
# is analytic on each cell of a total order of those symbols and constants. Choosing the branch
# at one point of every cell and proving each branch zero proves the expression zero except
# on cell boundaries (ties), a set of measure zero.

_PIECEWISE = (sp.Piecewise, sp.Max, sp.Min, sp.Heaviside, sp.sign, sp.Abs)


def _comparisons(e):
    """(symbols, constants) whose order decides every branch of e, or None when some branch
    depends on more than that order (e.g. x * y > 1).

    Order-decided: comparisons among symbols, constants and Max/Min of them (`lattice`
    values), of `s1 - s2` with 0, and among values that are constant on each cell (`cellwise`:
    numbers, indicators, counts of them)."""
    syms, consts = set(), set()

    def lattice(x) -> bool:
        if isinstance(x, sp.Symbol):
            return True
        if x.is_Number:
            return bool(x.is_finite)
        return isinstance(x, (sp.Max, sp.Min)) and all(lattice(a) for a in x.args)

    def cellwise(x) -> bool:
        if x.is_Number:
            return bool(x.is_finite)
        if isinstance(x, sp.Piecewise):
            return all(cellwise(v) and decided(c) for v, c in x.args)
        if isinstance(x, (sp.Add, sp.Mul, sp.Max, sp.Min)):
            return all(cellwise(a) for a in x.args)
        if isinstance(x, sp.Pow):
            return cellwise(x.base) and x.exp.is_Number
        return False

    def note(x):
        for a in sp.preorder_traversal(x):
            if isinstance(a, sp.Symbol):
                syms.add(a)
            elif a.is_Number and a.is_finite:
                consts.add(a)

    def compared(a, b) -> bool:
        if lattice(a) and lattice(b):
            note(a), note(b)
            return True
        if cellwise(a) and cellwise(b):
            return True
        # a - b as  A - B,  A + k  or  -A + k  with A, B lattice values and k a number
        k, plus, minus = sp.S.Zero, [], []
        for t in sp.Add.make_args(a - b):
            if t.is_Number:
                k += t
                continue
            c, rest = t.as_coeff_Mul()
            if abs(c) != 1 or not lattice(rest):
                return False
            (plus if c > 0 else minus).append(rest)
        if len(plus) > 1 or len(minus) > 1 or (plus and minus and k != 0) or not (plus or minus):
            return False
        for x in plus + minus + [k]:
            note(x)
        return True

    def decided(c) -> bool:
        if c in (sp.true, sp.false):
            return True
        if isinstance(c, sp.core.relational.Relational):
            return compared(c.lhs, c.rhs)
        if isinstance(c, sp.logic.boolalg.BooleanFunction):
            return all(decided(a) for a in c.args)
        return False

    for node in sp.preorder_traversal(e):
        if isinstance(node, sp.Piecewise):
            if not all(decided(c) for _, c in node.args):
                return None
        elif isinstance(node, sp.core.relational.Relational):
            if not decided(node):
                return None
        elif isinstance(node, (sp.Max, sp.Min)):
            if lattice(node):
                note(node)
            elif not all(cellwise(a) for a in node.args):
                return None
        elif isinstance(node, (sp.Heaviside, sp.sign, sp.Abs)):
            if not compared(node.args[0], sp.S.Zero):
                return None
    return syms, consts


def _num(x, point: dict, memo: dict):
    """x at a point of the cell, in floats (exact enough: cell points are far from ties)."""
    hit = memo.get(x)
    if hit is not None:
        return hit
    if isinstance(x, sp.Symbol):
        v = point[x]
    elif x.is_Number:
        v = float(x)
    elif x in (sp.true, sp.false):
        v = x == sp.true
    elif isinstance(x, sp.Add):
        v = sum(_num(a, point, memo) for a in x.args)
    elif isinstance(x, sp.Mul):
        v = 1.0
        for a in x.args:
            v *= _num(a, point, memo)
    elif isinstance(x, sp.Pow) and x.exp.is_Number:
        v = _num(x.base, point, memo) ** float(x.exp)
    elif isinstance(x, sp.Max):
        v = max(_num(a, point, memo) for a in x.args)
    elif isinstance(x, sp.Min):
        v = min(_num(a, point, memo) for a in x.args)
    elif isinstance(x, sp.Piecewise):
        v = None
        for expr, cond in x.args:
            if _num(cond, point, memo):
                v = _num(expr, point, memo)
                break
    elif isinstance(x, sp.core.relational.Relational):
        a, b = _num(x.lhs, point, memo), _num(x.rhs, point, memo)
        v = {"==": a == b, "!=": a != b, ">": a > b, "<": a < b, ">=": a >= b, "<=": a <= b}[
            x.rel_op
        ]
    elif isinstance(x, sp.And):
        v = all(_num(a, point, memo) for a in x.args)
    elif isinstance(x, sp.Or):
        v = any(_num(a, point, memo) for a in x.args)
    elif isinstance(x, sp.Not):
        v = not _num(x.args[0], point, memo)
    else:
        raise ValueError(f"cannot place {x} in a cell")
    if v is None:
        raise ValueError("no branch holds")
    memo[x] = v
    return v


def select_branch(e, point, memo=None):
    """e with every Piecewise/Max/Min/Heaviside/sign/Abs replaced by its branch at `point`."""
    memo = {} if memo is None else memo
    if not e.has(*_PIECEWISE) and not e.has(sp.core.relational.Relational):
        return e
    if isinstance(e, sp.Piecewise):
        for expr, cond in e.args:
            if _num(cond, point, memo):
                return select_branch(expr, point, memo)
        return sp.nan
    if isinstance(e, (sp.Max, sp.Min)):
        pick = max if isinstance(e, sp.Max) else min
        return select_branch(pick(e.args, key=lambda a: _num(a, point, memo)), point, memo)
    if isinstance(e, (sp.Heaviside, sp.sign, sp.Abs)):
        positive = _num(e.args[0], point, memo) > 0
        if isinstance(e, sp.Heaviside):
            return sp.S.One if positive else sp.S.Zero
        if isinstance(e, sp.sign):
            return sp.S.One if positive else sp.S.NegativeOne
        return select_branch(e.args[0] if positive else -e.args[0], point, memo)
    if isinstance(e, (sp.core.relational.Relational, sp.logic.boolalg.BooleanFunction)):
        return sp.true if _num(e, point, memo) else sp.false
    return e.func(*[select_branch(a, point, memo) for a in e.args])


def _by_groups(d):
    """0 if the terms of d, grouped by the exponentials they contain, each cancel; else d.

    A loss summed over a batch differs from its adjoint row by row: cancelling each row's
    group is cheap where one common denominator over all rows is not. (Sufficient only.)"""
    e = d.rewrite(sp.exp)
    terms = sp.Add.make_args(e)
    if len(terms) < 4:
        return d

    def key(t):
        args = set()
        for x in t.atoms(sp.exp):
            a = sp.expand(x.args[0])
            args.add(min(a, -a, key=sp.default_sort_key))  # exp(z) and exp(-z) go together
        return frozenset(args)

    groups: dict = {}
    for t in terms:
        groups.setdefault(key(t), []).append(t)
    if len(groups) < 2:
        return d
    for group in groups.values():
        if sp.cancel(sp.together(sp.Add(*group))) != 0:
            return d
    return sp.S.Zero


def cell_points(syms, consts, limit: int = 720):
    """One point inside every cell: every total order of the symbols among the constants
    (ties excluded). None when there are more than `limit` cells."""
    syms = sorted(syms, key=lambda s: s.name)
    marks = sorted(set(sp.Rational(c) for c in consts))
    n, m = len(syms), len(marks)
    bounds = [(marks[g - 1] if g > 0 else None, marks[g] if g < m else None) for g in range(m + 1)]
    if math.factorial(n) * math.comb(n + m, n) > limit:
        return None
    points = []
    for perm in itertools.permutations(syms):
        for gaps in itertools.combinations_with_replacement(range(m + 1), n):
            point = {}
            for g in set(gaps):
                members = [s for s, gg in zip(perm, gaps) if gg == g]
                lo, hi = bounds[g]
                if lo is None:
                    lo = (hi if hi is not None else sp.Integer(0)) - len(members) - 1
                if hi is None:
                    hi = lo + len(members) + 1
                step = (hi - lo) / (len(members) + 1)
                for j, s in enumerate(members):
                    point[s] = float(lo + step * (j + 1))
            points.append(point)
    return points


def canonical(e) -> tuple:
    """A cache key for e: its tree in preorder, each node its class and arity, each symbol its
    rank in name order (with its assumptions), so equal formulas over different elements share
    an entry. (Not a rebuilt expression: rebuilding re-evaluates every Max/Min, which is slow;
    not sympy's srepr text, which took a third of verifying an attention adjoint.)"""
    names = sorted({s.name for s in e.free_symbols})
    index = {n: i for i, n in enumerate(names)}
    out: list = []
    stack = [e]
    while stack:
        t = stack.pop()
        if t.is_Symbol:
            dummy = t.dummy_index if t.is_Dummy else None  # two Dummy("x") are not one symbol
            out.append(("s", index[t.name], dummy, tuple(t.assumptions0.items())))
        elif t.args:
            out.append((type(t).__name__, len(t.args)))
            stack.extend(reversed(t.args))
        else:
            out.append((type(t).__name__, sp.srepr(t)))
    return tuple(out)


def _logs_factored(e):
    """Common factors out of every log's argument, then log(a*b) = log a + log b: proves that a
    shift cancels, log(sum(exp(x - m))) = log(sum(exp x)) - m, which simplify does not see
    (with m a Max, before any case split)."""
    e = sp.expand(e)
    e = e.replace(lambda t: isinstance(t, sp.log), lambda t: sp.log(sp.factor_terms(t.args[0])))
    return sp.expand(sp.expand_log(e, force=True))


def _exps_as_symbols(e):
    """e with sigmoid, tanh and softplus written with exp, and each exp(u) a symbol of its own
    (exp(-u) its reciprocal): a rational function of those symbols (and of the others), which
    `cancel` brings to 0 when it is 0. Sound: a rational identity still holds with the
    exponentials put back. Proves within the time limit what the exp-kept cancel does not: the
    logistic adjoint (sigmoid(z) - y) / N against the derivative of y*log(p) + (1-y)*log(1-p)
    over 8 rows, 1.5 s against 14."""
    names: dict = {}

    def symbol(u):
        if u not in names:
            names[u] = sp.Dummy(f"e{len(names)}", positive=True)
        return names[u]

    def as_symbol(t):
        u = sp.expand(t.args[0])
        return 1 / symbol(-u) if u.could_extract_minus_sign() else symbol(u)

    e = e.rewrite(sp.exp)
    return sp.cancel(sp.together(e.replace(lambda t: isinstance(t, sp.exp), as_symbol)))


class ZeroProver:
    """Decides d == 0 for sympy expressions, caching by canonical form."""

    def __init__(self, timeout: float = 4.0):
        self.timeout = timeout
        self.cache: dict = {}
        self.calls = 0
        self._ran_out = False  # the decision under way hit its time limit somewhere

    def status(self, d) -> str:
        d = sp.sympify(d)
        if d == 0:
            return PROVEN
        key = canonical(d)
        hit = self.cache.get(key)
        if hit is None:
            self.calls += 1
            hit = self.cache[key] = self._decide(d)
        return hit

    def _decide(self, d) -> str:
        self._ran_out = False
        status = self._methods(d)
        return NUMERIC_ONLY if status == UNPROVEN and self._ran_out else status

    def _methods(self, d) -> str:
        deadline = time.monotonic() + self.timeout
        piecewise = d.has(*_PIECEWISE)
        # sums over a batch's rows first: cheap where expanding the whole sum is not (a logistic
        # loss's adjoint over 8 rows: 2 s by rows, 3 s to expand without an answer, loaded)
        if not piecewise and self._zero(_by_groups, d, deadline):
            return PROVEN
        if self._zero(sp.expand, d, deadline):
            return PROVEN
        if d.has(sp.log) and self._zero(_logs_factored, d, deadline):
            return PROVEN  # log(sum(exp(x - m))) + m = log(sum(exp x)): a shifted logsumexp
        if piecewise and self._by_cells(d, deadline):  # before simplify: it is slow on these
            return PROVEN_AE
        if piecewise and self._zero(_by_groups, d, deadline):
            return PROVEN  # sums over independent rows (a batch): each row's terms cancel
        # each exponential a symbol: a rational function, cancelled in 1.5 s where the form
        # below (exponentials kept, so exp(a) * exp(b) = exp(a + b) is seen) took 14 s
        if not piecewise and self._zero(_exps_as_symbols, d, deadline, gcd=True):
            return PROVEN
        if self._zero(lambda e: sp.cancel(sp.together(e.rewrite(sp.exp))), d, deadline, True):
            return PROVEN  # tanh, sigmoid, softplus written with exp
        if any(
            self._zero(step, d, deadline, gcd=True)
            for step in (sp.simplify, lambda e: sp.simplify(sp.piecewise_fold(e)))
        ):
            return PROVEN
        if piecewise and self._zero(lambda e: sp.simplify(ae_normalize(e)), d, deadline, True):
            return PROVEN_AE
        if self._zero(lambda e: 0 if e.equals(0) else e, d, deadline, gcd=True):
            return PROVEN
        return UNPROVEN

    def _by_cells(self, d, deadline) -> bool:
        """d is zero on every cell of the orders of the symbols it compares (see above)."""
        found = _comparisons(d)
        if found is None:
            return False
        points = cell_points(*found)
        if points is None:
            return False
        for point in points:
            if time.monotonic() > deadline:
                self._ran_out = True
                return False
            try:
                branch = select_branch(d, point)
            except ValueError:
                return False
            if branch == 0:
                continue
            key = ("branch", canonical(branch))
            if key not in self.cache:
                self.cache[key] = any(
                    self._zero(step, branch, deadline)
                    for step in (
                        sp.expand,
                        lambda e: sp.cancel(sp.together(e.rewrite(sp.exp))),
                        sp.simplify,
                    )
                )
            if not self.cache[key]:
                return False
        return True

    def _zero(self, step, d, deadline, gcd: bool = False) -> bool:
        left = deadline - time.monotonic()
        if left <= 0:
            self._ran_out = True
            return False
        if gcd and len(d.free_symbols) > MANY_SYMBOLS and can_fork():
            got = decided_in_child(step, d, left)  # a heuristic gcd no signal stops
            if got is None:
                self._ran_out = True
            return bool(got)
        try:
            with time_limit(left):
                return step(d) == 0
        except _Timeout:
            self._ran_out = True
            return False
        except (TypeError, ValueError, NotImplementedError, AttributeError, RecursionError):
            return False
