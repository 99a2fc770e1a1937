"""`dlvm-eq query` on inputs a user can type by mistake: numbers past the dtype's range, terms
nested past the stated depth, budgets that could never stop anything. Each ends with one
message and a non-zero exit, before egglog sees the term; the limits themselves still work."""

import pytest

from dlvm_eq.cli import main
from dlvm_eq.egraph.query import MAX_DEPTH, nesting_depth


def cli(capsys, *argv):
    code = main([str(a) for a in argv])  # an exception here (a traceback) fails the test
    out, err = capsys.readouterr()
    return code, out, err


DEEP = MAX_DEPTH + 300


@pytest.mark.parametrize(
    "expression,message",
    [
        ("A * 1e999", "a number is not a finite f32 (it reads as inf)"),
        ("1e999", "a number is not a finite f32"),
        ("A * 1e39", "a number is not a finite f32"),  # finite as f64, not as f32
        ("(Multiply A (Const nan))", "a number is not a finite f32 (it reads as nan)"),
        ("A" + " + A" * DEEP, f"nested more than {MAX_DEPTH} levels deep"),
        ("A" + " * 2" * 5000, "nested more than"),  # deeper than CPython's own parser goes
        ("(Exp " * DEEP + "A" + ")" * DEEP, "nested more than"),
        ("exp(" * DEEP + "A" + ")" * DEEP, "nested more than"),
    ],
    ids=["overflow", "overflow-literal", "f32-overflow", "nan", "sum", "chain", "sexpr", "calls"],
)
def test_unreadable_expressions_are_one_message(capsys, expression, message):
    code, out, err = cli(capsys, "query", expression, "--shape", "A=3x4")
    assert code == 1 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "budget", ["seconds=nan", "seconds=-1", "seconds=0", "seconds=inf", "nodes=0", "iterations=-2"]
)
def test_budgets_that_bound_nothing_are_usage_errors(capsys, budget):
    code, out, err = cli(capsys, "query", "A * 2", "--shape", "A=3x4", "--budget", budget)
    assert code == 2 and out == ""
    assert f"argument --budget: {budget!r}:" in err and "above 0" in err


def test_depth_is_measured_without_recursion():
    assert nesting_depth("A") == 1
    assert nesting_depth("(Dot (Dot A B) C)") == 2
    assert nesting_depth("A + A + A") == 3
    assert nesting_depth("sum(X * (U @ V.T))") == 5  # sum( * ( @ .T V
    assert nesting_depth("A" + " + A" * 100_000) == MAX_DEPTH + 1  # CPython's parser gives up


def test_at_the_limit_a_query_still_runs(capsys):
    code, out, err = cli(
        capsys, "query", "A" + " + A" * (MAX_DEPTH - 1), "--shape", "A=3x4", "-k", "0"
    )
    assert code == 0, err
    assert out.startswith("input:  A + A + A")
    code, out, err = cli(capsys, "query", "A * 1e38", "--shape", "A=3x4", "-k", "0")
    assert code == 0 and "best:   A * 9.99999968" in out, out + err  # f32 of 1e38
    code, out, err = cli(capsys, "query", "A * 1e39", "--shape", "A=3x4", "--dtype", "f64")
    assert code == 0, err
