"""verify-rules: every rule of an egglog file checked on small symbolic tensors.

    report = verify_rules(["rules/algebra.egg"])    # paths, or egglog text
    print(report)          # one line per rule that is not proven, then the totals
    report.ok              # no rule failed (report.ok_strict: and none skipped or unproven)

For each rewrite (and each `rule` whose actions are `union`/`set`/sign claims) every assignment
of its variables over small shapes that type-checks and satisfies its guards (search.py) is
instantiated; both sides are compared numerically in float64 first (random points and a point
of special values 0, +-1, 2, +-0.5: fast counterexamples), then exactly with sympy
(identity.py). Statuses: proven, proven a.e. (equal except where a comparison ties), checked
numerically (sympy's time ran out first: the numeric check is what holds, and which rules end
here depends on the machine's load, so --strict accepts them and lists them), unproven (sympy
ran every method and could not decide: numerically equal, the same on any machine), FAILED (with file:line, the assignment and a
counterexample), skipped (with the reason), definition (a table entry or a macro).

Conventions for guards and meanings:
- Elementwise operands have equal shapes (broadcasts are explicit in the e-graph); the types
  of terms are the op table's; bool constants are 0/1.
- `(= v (Op ...))` facts are definitions: v *is* that term, so `(= x (Exp y))` makes x > 0.
- `(positive x)`, `(nonneg x)`, `(nonzero x)` facts (relations the rule file declares) make
  x's symbols positive / nonnegative / nonzero and restrict the numeric points likewise; as
  actions they are claims, checked like equalities.
- `(= v (cval z))` makes z the constant tensor v (v ranges over 0, 1, 2, -1, 0.5 and the
  rule's own dyadic constants); `(set (cval e) v)` claims every element of e is v.
- Real domains: sympy proves identities over the complex numbers (exp(log x) = x for any
  x != 0), so domains are the numeric check's job: a point where the left side is undefined
  (NaN or infinite) and the right side is a number is a counterexample, so `x / x -> 1`
  needs `(nonzero x)`; where both sides are undefined they agree.
- `(Adjoint i (Op ...) g)` is the vector-Jacobian product of Op at its i-th tensor operand:
  numerically by central differences, exactly by sympy.diff; outside the forward op's
  domain (its derivative NaN) nothing is claimed. Only float results have adjoints.
- The scalar sub-language of rules/fusion.egg denotes tensors: a Scalar term is the tensor of
  its values at every index, so `(Load t)` and `(Map s)` are the identity, `(SAdd a b)` is
  `(Add a b)` (any "S" + IR constructor with that constructor's sorts, Term -> Scalar; the
  views too: `(SBroadcast (Load t) s)` is `(Broadcast t s)`), and `(ReduceMap s c i axes)` is
  `s` reduced with c from i over the axes in the vector.
- Shape, dtype and primitive facts (`(= (vec-length (shape a)) 2)`, `(< k 3)`) filter
  assignments concretely; a rule no small assignment satisfies is skipped, not passed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import sympy as sp

from ..egraph.rulefiles import SHIPPED, read_rule_file, rule_file, shipped_rule_files
from ..egraph.session import EGraphSession, RuleFileError
from ..errors import DlvmError
from ..ir.types import DType, TensorType
from ..sexpr import SexprError
from .identity import NUMERIC_ONLY, PROVEN, PROVEN_AE, RANK, UNPROVEN, ZeroProver
from .obligation import Obligation, obligations
from .pattern import ANALYSES, ASSUMPTIONS, CAUSAL_BIAS, CAUSAL_KEEP, Vocab, pshow
from .report import DEFINITION, FAILED, NOTHING, SKIPPED, RuleResult, RulesReport
from .search import Space, assignments, index_variables, required_rank
from .symbolic import number, symbol_array, to_number
from .terms import Evaluator, NumpyBackend, SympyBackend, Untypable

SPECIAL = {
    None: (0.0, 1.0, -1.0, 2.0, -0.5, 0.5),
    "positive": (0.5, 1.0, 2.0),
    "nonneg": (0.0, 0.5, 1.0, 2.0),
    "nonzero": (1.0, -1.0, 2.0, -0.5),
}
SYMBOL_ASSUMPTIONS = {
    "positive": {"positive": True},
    "nonneg": {"nonnegative": True},
    "nonzero": {"nonzero": True},
}


def _sources(sources) -> list[tuple[str, str]]:
    """(text, filename) of each source: paths, or egglog text (a string with a parenthesis)."""
    if isinstance(sources, (str, Path)):
        sources = [sources]
    out = []
    for i, s in enumerate(sources):
        if isinstance(s, str) and "(" in s:
            out.append((s, "<rules>" if len(sources) == 1 else f"<rules {i}>"))
        else:
            out.append(read_rule_file(s))
    return out


def _is_schema(filename: str) -> bool:
    try:
        return Path(filename).resolve() == rule_file("schema.egg").resolve()
    except (OSError, DlvmError):
        return False


def _shipped_name(filename: str) -> str | None:
    """'algebra.egg' for the shipped algebra.egg (wherever it is read from), else None."""
    for path in shipped_rule_files():
        try:
            if Path(filename).resolve() == path.resolve():
                return path.name
        except OSError:
            continue
    return None


_BUILDS_ON_OTHERS = ("attention.egg", "attention_adjoint.egg", "loops.egg")


def load_rule_files(sources) -> tuple[list[tuple[str, str]], Vocab, list[Obligation]]:
    """Load into egglog (errors come back as RuleFileError) and read the obligations.

    A user's file is read as `opt` reads it: after the shipped files, so that it can use
    their relations and analyses (`positive`, `nonzero`, shapes); only the given files'
    rules are checked. A file that declares such a relation itself is read alone, as before."""
    files = _sources(sources)
    shipped = {f: _shipped_name(f) for _, f in files}
    given = {name for name in shipped.values() if name}
    rank = {name: i for i, name in enumerate(SHIPPED)}
    # shipped files that read another's analyses (attention.egg: algebra's cval) load after
    # all others; a shipped file checked alone sees the shipped files before it, as in a whole run
    everything = any(name is None or name in _BUILDS_ON_OTHERS for name in shipped.values())
    last = len(SHIPPED) if everything else max((rank.get(n, -1) for n in given), default=-1)
    context = [
        read_rule_file(p)
        for p in shipped_rule_files()
        if p.name != "schema.egg" and p.name not in given and rank.get(p.name, 0) < last
    ]
    if context:
        # the shipped files in their own order, then the user's (a stable sort keeps theirs)
        load = sorted(context + files, key=lambda tf: rank.get(_shipped_name(tf[1]), len(SHIPPED)))
        try:
            return files, *_load(load, files)
        except RuleFileError as e:
            if "already bound" not in str(e) and "already declared" not in str(e):
                raise
    return files, *_load(files, files)


def _load(load, checked) -> tuple[Vocab, list[Obligation]]:
    session = EGraphSession()
    vocab = Vocab()
    schema_text, schema_name = read_rule_file(rule_file("schema.egg"))
    obligations(schema_text, schema_name, vocab)  # its declarations
    checked = {id(tf) for tf in checked}
    obs: list[Obligation] = []
    for item in load:
        text, filename = item
        if not _is_schema(filename):
            session.add_rules_text(text, filename)
        try:
            found = obligations(text, filename, vocab)
        except SexprError as e:
            lines = text.splitlines()
            src = lines[e.line - 1] if 0 < e.line <= len(lines) else None
            raise RuleFileError(e.message, filename, e.line, e.col, src) from None
        if id(item) in checked:
            obs += found  # a context file: its declarations only
    return vocab, obs


# ---------------------------------------------------------------- checking one obligation


@dataclass
class Settings:
    space: Space = field(default_factory=Space)
    points: int = 2  # random points per assignment (plus one of special values)
    rtol: float = 1e-7
    atol: float = 1e-9
    fd_rtol: float = 1e-4  # for Adjoint terms (central differences)
    fd_atol: float = 1e-6
    symbolic_seconds: float = 20.0  # per rule; beyond it the rest is numeric only
    seed: int = 0


def _describe(asg: dict) -> str:
    parts = []
    for k, v in asg.items():
        if isinstance(v, TensorType):
            parts.append(f"{k}: {v}")
        else:
            parts.append(f"{k} = {v!r}")
    return ", ".join(parts) or "(no variables)"


def _fmt(a) -> str:
    a = np.asarray(a)
    if a.dtype == object:
        return str(a.tolist())
    text = np.array2string(a, precision=6, separator=", ", max_line_width=10**6)
    return " ".join(text.split())


def _scalar(v) -> str:
    v = np.asarray(v)[()]
    return str(bool(v)) if isinstance(v, (bool, np.bool_)) else repr(float(v))


def _constant(ob: Obligation, asg: dict, name: str):
    c = ob.constants.get(name)
    return None if c is None else asg[c]


def causal_bias_value(shape, symbolic: bool) -> np.ndarray:
    """The additive causal mask of this shape: 0 where key j <= query i on the last two axes,
    -inf (sympy's -oo when symbolic) above. Rules guard the rank; below 2 every entry is 0."""
    out = np.zeros(shape, dtype=object if symbolic else np.float64)
    if len(shape) >= 2:
        m, n = shape[-2:]
        above = np.broadcast_to(np.arange(n)[None, :] > np.arange(m)[:, None], shape)
        out[above] = -sp.oo if symbolic else -np.inf
    if symbolic:
        out[out == 0] = sp.Integer(0)
    return out


def causal_keep_value(shape, symbolic: bool) -> np.ndarray:
    """The bool causal keep mask of this shape: True where key j <= query i on the last two
    axes (sympy's true/false when symbolic); below rank 2 every entry is True."""
    keep = np.ones(shape, bool)
    if len(shape) >= 2:
        m, n = shape[-2:]
        keep = np.broadcast_to(np.arange(n)[None, :] <= np.arange(m)[:, None], shape).copy()
    if not symbolic:
        return keep
    out = np.empty(shape, dtype=object)
    for idx in np.ndindex(*shape):
        out[idx] = sp.true if keep[idx] else sp.false
    return out


def _point(ob: Obligation, asg: dict, rng, special: bool) -> dict[str, np.ndarray]:
    """float64 values of the tensor variables: random, or drawn from special values; index
    vectors (search.index_variables) all zeros, in range for any axis."""
    leaves = {}
    index = index_variables(ob)
    for k, t in asg.items():
        if not isinstance(t, TensorType):
            continue
        kind = ob.assumptions.get(k)
        c = _constant(ob, asg, k)
        if k in index:
            leaves[k] = np.zeros(t.shape, np.int32)
        elif kind == CAUSAL_BIAS:
            leaves[k] = causal_bias_value(t.shape, False)
        elif kind == CAUSAL_KEEP:
            leaves[k] = causal_keep_value(t.shape, False)
        elif c is not None:
            leaves[k] = np.full(t.shape, c, dtype=bool if t.dtype is DType.bool else np.float64)
        elif t.dtype is DType.bool:
            leaves[k] = rng.random(t.shape) < 0.5
        elif t.dtype is DType.i32:
            leaves[k] = rng.integers(-3, 4, t.shape)
        elif special:
            leaves[k] = rng.choice(SPECIAL[kind], t.shape)
        else:
            lo, hi = {"positive": (0.25, 2.5), "nonneg": (0.0, 2.5)}.get(kind, (-2.5, 2.5))
            v = rng.uniform(lo, hi, t.shape)
            if kind == "nonzero":
                v = np.where(np.abs(v) < 0.1, 0.5, v)
            leaves[k] = v
    return leaves


def _symbols(ob: Obligation, asg: dict) -> dict[str, np.ndarray]:
    """sympy values of the tensor variables: fresh symbols (with the assumptions) or constants."""
    leaves = {}
    index = index_variables(ob)
    for k, t in asg.items():
        if not isinstance(t, TensorType):
            continue
        c = _constant(ob, asg, k)
        if ob.assumptions.get(k) == CAUSAL_BIAS:
            leaves[k] = causal_bias_value(t.shape, True)
        elif ob.assumptions.get(k) == CAUSAL_KEEP:
            leaves[k] = causal_keep_value(t.shape, True)
        elif k in index or c is not None:  # index vectors: zeros (as _point)
            arr = np.empty(t.shape, dtype=object)
            for idx in np.ndindex(t.shape):
                arr[idx] = number(0 if k in index else c, t.dtype)
            leaves[k] = arr
        else:
            leaves[k] = symbol_array(
                k, t.shape, t.dtype, **SYMBOL_ASSUMPTIONS.get(ob.assumptions.get(k), {})
            )
    return leaves


def _mismatch(l, r, rtol, atol):
    """Index of the first element where l and r differ, or None. Where both are undefined
    (NaN or infinite, e.g. both divide by zero) they agree; an undefined left side with a
    finite right side does not (the rewrite would invent a value)."""
    l = np.asarray(l, dtype=np.float64)
    r = np.asarray(r, dtype=np.float64)
    both_undefined = ~np.isfinite(l) & ~np.isfinite(r)
    with np.errstate(all="ignore"):
        close = np.abs(l - r) <= atol + rtol * np.maximum(np.abs(l), np.abs(r))
    bad = ~(both_undefined | close)
    if not bad.any():
        return None
    return tuple(int(i) for i in np.argwhere(bad)[0])


def _is_adjoint(e) -> bool:
    return getattr(e, "head", None) == "Adjoint"


def _holds(kind: str, v) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    return {"positive": v > 0, "nonneg": v >= 0, "nonzero": v != 0}[kind]


class RuleChecker:
    def __init__(self, vocab: Vocab, settings: Settings | None = None):
        self.ev = Evaluator(vocab)
        self.settings = settings or Settings()
        self.prover = ZeroProver()

    def check(self, ob: Obligation) -> RuleResult:
        try:
            return self._check(ob)
        except (ArithmeticError, ValueError, TypeError, IndexError, KeyError, DlvmError) as e:
            # a crash while evaluating a well-typed instance is a bug (ours or the op table's)
            return RuleResult(
                ob.where,
                ob.text,
                FAILED,
                f"error while checking: {type(e).__name__}: {e}",
                ruleset=ob.ruleset,
                direction=ob.direction,
                name=ob.name,
            )

    def _check(self, ob: Obligation) -> RuleResult:
        res = RuleResult(
            ob.where, ob.text, SKIPPED, ruleset=ob.ruleset, direction=ob.direction, name=ob.name
        )
        if ob.definition:
            res.status, res.detail = DEFINITION, ob.definition
            return res
        if ob.skip:
            res.detail = ob.skip
            return res
        if not ob.claims:
            res.status, res.detail = NOTHING, "no union, set or sign claim among its actions"
            return res
        s = self.settings
        rank = required_rank(ob)
        for space in (s.space, s.space.widened(3), s.space.widened(4), s.space.for_windows()):
            if rank > max(len(x) for x in space.shapes()):
                continue  # no shape of this space has the rank a guard asks for: none found
            asgs, truncated = assignments(ob, self.ev, space)
            if asgs:
                break
        else:
            res.detail = (
                f"no assignment of its variables (ranks 0-{s.space.max_rank} with "
                f"dims {', '.join(map(str, s.space.dims))}, ranks 3-4 with dims 1, 2, "
                "rank 4 with dims 1, 3 and 3x3 or 1x3 windows) "
                "type-checks and satisfies its guards"
            )
            return res
        res.assignments = len(asgs)
        failure = self._typed(ob, asgs) or self._numeric(ob, asgs)
        if failure:
            res.status, res.detail = FAILED, failure
            return res
        if ob.numeric:  # a lemma declared beyond sympy: numeric agreement is the check
            res.status = NUMERIC_ONLY
            res.detail = (
                f"declared numeric-only ({ob.numeric}); all {len(asgs)} assignments agree "
                "numerically"
            )
        else:
            res.status, res.detail, res.symbolic = self._symbolic(ob, asgs)
        if truncated:
            res.detail = (
                res.detail + "\n" if res.detail else ""
            ) + f"(checked {len(asgs)} assignments sampled from a larger set)"
        return res

    # -------------------------------------------------- types
    def _typed(self, ob: Obligation, asgs: list[dict]) -> str | None:
        for asg in asgs:
            types: dict = {}
            for c in ob.claims:
                where = f"claim {c.text}\n  assignment: {_describe(asg)}"
                if c.kind == "set" and c.lhs.head not in ANALYSES:
                    try:  # a function of primitives, e.g. (prefix-size s k)
                        got, want = self.ev.prim(c.lhs, asg, types), self.ev.prim(c.rhs, asg, types)
                    except Untypable as e:
                        return f"the claim does not evaluate: {e}\n  {where}"
                    if got != want:
                        return f"{pshow(c.lhs)} is {got!r}, the rule sets {want!r}\n  {where}"
                    continue
                target = c.lhs.args[0] if c.kind == "set" else c.lhs
                try:
                    lt = self.ev.type(target, asg, types)
                except Untypable as e:
                    return f"the left side does not type-check: {e}\n  {where}"
                if c.kind == "set":
                    try:
                        want = self.ev.prim(c.rhs, asg, types)
                    except Untypable as e:
                        return f"the value does not evaluate: {e}\n  {where}"
                    if c.lhs.head == "shape":
                        got, want = tuple(lt.shape), tuple(want)
                    else:
                        got = str(lt.dtype)
                    if got != want:
                        return (
                            f"{pshow(c.lhs)} is {got!r} by the op table, the rule sets "
                            f"{want!r}\n  {where}"
                        )
                elif c.kind == "cval":
                    try:
                        self.ev.prim(c.rhs, asg, types)
                    except Untypable as e:
                        return f"the value does not evaluate: {e}\n  {where}"
                elif c.kind == "union":
                    try:
                        rt = self.ev.type(c.rhs, asg, types)
                    except Untypable as e:
                        return f"the right side does not type-check: {e}\n  {where}"
                    if lt != rt:
                        return f"the sides have different types: left {lt}, right {rt}\n  {where}"
        return None

    # -------------------------------------------------- numbers
    def _numeric(self, ob: Obligation, asgs: list[dict]) -> str | None:
        s = self.settings
        rng = np.random.default_rng(s.seed)
        adjoint = ob.mentions_adjoint
        rtol, atol = (s.fd_rtol, s.fd_atol) if adjoint else (s.rtol, s.atol)
        checks = [c for c in ob.claims if c.kind in ("union", "assume", "cval")]
        if not checks:
            return None
        for asg in asgs:
            types: dict = {}
            kinds = [False] * s.points + ([] if adjoint else [True])
            for special in kinds:
                leaves = _point(ob, asg, rng, special)
                backend = NumpyBackend(leaves)
                memo: dict = {}
                for c in checks:
                    l = self.ev.value(c.lhs, asg, backend, memo, types)
                    if c.kind == "assume":
                        bad = ~_holds(c.rhs, l) & ~np.isnan(np.asarray(l, dtype=np.float64))
                        if bad.any():
                            k = tuple(int(i) for i in np.argwhere(bad)[0])
                            return self._counterexample(
                                ob,
                                c,
                                asg,
                                leaves,
                                k,
                                l,
                                None,
                                f"the value is not {ASSUMPTIONS[c.rhs]}",
                            )
                        continue
                    if c.kind == "cval":
                        r = np.full(np.shape(l), float(self.ev.prim(c.rhs, asg, types)))
                    else:
                        r = self.ev.value(c.rhs, asg, backend, memo, types)
                    if _is_adjoint(c.lhs):  # outside the forward op's domain: no claim
                        l = np.where(np.isfinite(np.asarray(l, dtype=np.float64)), l, r)
                    k = _mismatch(l, r, rtol, atol)
                    if k is not None:
                        return self._counterexample(ob, c, asg, leaves, k, l, r, "")
        return None

    @staticmethod
    def _counterexample(ob, c, asg, leaves, k, l, r, note) -> str:
        head = f"{c.text} does not hold: {note}" if r is None else f"not an identity: {c.text}"
        lines = [head, f"  assignment: {_describe(asg)}", "  counterexample:"]
        for name, v in leaves.items():
            lines.append(f"    {name} = {_fmt(v)}")
        at = f"[{', '.join(map(str, k))}]" if k else ""
        lv = np.asarray(l)[k]
        text = f"  left{at} = {_scalar(lv)}"
        if r is not None:
            rv = np.asarray(r)[k]
            text += f", right{at} = {_scalar(rv)}"
        lines.append(text)
        if r is not None and not np.isfinite(np.float64(lv)) and np.isfinite(np.float64(rv)):
            lines.append(
                "  (the left side is undefined here but the right side is not; "
                "a guard such as (nonzero x) or (positive x) may be missing)"
            )
        return "\n".join(lines)

    # -------------------------------------------------- exact
    def _symbolic(self, ob: Obligation, asgs: list[dict]) -> tuple[str, str, int]:
        deadline = time.monotonic() + self.settings.symbolic_seconds
        worst, detail, done = PROVEN, "", 0
        checks = [c for c in ob.claims if c.kind in ("union", "assume", "cval")]
        if not checks:
            return PROVEN, "", len(asgs)
        for asg in asgs:
            if time.monotonic() > deadline:
                return (
                    NUMERIC_ONLY,
                    (
                        f"sympy proved {done} of {len(asgs)} assignments within "
                        f"{self.settings.symbolic_seconds:.0f} s; all "
                        f"{len(asgs)} agree numerically"
                    ),
                    done,
                )
            backend = SympyBackend(_symbols(ob, asg))
            memo: dict = {}
            types: dict = {}
            for c in checks:
                l = self.ev.value(c.lhs, asg, backend, memo, types)
                if c.kind == "assume":
                    st, residual = self._sign(c.rhs, l)
                else:
                    if c.kind == "cval":
                        v = number(
                            self.ev.prim(c.rhs, asg, types), self.ev.type(c.lhs, asg, types).dtype
                        )
                        r = np.full(np.shape(l), v, dtype=object)
                    else:
                        r = self.ev.value(c.rhs, asg, backend, memo, types)
                    st, residual = PROVEN, None
                    for k in np.ndindex(l.shape):
                        d = sp.sympify(to_number(l[k])) - sp.sympify(to_number(r[k]))
                        e = self.prover.status(d)
                        if RANK[e] > RANK[st]:
                            st, residual = e, d
                        if st == UNPROVEN:
                            break
                if RANK[st] > RANK[worst]:
                    worst = st
                    if st == UNPROVEN:
                        detail = (
                            f"sympy could not show {c.text} for {_describe(asg)}; "
                            f"residual: {residual}"
                        )
                    elif st == NUMERIC_ONLY:
                        detail = (
                            f"sympy ran out of time on {c.text} for {_describe(asg)}; "
                            "it agrees numerically"
                        )
            done += 1
        if worst == PROVEN_AE:
            detail = (
                "equal wherever the compared values are ordered (proven region by region; "
                "ties, a set of measure zero, are not checked)"
            )
        return worst, detail, done

    def _sign(self, kind, values) -> tuple[str, object]:
        attr = {"positive": "is_positive", "nonneg": "is_nonnegative", "nonzero": "is_nonzero"}[
            kind
        ]
        for v in np.asarray(values).flat:
            if getattr(sp.sympify(to_number(v)), attr) is not True:
                return UNPROVEN, v
        return PROVEN, None


# ---------------------------------------------------------------- entry point


def verify_rules(sources, *, settings: Settings | None = None, strict: bool = False) -> RulesReport:
    """Check every rule of the given rule files (paths, or egglog text) on small symbolic tensors.

    Raises RuleFileError for a file egglog rejects. With strict=True, raises VerificationError
    when a rule fails, is skipped or stays unproven; otherwise the report says so (`.ok`).
    """
    from . import VerificationError

    start = time.monotonic()
    files, vocab, obs = load_rule_files(sources)
    checker = RuleChecker(vocab, settings)
    report = RulesReport([name for _, name in files])
    for ob in obs:
        report.results.append(checker.check(ob))
    report.seconds = time.monotonic() - start
    if strict and not report.ok_strict:
        raise VerificationError(report.render())
    return report


__all__ = [
    "FAILED",
    "SKIPPED",
    "RuleChecker",
    "RuleResult",
    "RulesReport",
    "Settings",
    "load_rule_files",
    "verify_rules",
]
