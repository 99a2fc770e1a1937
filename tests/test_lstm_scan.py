"""An LSTM's value and gradient through dq.scan (benchmarks/rnn.py's cell, small sizes): equal
to float64 PyTorch autograd on the same formula and to the interpreter, and compiled without
the copies ad/scan_residuals.py and ir/loop_sums.py avoid (issue 30): the forward step stores
h, not h^T; the weight gradients are one product each after the loop, reading that stack
transposed, with no zero added; the step stores h, c, the gates and the tanhs, and the
adjoint step recomputes their derivatives. Random scan bodies check the residual choices
against the unrolled program; rules/algebra.egg's s(z) * s(-z) = s - s^2 is checked on a
straight gradient."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.ir import interpret
from dlvm_eq.ir.control_flow import reachable_bodies
from dlvm_eq.ir.loop_rules import apply_loop_rules
from dlvm_eq.pipeline.adjoints import resolve_adjoints
from dlvm_eq.pipeline.loops import optimized_with_bodies

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(30)
B, I, H, T = 3, 4, 8, 5
GATES = "ifoc"


def _cell(np_, sigmoid, p, hc, x):
    h, c = hc
    i = sigmoid(x @ p["wi"] + h @ p["ui"])
    f = sigmoid(x @ p["wf"] + h @ p["uf"])
    o = sigmoid(x @ p["wo"] + h @ p["uo"])
    c = f * c + i * np_.tanh(x @ p["wc"] + h @ p["uc"])
    return o * np_.tanh(c), c


def _args():
    p = {}
    for g in GATES:
        p[f"w{g}"] = (RNG.standard_normal((I, H)) * 0.5).astype(np.float32)
        p[f"u{g}"] = (RNG.standard_normal((H, H)) * 0.5).astype(np.float32)
    h0 = RNG.standard_normal((B, H)).astype(np.float32)
    xs = RNG.standard_normal((T, B, I)).astype(np.float32)
    return p, h0, xs


def loss(p, h0, xs):
    def step(hc, x):
        hc = _cell(dq, dq.sigmoid, p, hc, x)
        return hc, hc[0]

    _, ys = dq.scan(step, (h0, h0 * 0.5), xs)
    return dq.mean(ys * ys)


def _torch_float64(p, h0, xs):
    tp = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in p.items()}
    hc = (torch.tensor(h0, dtype=torch.float64), torch.tensor(h0, dtype=torch.float64) * 0.5)
    ys = []
    for x in torch.tensor(xs, dtype=torch.float64):
        hc = _cell(torch, torch.sigmoid, tp, hc, x)
        ys.append(hc[0])
    value = torch.mean(torch.stack(ys) ** 2)
    value.backward()
    return value.item(), {k: v.grad.numpy() for k, v in tp.items()}


def _close(got, want):
    want = np.asarray(want, np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_lstm_value_and_grad_equal_float64_torch_and_the_interpreter():
    p, h0, xs = _args()
    value, grads = dq.jit(dq.value_and_grad(loss))(p, h0, xs)
    want_value, want_grads = _torch_float64(p, h0, xs)
    _close(value, want_value)
    for k in p:
        _close(grads[k], want_grads[k])
    i_value, i_grads = dq.jit(dq.value_and_grad(loss), target="interp")(p, h0, xs)
    _close(value, i_value)
    for k in p:
        _close(grads[k], i_grads[k])


def _compiled_program():
    """The function with its bodies as the cpu target runs it: optimized, loop rules applied."""
    module = resolve_adjoints(dq.make_ir(dq.value_and_grad(loss))(*_args()), [])
    name = next(iter(module.functions))
    fn, result, note = optimized_with_bodies(module, name, "cpu")
    assert result is not None, note
    return apply_loop_rules(fn)


def test_lstm_compiles_without_the_avoidable_copies():
    fn = _compiled_program()
    scans = [i for i in fn.body if i.op == "scan"]
    assert len(scans) == 2
    forward, adjoint = (s.attrs["body"] for s in scans)
    made = {id(i.result): i for i in forward.body}
    outs = next(i for i in forward.body if i.result is forward.ret).operands
    # the forward step stores h as it is (a whole copy), not h^T (element by element)
    assert not [o for o in outs if id(o) in made and made[id(o)].op == "transpose"], forward
    # residuals: h and c of the step before, the gates and the two tanhs; their derivatives
    # (s - s^2, 1 - t^2) are recomputed by the adjoint step, not stored
    kinds = sorted(made[id(o)].op if id(o) in made else "param" for o in outs[3:])
    assert kinds == ["param"] * 2 + ["sigmoid"] * 3 + ["tanh"] * 2, kinds
    # one sigmoid per gate: sigmoid'(z) = s - s^2, not s(z) * s(-z)
    assert sum(i.op == "sigmoid" for i in forward.body) == 3, forward
    assert not any(i.op == "negate" for i in forward.body), forward
    # the weight gradients left the adjoint loop (its carries: the cotangents of h and c) ...
    assert scans[1].attrs["carries"] == 2
    assert not any(i.op == "dot" and i.result.type.shape == (H, H) for i in adjoint.body)
    # ... as products after it, reading the stacked h transposed, with no zero added to them
    after = fn.body[fn.body.index(scans[1]) :]
    # (the e-graph may merge the gates' products into wider ones, read through slices)
    products = {id(i.result) for i in after if i.op == "dot"}
    assert products
    products |= {id(i.result) for i in after if i.op == "slice" and id(i.operands[0]) in products}
    assert not [i for i in after if i.op == "add" and any(id(o) in products for o in i.operands)]
    assert len(reachable_bodies(fn)) == 2


def test_the_interpreter_agrees_with_the_compiled_program():
    """The rewritten program (loop rules, sigmoid rule) on the interpreter equals the program
    as traced: the rewrites themselves, not only the kernels, keep the numbers."""
    p, h0, xs = _args()
    module = dq.make_ir(dq.value_and_grad(loss))(p, h0, xs)
    name = next(iter(module.functions))
    leaves = [p[k] for k in sorted(p)] + [h0, xs]
    want = interpret(module, name, *leaves)
    from dlvm_eq.ir import Module
    from dlvm_eq.ir.control_flow import module_with_bodies

    rewritten = Module("rewritten")
    module_with_bodies(rewritten, _compiled_program())
    got = interpret(rewritten, name, *leaves)
    for g, w in zip(got, want):
        _close(g, w)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(
        st.sampled_from(["hT w", "h w", "sigmoid", "tanh", "h*s"]), min_size=1, max_size=4
    ),
    steps=st.integers(2, 4),
    seed=st.integers(0, 2**16),
)
def test_random_bodies_with_transposed_and_derived_residuals_equal_the_unrolled_gradient(
    ops, steps, seed
):
    """Bodies that read h^T and both a sigmoid and its derivative (the residuals stored
    untransposed or recomputed): the scan's compiled gradient equals the gradient of the same
    body unrolled by a Python loop (no scan adjoint at all) on the interpreter."""
    rng = np.random.default_rng(seed)
    n = 4
    w = (rng.standard_normal((n, n)) * 0.4).astype(np.float32)
    h0 = rng.standard_normal((n, n)).astype(np.float32)
    xs = rng.standard_normal((steps, n, n)).astype(np.float32)

    def body(w, h, x):
        v = h
        for op in ops:
            if op == "hT w":
                v = dq.transpose(v) @ w + x
            elif op == "h w":
                v = v @ w
            elif op == "sigmoid":
                v = dq.sigmoid(v)
            elif op == "tanh":
                v = dq.tanh(v)
            else:
                v = v * dq.sigmoid(h)
        return dq.tanh(v + h)

    def scanned(w, h0, xs):
        _, ys = dq.scan(lambda h, x: (lambda h: (h, h))(body(w, h, x)), h0, xs)
        return dq.sum(ys * ys)

    def unrolled(w, h0, xs):
        h, total = h0, 0.0
        for t in range(xs.shape[0]):
            h = body(w, h, xs[t])
            total = total + dq.sum(h * h)
        return total

    got = dq.jit(dq.grad(scanned, argnums=(0, 1)))(w, h0, xs)
    want = dq.jit(dq.grad(unrolled, argnums=(0, 1)), target="interp")(w, h0, xs)
    for g, v in zip(got, want):
        _close(g, v)


def test_sigmoids_derivative_is_computed_from_one_sigmoid():
    """grad of sum(sigmoid(x @ w) * x): sigmoid's derivative s * (1 - s), whose 1 - s the
    stable rules make sigmoid(-z), is s - s^2 after the rule (one sigmoid, no negate);
    a program that needs sigmoid(-z) alone keeps it (the rule adds no work there)."""

    def f(x, w):
        return dq.sum(dq.sigmoid(x @ w) * x)

    def g(x, w):
        return dq.sum((1.0 - dq.sigmoid(x @ w)) * x)

    x = RNG.standard_normal((3, 3)).astype(np.float32)
    w = RNG.standard_normal((3, 3)).astype(np.float32)
    m = dq.make_ir(dq.grad(f, argnums=1))(x, w)
    result = dq.optimize(m)
    name = next(iter(m.functions))
    ops = [i.op for i in result.module[name].body]
    assert ops.count("sigmoid") == 1 and "negate" not in ops, ops
    _close(interpret(result.module, name, x, w), interpret(m, name, x, w))
    m2 = dq.make_ir(g)(x, w)
    ops2 = [i.op for i in dq.optimize(m2).module["g"].body]
    assert ops2.count("sigmoid") == 1 and "square" not in ops2, ops2
