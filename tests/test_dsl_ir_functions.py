"""The staged DSL with IR functions: `dq.call_function` inlines an IR function (or a module's
`apply`) into a trace, nested traces capture values of the enclosing ones, and jit rebuilds
nested results; each traced program run by the reference interpreter (split from test_dsl.py)."""

from __future__ import annotations

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.ir import verify

RNG = np.random.default_rng(7)


def rand(*shape, dtype=np.float64, low=-2.0, high=2.0):
    return RNG.uniform(low, high, size=shape).astype(dtype)


def traced(fn, *args):
    """Trace `fn` on `args`, check the IR, run it with the reference interpreter."""
    module = dq.make_ir(fn)(*args)
    verify(module)
    (name,) = module.functions
    return dq.interpret(module, name, *args)


def test_call_function_inlines_ir_into_a_trace():
    f_ir = dq.trace(lambda x, w: (dq.tanh(x @ w), dq.sum(x)), [dq.spec((2, 3)), dq.spec((3, 4))])
    assert f_ir.name == "lambda" and [p.name for p in f_ir.params] == ["x", "w"]

    def g(x, w):
        h, s = dq.call_function(f_ir, x, w)
        return h * s + dq.call_function(f_ir, 2.0 * x, w)[0]

    x, w = rand(2, 3, dtype=np.float32), rand(3, 4, dtype=np.float32)
    module = dq.make_ir(g)(x, w)
    assert [i.op for i in module["g"].body].count("tanh") == 2
    expected = np.tanh(x @ w) * x.sum() + np.tanh(2 * x @ w)
    np.testing.assert_allclose(dq.interpret(module, "g", x, w), expected, rtol=1e-5)
    np.testing.assert_allclose(dq.call_function(f_ir, x, w)[0], np.tanh(x @ w), rtol=1e-6)


def test_call_function_checks_types():
    f_ir = dq.trace(dq.exp, [dq.spec((3,))])
    with pytest.raises(dq.TracingError, match="expects <3 x f32>"):
        dq.make_ir(lambda x: dq.call_function(f_ir, x))(dq.spec((4,)))


def test_nested_trace_with_closure_capture():
    """What `dq.grad(lambda w: loss(w, x))` inside a jit needs: x is captured."""

    def outer(w, x):
        inner, captured = dq.trace_closure(lambda w: dq.sum(w * x), [w])
        assert len(captured) == 1 and captured[0] is x
        return dq.call_function(inner, w, *captured)

    w, x = rand(3), rand(3)
    np.testing.assert_allclose(traced(outer, w, x), np.sum(w * x), rtol=1e-12)
    with pytest.raises(dq.TracingError, match="enclosing trace"):
        dq.make_ir(lambda w, x: dq.call_function(dq.trace(lambda v: v * x, [w]), w))(w, x)


def test_call_function_inlines_apply_from_a_module():
    from dlvm_eq.ir import F64, FunctionBuilder, tensor

    module = dq.make_ir(lambda v: (dq.exp(v), v * 2.0))(dq.spec((3,), "f64"))
    b = FunctionBuilder("outer", [tensor(3, F64)], ["x"])
    pair = b.emit("apply", [b.params[0]], callee="lambda", type=module["lambda"].result_type)
    first = b.emit("extract", [pair], index=0)
    module.add(b.finish(b.emit("add", [first, b.emit("extract", [pair], index=1)])))
    x = rand(3)
    traced_ir = dq.make_ir(lambda x: dq.call_function(module["outer"], x, module=module))(x)
    assert [i.op for i in traced_ir["lambda"].body] == ["exp", "multiply", "add"]
    np.testing.assert_allclose(dq.interpret(traced_ir, "lambda", x), np.exp(x) + 2 * x)
    np.testing.assert_allclose(dq.interpret(module, "outer", x), np.exp(x) + 2 * x)


def test_shape_metadata_drives_python_control_flow():
    def f(x):
        assert x.dtype == np.float32 and x.ndim == 2 and x.size == 6
        for _ in range(x.shape[0]):  # unrolled twice
            x = dq.sigmoid(x)
        return x if x.shape[1] == 3 else -x

    module = dq.make_ir(f)(dq.spec((2, 3)))
    assert [i.op for i in module["f"].body] == ["sigmoid", "sigmoid"]


def test_bad_dtypes_are_project_errors():
    with pytest.raises(dq.DlvmError, match="not a dtype"):
        dq.make_ir(lambda x: x.astype("f16"))(dq.spec((2,)))
    with pytest.raises(dq.DlvmError, match="not supported"):
        dq.exp(np.array(["a"]))


def test_captures_through_two_nested_traces():
    def outer(a, b):
        def middle(u):
            inner, caps = dq.trace_closure(lambda v: v * b + a, [u])
            return dq.call_function(inner, u, *caps)

        mid, caps = dq.trace_closure(middle, [a])
        assert len(mid.params) == 3  # u, then a and b captured from `outer`
        return dq.call_function(mid, a, *caps)

    a, b = rand(3), rand(3)
    np.testing.assert_allclose(traced(outer, a, b), a * b + a, rtol=1e-12)


def test_jit_rebuilds_nested_results():
    import dlvm_eq as dq

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = dq.jit(lambda x: (dq.sum(x), [x * 2, (x + 1,)]), target="interp")(a)
    assert isinstance(out, tuple) and isinstance(out[1], list) and isinstance(out[1][1], tuple)
    np.testing.assert_allclose(out[0], 15.0)
    np.testing.assert_allclose(out[1][1][0], a + 1)
