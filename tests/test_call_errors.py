"""Calling a jitted (or differentiated) function wrongly is a DlvmError that names the
function's signature and the argument: too few or too many arguments, None or a dict where
the function uses an array. Python's TypeError from inside the trace, or "matmul of shapes ()"
(numpy reads None as a 0-d object array), named neither."""

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.errors import DlvmError


def loss(w, x):
    return dq.sum(dq.tanh(x @ w))


def model(params, x):
    return dq.sum(x @ params["w"] + params["b"])


W = np.ones((4, 3), np.float32)
X = np.ones((5, 4), np.float32)


@pytest.mark.parametrize(
    "wrap", [dq.jit, lambda f: dq.jit(dq.grad(f)), dq.grad], ids=["jit", "jit-grad", "grad"]
)
@pytest.mark.parametrize(
    "args,message",
    [
        ((W,), r"loss(_grad)?\(w, x\) called with 1 argument: missing a required argument: 'x'"),
        ((W, X, X), r"loss(_grad)?\(w, x\) called with 3 arguments: too many positional arguments"),
        ((None, X), r"loss(_grad)?\(w, x\): argument w is None, used where an array is expected"),
        ((W, None), r"loss(_grad)?\(w, x\): argument x is None, used where an array is expected"),
        (
            ({"a": W}, X),
            r"loss(_grad)?\(w, x\): argument w is a dict with keys \['a'\], used where",
        ),
    ],
    ids=["too-few", "too-many", "None-w", "None-x", "dict"],
)
def test_wrong_calls_name_the_signature_and_the_argument(wrap, args, message):
    f = wrap(loss)
    with pytest.raises(DlvmError, match=message):
        f(*args)
    assert np.isfinite(f(W, X)).all()  # the function itself is fine


def test_the_argument_inside_a_pytree_is_named():
    f = dq.jit(model)
    with pytest.raises(DlvmError, match=r"model\(params, x\): argument params\['b'\] is None"):
        f({"w": W, "b": None}, X)
    assert f({"w": W, "b": np.zeros(3, np.float32)}, X) == pytest.approx(60.0)


def test_keywords_that_do_not_fit():
    f = dq.jit(loss)
    with pytest.raises(DlvmError, match=r"jit: loss\(w, x\) called with 2 arguments"):
        f(W, y=X)
    assert f(W, x=X) == pytest.approx(f(W, X))


def test_none_made_inside_the_function_is_located_there():
    def uses_none(x):
        return dq.sum(x @ None)

    with pytest.raises(DlvmError, match="an operand is None, not an array or a number") as e:
        dq.jit(uses_none)(X)
    assert "test_call_errors.py:" in str(e.value) and "argument" not in str(e.value)
