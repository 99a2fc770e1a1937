"""Compiling from any thread: egglog sessions per thread, trace state per thread (contextvars),
one compile per jit signature, and no BaseException from egglog reaching the user."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from at_once import run_at_once

import dlvm_eq as dq
from dlvm_eq.egraph import load_bindings
from dlvm_eq.errors import DlvmError
from dlvm_eq.ir.interp import interpret

X = np.linspace(-1.5, 1.5, 12).reshape(3, 4)


def _family(k: float):
    """A function no other test compiles (its constant is its own), so compiles are cold."""

    def f(a, b):
        return dq.tanh(a * k) * b + dq.exp(-(a * a)) / (b * b + 1.0)

    f.__name__ = f"family_{str(k).replace('.', '_')}"
    return f


def _reference(fn, *args):
    """The numpy interpreter in float64 on the traced program."""
    module = dq.make_ir(fn)(*(a.astype(np.float32) for a in args))
    return interpret(module, module.name, *(a.astype(np.float64) for a in args))


def test_four_threads_cold_compile_different_functions():
    fns = [dq.jit(_family(1.25 + 0.5 * i)) for i in range(4)]
    b = (X + 2.0).astype(np.float32)
    a = X.astype(np.float32)
    out: dict[int, np.ndarray] = {}
    errors = run_at_once(lambda i: out.__setitem__(i, fns[i](a, b)))
    assert errors == []
    for i, f in enumerate(fns):
        want = _reference(f.fn, a, b)
        np.testing.assert_allclose(out[i], want, rtol=2e-5, atol=2e-6)


def test_four_threads_first_call_of_one_function_compile_it_once():
    traced = []

    def g(a, b):
        traced.append(threading.get_ident())  # runs once per trace, on the tracing thread
        return _family(3.75)(a, b) + a

    f = dq.jit(g)
    a, b = X.astype(np.float32), (X * X + 0.5).astype(np.float32)
    out: dict[int, np.ndarray] = {}
    errors = run_at_once(lambda i: out.__setitem__(i, f(a, b)))
    assert errors == []
    assert len(traced) == 1 and f.cache_size() == 1  # one thread compiled, the others waited
    want = _reference(g, a, b)
    for i in range(4):
        np.testing.assert_allclose(out[i], want, rtol=2e-5, atol=2e-6)


def test_compile_on_another_thread_after_the_main_thread_compiled():
    a, b = X.astype(np.float32), (X + 3.0).astype(np.float32)
    first = dq.jit(_family(5.5))
    np.testing.assert_allclose(first(a, b), _reference(first.fn, a, b), rtol=2e-5, atol=2e-6)
    second = dq.jit(_family(6.5))  # a new function: its first compile needs an e-graph
    out = {}
    errors = run_at_once(lambda i: out.__setitem__(i, second(a, b)), n=1)
    assert errors == []
    np.testing.assert_allclose(out[0], _reference(second.fn, a, b), rtol=2e-5, atol=2e-6)


def test_traces_on_several_threads_overlap_without_sharing_state():
    """Each thread is inside its own trace while the others are inside theirs."""
    inside = threading.Barrier(4)
    modules = {}

    def work(i):
        def h(x):
            y = dq.exp(x) * float(i + 1)
            inside.wait(timeout=60)  # every thread is mid-trace here
            return y + dq.tanh(x)

        modules[i] = dq.make_ir(h)(X.astype(np.float32))

    assert run_at_once(work) == []
    for i, m in modules.items():
        got = interpret(m, m.name, X)
        np.testing.assert_allclose(
            got, np.exp(X) * (i + 1) + np.tanh(X), rtol=1e-5, atol=1e-6
        )  # f32
    assert not dq.is_tracing()


def test_an_egglog_panic_is_a_dlvm_error_and_retires_the_session():
    load_bindings()
    from dlvm_eq.egraph.session import EgglogPanic, EGraphSession

    s = EGraphSession()
    with pytest.raises(EgglogPanic, match="egglog failed"):  # egglog panics on an unknown ruleset
        s.run_text("(run-schedule (run no_such_ruleset))")
    assert issubclass(EgglogPanic, DlvmError) and s.broken
    with pytest.raises(EgglogPanic, match="cannot be used again"):
        s.run_text("(print-size)")


def test_a_session_refuses_another_thread():
    load_bindings()
    from dlvm_eq.egraph.session import EGraphSession

    s = EGraphSession()
    errors = run_at_once(lambda i: s.run_text("(print-size)"), n=1)
    assert len(errors) == 1 and isinstance(errors[0], DlvmError)
    assert "thread" in str(errors[0])
    s.run_text("(print-size)")  # still fine on its own thread
