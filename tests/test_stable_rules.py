"""rules/algebra.egg's `stable` ruleset: losses written the unstable way are finite and exact
after dq.optimize / compile, the optimized IR holds the stable form (checked structurally),
and the interpreter without the optimizer still runs the program as written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.special

import dlvm_eq as dq
from dlvm_eq.ir import interpret


def logistic(z, y):
    p = dq.sigmoid(z)
    return dq.sum(-(y * dq.log(p) + (1 - y) * dq.log(1 - p)))


def raw_logsumexp(x):
    return dq.sum(dq.log(dq.sum(dq.exp(x), axis=1)))


def raw_log_softmax_loss(x, y):
    e = dq.exp(x)
    return -dq.sum(y * dq.log(e / dq.sum(e, axis=1, keepdims=True)))


Z = np.array([30.0, -30.0, 30.0, -30.0, 1.5], np.float32)
Y = np.array([0.0, 1.0, 1.0, 0.0, 1.0], np.float32)
# logits far beyond exp's f32 range (exp(89) overflows)
X = np.array(
    [[200.0, 3.0, -50.0, 1.0], [-300.0, -310.0, -290.0, -305.0], [0.5, 0.25, -0.5, 1.0]], np.float32
)
ONEHOT = np.eye(4, dtype=np.float32)[[0, 2, 3]]


def exact_logistic(z, y):
    z = z.astype(np.float64)
    return float(np.sum(y * np.logaddexp(0.0, -z) + (1 - y) * np.logaddexp(0.0, z)))


def assert_exact_logistic(got):
    """The logistic loss of (Z, Y) is finite and within 1e-4 of exact (issue 17's bound)."""
    want = exact_logistic(Z, Y)
    assert np.isfinite(got) and abs(got - want) <= 1e-4 * abs(want), (got, want)


def exact_logsumexp(x):
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return m[:, 0] + np.log(np.exp(x - m).sum(axis=1))


def ops_of(fn) -> list[str]:
    return [ins.op for ins in fn.body]


def producers(fn) -> dict[str, str]:
    return {ins.result.name: ins.op for ins in fn.body}


def operand_ops(fn, op: str) -> list[list[str | None]]:
    """For each instruction `op`, the ops that produce its operands (None: a parameter/literal)."""
    made = producers(fn)
    return [
        [made.get(getattr(o, "name", None)) for o in ins.operands]
        for ins in fn.body
        if ins.op == op
    ]


def optimized(f, *args):
    m = dq.make_ir(f)(*args)
    result = dq.optimize(m)
    return m, result, result.module[f.__name__]


def test_logistic_loss_at_30_is_finite_and_exact_after_optimize():
    m, result, fn = optimized(logistic, Z, Y)
    # as written, log(1 - sigmoid(30)) = log(0): the interpreter without the optimizer says so
    assert not np.isfinite(interpret(m, "logistic", Z, Y))
    assert not np.isfinite(dq.jit(logistic, target="interp")(Z, Y))  # no optimizer there either
    # structurally: softplus, and no log of a sigmoid or of 1 - sigmoid; softplus(z) is read
    # as softplus(-z) + z, so one softplus serves both terms
    ops = ops_of(fn)
    assert ops.count("softplus") == 1 and "log" not in ops and "sigmoid" not in ops, fn
    fr = result.report["logistic"]
    assert not fr.kept_original
    assert {
        "stable: log(sigmoid z)",
        "stable: log(1-sigmoid z)",
        "softplus(z)=softplus(-z)+z",
    } <= set(fr.saturation.rule_matches)
    assert_exact_logistic(float(interpret(result.module, "logistic", Z, Y)))


def test_logistic_loss_at_30_on_cpu():
    assert_exact_logistic(float(dq.jit(logistic, target="cpu")(Z, Y)))


def test_logreg_example_explains_its_stable_form():
    module = dq.load(Path(__file__).resolve().parent.parent / "examples" / "logreg.dl")
    ((written, extracted),) = dq.optimize(module, func="loss", explain=True).report["loss"].results
    assert "log(sigmoid(x @ w + b))" in written and "log" not in extracted
    # one softplus for both terms: softplus(-z) = softplus(z) - z, or the other way round
    forms = {f for f in ("softplus(x @ w + b)", "softplus(-(x @ w + b))") if f in extracted}
    assert len(forms) == 1, extracted


def test_stable_program_is_kept_even_where_the_cost_model_prices_it_higher():
    m, result, fn = optimized(raw_logsumexp, X)
    fr = result.report["raw_logsumexp"]
    # the max-shift costs a reduction more than the program as written: kept for stability
    assert fr.cost_after >= fr.cost_before and not fr.kept_original
    assert "numerically stable" in str(result.report)
    assert any(ins.op == "reduce" and "max" in str(ins.attrs) for ins in fn.body), fn
    # exp reads x minus its maximum, never x itself
    assert all(ops == ["subtract"] for ops in operand_ops(fn, "exp")), fn
    assert not np.isfinite(interpret(m, "raw_logsumexp", X))
    got = interpret(result.module, "raw_logsumexp", X)
    np.testing.assert_allclose(got, exact_logsumexp(X).sum(), rtol=1e-5)


def test_log_of_softmax_becomes_log_softmax():
    m, result, fn = optimized(raw_log_softmax_loss, X, ONEHOT)
    # no division by the softmax's denominator: logits minus logsumexp
    assert "divide" not in ops_of(fn), fn
    assert all(ops == ["subtract"] for ops in operand_ops(fn, "exp")), fn
    x = X.astype(np.float64)
    want = -np.sum(ONEHOT * (x - exact_logsumexp(X)[:, None]))
    # f32 terms of size ~300 cancel to ~1: their rounding (3e-5 each) bounds the error
    np.testing.assert_allclose(
        interpret(result.module, "raw_log_softmax_loss", X, ONEHOT), want, atol=1e-3
    )
    np.testing.assert_allclose(
        dq.jit(raw_log_softmax_loss, target="cpu")(X, ONEHOT), want, atol=1e-3
    )


@pytest.mark.parametrize("target", ["cpu", "interp"])
@pytest.mark.parametrize("z", [-1e4, -100.0, -30.0, -3.0, 0.0, 2.5, 30.0, 100.0, 1e4])
def test_gradient_of_the_logistic_loss_stays_finite(z, target):
    """The adjoint is expanded on the program as written: g/p times sigmoid's derivative
    p * (1 - p), with 1 - p = sigmoid(-z). Its quotients cancel, so nothing divides by a sigmoid
    that rounds to 0 in f32 (|z| > 88: inf there, NaN after the product)."""
    zs, ys = np.array([z, -z, z], np.float32), np.array([1.0, 0.0, 0.0], np.float32)
    g = dq.jit(dq.grad(logistic), target=target)(zs, ys)
    zz = zs.astype(np.float64)
    want = scipy.special.expit(zz) - ys  # d/dz of the logistic loss
    np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-6)


def test_logistic_gradient_is_sigmoid_minus_y():
    """The quotients cancel into y * sigmoid(-z) - (1-y) * sigmoid(z), which is y - sigmoid(z)
    (sigmoid(z) + sigmoid(-z) = 1): the gradient reads one sigmoid, of z itself, and divides
    by nothing."""
    m = dq.make_ir(dq.grad(logistic))(Z, Y)
    (fn,) = m.functions.values() if isinstance(m.functions, dict) else m.functions
    ops = ops_of(fn)
    assert "divide" not in ops and "negate" not in ops and ops.count("sigmoid") == 1, fn
    assert operand_ops(fn, "sigmoid") == [[None]], fn  # sigmoid(%z): a parameter


def test_logistic_loss_reads_one_softplus_and_no_sigmoid():
    """y*log(p) + (1-y)*log(1-p) in its stable form is y*z - softplus(z) (torch's
    BCEWithLogits): one softplus, a product, a difference."""
    m, result, fn = optimized(logistic, Z, Y)
    ops = ops_of(fn)
    assert ops.count("softplus") == 1 and "sigmoid" not in ops and "log" not in ops, fn
    assert (
        ops.count("multiply") == 1
        and "y*(z-sp z)+(1-y)*(-sp z)" in result.report["logistic"].saturation.rule_matches
    )


# ---------------------------------------------------------------- the gpu target
# The stable logistic loss is finite and exact at z = +-30 on every target. The GPU
# target's kernels run here through tests/fake_cupy (each launch emulated on the host from the
# kernel's own LLVM IR, its PTX assembled by ptxas), and on a device where CUDA works.


def _logistic_programs():
    """The loss as written (log of sigmoid: the GPU target's optimizer must make it stable) and
    its value and gradient."""
    loss, both = dq.make_ir(logistic)(Z, Y), dq.value_and_grad(logistic).lower(Z, Y)
    return (loss, next(iter(loss.functions))), (both, next(iter(both.functions)))


def _check(loss, value, grad):
    assert_exact_logistic(loss)
    assert_exact_logistic(value)
    np.testing.assert_allclose(
        grad, scipy.special.expit(Z.astype(np.float64)) - Y, rtol=1e-4, atol=1e-6
    )


def test_logistic_loss_at_30_on_the_emulated_gpu(monkeypatch):
    import fake_cupy

    from dlvm_eq.pipeline import compile

    (loss, f), (both, g) = _logistic_programs()
    with fake_cupy.installed(monkeypatch, sms=2) as cp:
        z, y = cp.asarray(Z), cp.asarray(Y)
        # the program as written is not finite there: the optimizer's stable form is what passes
        assert not np.isfinite(compile(loss, f, target="gpu", optimize=False)(z, y).get())
        value, grad = compile(both, g, target="gpu")(z, y)
        _check(float(compile(loss, f, target="gpu")(z, y).get()), float(value.get()), grad.get())


@pytest.mark.gpu
def test_logistic_loss_at_30_on_the_gpu():
    from dlvm_eq.codegen import gpu_available

    if not gpu_available():
        pytest.skip("CUDA is not usable here")
    import cupy

    value, grad = dq.jit(dq.value_and_grad(logistic), target="gpu")(Z, Y)
    loss = dq.jit(logistic, target="gpu")(Z, Y)
    _check(float(cupy.asnumpy(loss)), float(cupy.asnumpy(value)), cupy.asnumpy(grad))
