"""verify_adjoint / verify_gradient: exact sympy checks of adjoint programs."""

from pathlib import Path

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.errors import DlvmError
from dlvm_eq.ir import F32, FunctionBuilder, tensor
from dlvm_eq.pipeline import verify_adjoint
from dlvm_eq.verify import VerificationError, verify_gradient


def _forward():
    """f(x) = sum(exp(x) * x)"""
    b = FunctionBuilder("f", [tensor(3, F32)], ["x"])
    (x,) = b.params
    e = b.emit("exp", [x])
    return b.finish(
        b.emit("reduce", [b.emit("multiply", [e, x])], combinator="add", init=0.0, axes=(0,))
    )


def _adjoint(correct: bool, seedable: bool = False):
    """d/dx sum(exp(x) x) = exp(x) x + exp(x) (the wrong one forgets the second term)."""
    types = [tensor(3, F32)] + ([tensor(F32)] if seedable else [])
    b = FunctionBuilder("f_grad", types, ["x", "seed"][: len(types)])
    x = b.params[0]
    e = b.emit("exp", [x])
    g = b.emit("multiply", [e, x])
    if correct:
        g = b.emit("add", [g, e])
    if seedable:
        g = b.emit("multiply", [g, b.params[1]])
    return b.finish(g)


def test_correct_hand_adjoint_is_accepted():
    report = verify_adjoint(_forward(), _adjoint(True), wrt=(0,), sympy_seconds=120.0)
    assert report.elements == 3 and report.exact
    assert "adjoint of @f" in str(report)


def test_wrong_hand_adjoint_is_rejected_with_a_point():
    with pytest.raises(VerificationError) as err:
        verify_adjoint(_forward(), _adjoint(False), wrt=(0,))
    msg = str(err.value)
    assert "gradient for parameter 0 (%x)" in msg and "expected" in msg and "computed" in msg
    assert isinstance(err.value, DlvmError)


def test_seedable_adjoint():
    verify_adjoint(_forward(), _adjoint(True, seedable=True), wrt=(0,), seedable=True)
    with pytest.raises(VerificationError):
        verify_adjoint(_forward(), _adjoint(False, seedable=True), wrt=(0,), seedable=True)
    with pytest.raises(VerificationError, match="parameters"):
        verify_adjoint(_forward(), _adjoint(True, seedable=True), wrt=(0,))


def test_keeping_checks_the_kept_output_too():
    b = FunctionBuilder("f_grad", [tensor(3, F32)], ["x"])
    (x,) = b.params
    e = b.emit("exp", [x])
    prod = b.emit("multiply", [e, x])
    value = b.emit("reduce", [prod], combinator="add", init=0.0, axes=(0,))
    adj = b.finish([value, b.emit("add", [prod, e])])
    verify_adjoint(_forward(), adj, wrt=(0,), keeping=(0,))
    b = FunctionBuilder("f_grad", [tensor(3, F32)], ["x"])
    (x,) = b.params
    e = b.emit("exp", [x])
    wrong = b.finish(
        [
            b.emit("reduce", [e], combinator="add", init=0.0, axes=(0,)),
            b.emit("add", [b.emit("multiply", [e, x]), e]),
        ]
    )
    with pytest.raises(VerificationError, match="kept output 0"):
        verify_adjoint(_forward(), wrong, wrt=(0,), keeping=(0,))


@pytest.mark.parametrize(
    "fn, shapes, argnums",
    [
        (lambda x, w: dq.sum(dq.tanh(x @ w)), [(2, 3), (3, 2)], (0, 1)),
        (lambda x: dq.sum(dq.sigmoid(x) * dq.log1p(x * x)), [(2, 2)], 0),
        (lambda x, b: dq.mean(dq.relu(x + b) ** 2.0), [(2, 3), (3,)], (0, 1)),
        (lambda x: dq.logsumexp(x), [(3,)], 0),
    ],
)
def test_verify_gradient_of_generated_adjoints(fn, shapes, argnums):
    report = verify_gradient(fn, shapes, argnums=argnums)
    assert report.elements == sum(
        int(np.prod(shapes[i])) for i in ((argnums,) if isinstance(argnums, int) else argnums)
    )


def test_declared_adjoint_of_an_example_program():
    path = Path(__file__).parent.parent / "examples" / "logreg.dl"
    if not path.exists():
        pytest.skip("examples/logreg.dl is not there")
    m = dq.load(path)
    declared = [f for f in m.functions.values() if f.adjoint is not None]
    assert declared
    for fn in declared:
        d = fn.adjoint
        report = verify_adjoint(
            m[d.of],
            fn,
            wrt=d.wrt,
            module=m,
            seedable=d.seedable,
            keeping=d.keeping,
            from_index=d.from_index,
            # exactness is sympy's verdict, not the machine's speed: the default 4 s per
            # element ran out on a loaded core (a logistic loss over 8 rows, 1.5 s quiet)
            sympy_seconds=120.0,
        )
        assert report.exact, str(report)
