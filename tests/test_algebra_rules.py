"""rules/algebra.egg, one ruleset at a time: an input term becomes equal to the expected term
(and guarded rules leave unsafe inputs alone)."""

from __future__ import annotations

import pytest

from dlvm_eq.egraph import RuleFileError
from dlvm_eq.egraph.optimize import scratch_session
from dlvm_eq.egraph.ruleset_schedule import ALGEBRA_RULESETS, Budget, Schedule
from dlvm_eq.egraph.saturate import saturate

SHAPES = {
    "x": (2, 3),
    "y": (2, 3),
    "s": (),
    "c": (),
    "A": (4, 5),
    "B": (5, 6),
    "C": (6, 3),
    "D": (5, 6),
    "E": (4, 5),
    "M": (4, 5),
    "v": (5,),
    "w": (4,),
    "u": (3, 1),
    "T": (2, 3, 4),
    "X": (7, 6),
    "U": (7, 2),
    "V": (6, 2),
}


def _vec(shape) -> str:
    return "(vec-of " + " ".join(map(str, shape)) + ")" if shape else "(vec-empty)"


def _decls(dtype: str = "f32") -> str:
    return "".join(
        f'(let ${n} (Var "{n}")) (set (shape ${n}) {_vec(s)}) (set (dtype ${n}) "{dtype}")\n'
        for n, s in SHAPES.items()
    )


def equal_after(
    term: str, expected: str, rulesets, iterations: int = 8, dtype: str = "f32"
) -> bool:
    """Whether `term` and `expected` share an e-class after running only `rulesets`."""
    with scratch_session() as s:
        s.run_text(_decls(dtype) + f"(let $t {term})\n(let $e {expected})")
        saturate(s, Schedule(tuple(rulesets)), Budget(iterations=iterations))
        try:
            s.run_text("(check (= $t $e))")
            return True
        except RuleFileError:
            return False


def present_after(term: str, probe: str, rulesets, iterations: int = 8) -> bool:
    """Whether `probe` exists in `term`'s e-class (check does not insert terms)."""
    return equal_after(term, probe, rulesets, iterations)


def S(m: str) -> str:  # the sum of all elements of a matrix, as the loader writes it
    return f'(Reduce (Reduce {m} "add" 0.0 1) "add" 0.0 0)'


def K(v: float, shape=(2, 3), dtype="f32") -> str:  # a scalar constant broadcast to a shape
    return f'(Broadcast (Const {v!r} "{dtype}") {_vec(shape)})'


T2 = "(vec-of 1 0)"

CASES = [
    # ---- identities
    ("identities", f"(Add $x {K(0.0)})", "$x"),
    ("identities", f"(Add {K(0.0)} $x)", "$x"),
    ("identities", f"(Subtract $x {K(0.0)})", "$x"),
    ("identities", f"(Subtract {K(0.0)} $x)", "(Negate $x)"),
    ("identities", f"(Multiply $x {K(1.0)})", "$x"),
    ("identities", f"(Multiply {K(1.0)} $x)", "$x"),
    ("identities", f"(Multiply $x {K(0.0)})", K(0.0)),
    ("identities", f"(Multiply $x {K(-1.0)})", "(Negate $x)"),
    ("identities", f"(Divide $x {K(1.0)})", "$x"),
    ("identities", "(Subtract $x $x)", K(0.0)),
    ("identities", "(Subtract $s $s)", '(Const 0.0 "f32")'),
    ("identities", "(Divide (Exp $x) (Exp $x))", K(1.0)),
    ("identities", f"(Divide (Add (Exp $x) {K(2.0)}) (Add (Exp $x) {K(2.0)}))", K(1.0)),
    ("identities", "(Negate (Negate $x))", "$x"),
    ("identities", "(Log (Exp $x))", "$x"),
    ("identities", "(Exp (Log (Exp $x)))", "(Exp $x)"),
    ("identities", f"(Power $x {K(0.0)})", K(1.0)),
    ("identities", f"(Power $x {K(1.0)})", "$x"),
    ("identities", f"(Power $x {K(2.0)})", "(Multiply $x $x)"),
    ("identities", f"(Power $x {K(0.5)})", "(Sqrt $x)"),
    ("identities", f"(Power $x {K(-0.5)})", "(Rsqrt $x)"),
    ("identities", f"(Power $x {K(-1.0)})", f"(Divide {K(1.0)} $x)"),
    ("identities", "(Square $x)", "(Multiply $x $x)"),
    ("identities", "(Add $x (Negate $y))", "(Subtract $x $y)"),
    ("identities", "(Negate (Subtract $x $y))", "(Subtract $y $x)"),
    ("identities", "(Select $x $x (LessThan $x $y))", "$x"),
    ("identities", "(Transpose $x (vec-of 0 1))", "$x"),
    ("identities", "(Transpose $s (vec-empty))", "$s"),
    ("identities", "(Broadcast $x (vec-of 2 3))", "$x"),
    ("identities", '(DataTypeCast $x "f32")', "$x"),
    (
        "identities",
        "(ShapeCast (ShapeCast $x (vec-of 6)) (vec-of 3 2))",
        "(ShapeCast $x (vec-of 3 2))",
    ),
    ("identities", '(Reduce $u "add" 0.0 1)', "(ShapeCast $u (vec-of 3))"),
    ("identities", f"(Dot $A {K(0.0, (5, 6))})", K(0.0, (4, 6))),
    # ---- fold
    ("fold", f"(Add {K(2.0)} {K(3.0)})", K(5.0)),
    ("fold", f"(Subtract {K(2.0)} {K(3.0)})", K(-1.0)),
    ("fold", f"(Divide {K(3.0)} {K(2.0)})", K(1.5)),
    (
        "fold",
        '(Multiply (Const 2.0 "f32") (Const 4.0 "f32"))',
        '(Broadcast (Const 8.0 "f32") (vec-empty))',
    ),
    ("fold", f"(Max {K(2.0)} (Negate {K(3.0)}))", K(2.0)),
    ("fold", f"(Multiply (Multiply $x {K(2.0)}) {K(3.0)})", f"(Multiply $x {K(6.0)})"),
    ("fold", f"(Transpose {K(2.0, (2, 3))} {T2})", K(2.0, (3, 2))),
    # ---- transpose
    ("transpose", f"(Transpose (Transpose $A {T2}) {T2})", "(Transpose $A (vec-of 0 1))"),
    (
        "transpose",
        "(Transpose (Transpose $T (vec-of 1 2 0)) (vec-of 2 0 1))",
        "(Transpose $T (vec-of 0 1 2))",
    ),
    (
        "transpose",
        f"(Transpose (Dot $A $B) {T2})",
        f"(Dot (Transpose $B {T2}) (Transpose $A {T2}))",
    ),
    (
        "transpose",
        f"(Dot (Transpose $B {T2}) (Transpose $A {T2}))",
        f"(Transpose (Dot $A $B) {T2})",
    ),
    ("transpose", f"(Exp (Transpose $A {T2}))", f"(Transpose (Exp $A) {T2})"),
    (
        "transpose",
        f"(Add (Transpose $A {T2}) (Transpose $E {T2}))",
        f"(Transpose (Add $A $E) {T2})",
    ),
    (
        "transpose",
        f"(Multiply (Transpose $A {T2}) (Broadcast $c (vec-of 5 4)))",
        f"(Transpose (Multiply $A (Broadcast $c (vec-of 4 5))) {T2})",
    ),
    # ---- matmul
    ("matmul", "(Dot (Dot $A $B) $C)", "(Dot $A (Dot $B $C))"),
    ("matmul", "(Dot $A (Dot $B $C))", "(Dot (Dot $A $B) $C)"),
    ("matmul", "(Dot (Dot $w $A) $B)", "(Dot $w (Dot $A $B))"),
    ("matmul", "(Add (Dot $A $B) (Dot $A $D))", "(Dot $A (Add $B $D))"),
    ("matmul", "(Add (Dot $A $B) (Dot $E $B))", "(Dot (Add $A $E) $B)"),
    ("matmul", "(Subtract (Dot $A $B) (Dot $A $D))", "(Dot $A (Subtract $B $D))"),
    (
        "matmul",
        "(Dot (Multiply $A (Broadcast $c (vec-of 4 5))) $B)",
        "(Multiply (Dot $A $B) (Broadcast $c (vec-of 4 6)))",
    ),
    (
        "matmul",
        "(Multiply (Dot $A $B) (Broadcast $c (vec-of 4 6)))",
        "(Dot $A (Multiply $B (Broadcast $c (vec-of 5 6))))",
    ),
    ("matmul", "(Dot (Negate $A) $B)", "(Negate (Dot $A $B))"),
    # ---- reduce
    (
        "reduce",
        '(Reduce (Broadcast $v (vec-of 4 5)) "add" 0.0 0)',
        '(Multiply (Broadcast $v (vec-of 5)) (Broadcast (Const 4.0 "f32") (vec-of 5)))',
    ),
    (
        "reduce",
        '(Reduce (Broadcast $u (vec-of 3 5)) "add" 0.0 1)',
        '(Multiply (Broadcast (ShapeCast $u (vec-of 3)) (vec-of 3)) (Broadcast (Const 5.0 "f32") (vec-of 3)))',
    ),
    ("reduce", '(Reduce (Broadcast $v (vec-of 4 5)) "max" -inf 0)', "(Broadcast $v (vec-of 5))"),
    (
        "reduce",
        '(Reduce (Reduce $T "add" 0.0 2) "add" 0.0 0)',
        '(Reduce (Reduce $T "add" 0.0 0) "add" 0.0 1)',
    ),
    (
        "reduce",
        '(Reduce (Reduce $T "max" -inf 0) "max" 1.5 1)',
        '(Reduce (Reduce $T "max" -inf 2) "max" 1.5 0)',
    ),
    (
        "reduce",
        '(Reduce (Add $A $E) "add" 2.0 1)',
        '(Add (Reduce $A "add" 2.0 1) (Reduce $E "add" 0.0 1))',
    ),
    (
        "reduce",
        '(Add (Reduce $A "add" 1.0 0) (Reduce $E "add" 2.0 0))',
        '(Reduce (Add $A $E) "add" 3.0 0)',
    ),
    (
        "reduce",
        '(Reduce (Multiply $A (Broadcast $c (vec-of 4 5))) "add" 0.0 1)',
        '(Multiply (Reduce $A "add" 0.0 1) (Broadcast $c (vec-of 4)))',
    ),
    ("reduce", f'(Reduce (Transpose $A {T2}) "add" 0.0 0)', '(Reduce $A "add" 0.0 1)'),
    # ---- sumproduct
    (
        "sumproduct",
        S(f"(Multiply $X (Dot $U (Transpose $V {T2})))"),
        S(f"(Multiply (Dot (Transpose $U {T2}) $X) (Transpose $V {T2}))"),
    ),
    (
        "sumproduct",
        S(f"(Multiply $X (Dot $U (Transpose $V {T2})))"),
        S(f"(Multiply $U (Dot $X (Transpose (Transpose $V {T2}) {T2})))"),
    ),
    (
        "sumproduct",
        S(f"(Multiply (Dot $U (Transpose $V {T2})) (Dot $U (Transpose $V {T2})))"),
        S(
            f"(Multiply (Dot (Transpose $U {T2}) $U) (Dot (Transpose $V {T2}) (Transpose (Transpose $V {T2}) {T2})))"
        ),
    ),
    # sigmoid's derivative from one sigmoid
    (
        "identities",
        "(Multiply (Sigmoid $x) (Sigmoid (Negate $x)))",
        "(Subtract (Sigmoid $x) (Square (Sigmoid $x)))",
    ),
    (
        "identities",
        "(Multiply (Sigmoid (Negate $x)) (Sigmoid $x))",
        "(Subtract (Sigmoid $x) (Square (Sigmoid $x)))",
    ),
    # ---- layout
    ("layout", f"(Dot (Transpose $M {T2}) $A)", "(Gemm $M $A 1 0)"),
    ("layout", f"(Dot $A (Transpose $D {T2}))", "(Gemm $A $D 0 1)"),
    ("layout", f"(Dot (Transpose $B {T2}) (Transpose $E {T2}))", "(Gemm $B $E 1 1)"),
]


@pytest.mark.parametrize("ruleset,term,expected", CASES, ids=[f"{r}:{t[:40]}" for r, t, _ in CASES])
def test_rewrites(ruleset, term, expected):
    assert equal_after(term, expected, [ruleset])


def test_square_of_difference_expands_in_f64_only():
    """S((X - UV^T)^2) = S(X^2) - 2 S(X * UV^T) + S(UV^T * UV^T) in f64; in f32 the expansion
    would cancel catastrophically, so the rule does not fire."""
    uvt = f"(Dot $U (Transpose $V {T2}))"
    d = f"(Subtract $X {uvt})"
    for dtype, fires in (("f64", True), ("f32", False)):
        expanded = (
            f'(Add (Subtract {S("(Multiply $X $X)")} (Multiply (Const 2.0 "{dtype}") '
            f"{S(f'(Multiply $X {uvt})')})) {S(f'(Multiply {uvt} {uvt})')})"
        )
        assert equal_after(S(f"(Multiply {d} {d})"), expanded, ["sumproduct"], dtype=dtype) is fires


# guards: unsafe or ill-shaped inputs are left alone
NEGATIVE = [
    ("identities", "(Divide $x $x)", K(1.0)),  # x may be 0
    ("identities", "(Exp (Log $x))", "$x"),  # x may be <= 0
    # sigmoid(x) * sigmoid(-y) for another y is no derivative
    (
        "identities",
        "(Multiply (Sigmoid $x) (Sigmoid (Negate $y)))",
        "(Subtract (Sigmoid $x) (Square (Sigmoid $x)))",
    ),
    ("identities", '(Reduce $A "add" 0.0 1)', "(ShapeCast $A (vec-of 4))"),  # axis is not 1 wide
    (
        "fold",
        '(Divide (Const 7.0 "i32") (Const 2.0 "i32"))',
        '(Broadcast (Const 3.5 "i32") (vec-empty))',
    ),
    ("matmul", "(Dot (Dot $M $v) $w)", "(Dot $M (Dot $v $w))"),  # the middle operand is a vector
    (
        "reduce",
        '(Reduce (Broadcast $u (vec-of 3 5)) "add" 0.0 0)',
        '(Multiply (Broadcast (ShapeCast $u (vec-of 1)) (vec-of 5)) (Broadcast (Const 3.0 "f32") (vec-of 5)))',
    ),
]


@pytest.mark.parametrize(
    "ruleset,term,unexpected", NEGATIVE, ids=[f"{r}:{t[:40]}" for r, t, _ in NEGATIVE]
)
def test_guards_hold(ruleset, term, unexpected):
    assert not equal_after(term, unexpected, [ruleset])
    assert not equal_after(term, unexpected, ALGEBRA_RULESETS)


def test_fold_skips_division_by_zero():
    assert not equal_after(f"(Divide {K(1.0)} {K(0.0)})", K(float("inf")), ["fold"])


def test_every_algebra_rule_is_named():
    """Reports name rules; an unnamed rule would show up as its whole text."""
    import re

    from dlvm_eq.egraph.rulefiles import rule_file

    text = rule_file("algebra.egg").read_text()
    rules = re.findall(r"^\(rule ", text, flags=re.M)
    names = re.findall(r':name "([^"]+)"', text)
    assert len(rules) == len(names) and len(set(names)) == len(names)
