"""Concatenations written in place (codegen/planning/concat_in_place.py, issue 33): where every
part is a temporary that a product (any axis) or a map kernel (a contiguous block of the result)
writes and nothing else reads, the producers write straight into the concatenation's buffer
and the plan has no concatenate step; otherwise the copy stays. Random programs (producers,
axes, a part also read elsewhere or returned, a parameter as a part, a concatenation of a
concatenation) agree with the float64 interpreter either way. (Extraction prices the copy by
default: extract/concat_place.PRICED_FREE says why.)"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.codegen import set_cache_dir
from dlvm_eq.codegen.planning import concat_in_place
from dlvm_eq.codegen.planning.plan import ALIAS, AliasStep, BlasStep, ConcatStep
from dlvm_eq.ir import interpret
from dlvm_eq.pipeline import compile, plan_function


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def _plan(module):
    name = next(iter(module.functions))
    return plan_function(module[name], module)


def _check(module, args):
    name = next(iter(module.functions))
    got = compile(module, name, optimize=False)(*args)
    want = interpret(module, name, *args, float64=True)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(w).max())))


RNG = np.random.default_rng(0)


def _arr(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_three_products_write_their_columns_of_the_concatenation():
    x, a, b, c = _arr(64, 32), _arr(32, 16), _arr(32, 24), _arr(32, 8)
    m = dq.make_ir(lambda x, a, b, c: dq.concatenate([x @ a, x @ b, x @ c], axis=1) * 2.0)(
        x, a, b, c
    )
    plan = _plan(m)
    assert not any(isinstance(s, ConcatStep) for s in plan.steps), plan
    (cat,) = {s.src for s in plan.steps if isinstance(s, AliasStep)}
    blas = [s for s in plan.steps if isinstance(s, BlasStep)]
    assert [b.out_view.strides for b in blas] == [(48, 1)] * 3  # rows of the whole concatenation
    offsets = sorted(s.offset for s in plan.steps if isinstance(s, AliasStep))
    assert offsets == [0, 16, 40]
    assert all(plan.slots[b.out].role == ALIAS for b in blas)
    assert cat in plan.offsets  # the buffer is placed in the arena, before its writers
    _check(m, (x, a, b, c))


def test_kernels_write_a_block_along_the_first_axis():
    x, a = _arr(8, 6), _arr(6, 5)
    m = dq.make_ir(lambda x, a: dq.sum(dq.concatenate([dq.exp(a), dq.tanh(a) * 0.5], 0), axis=1))(
        x, a
    )
    plan = _plan(m)
    assert not any(isinstance(s, ConcatStep) for s in plan.steps), plan
    _check(m, (x, a))


def test_the_copy_stays_where_a_part_is_read_elsewhere_or_a_parameter():
    x, a, b = _arr(16, 8), _arr(8, 4), _arr(8, 4)
    shared = dq.make_ir(lambda x, a, b: (dq.concatenate([x @ a, x @ b], 1), dq.exp(x @ a)))(x, a, b)
    param = dq.make_ir(lambda x, a, b: dq.concatenate([x @ a, x[:, :4]], 1))(x, a, b)
    strided = dq.make_ir(lambda x, a, b: dq.concatenate([dq.exp(x @ a), dq.tanh(x @ b)], 1))(
        x, a, b
    )
    for m in (shared, param):
        assert any(isinstance(s, ConcatStep) for s in _plan(m).steps)
        _check(m, (x, a, b))
    # maps write C order: columns of a wider buffer are not theirs to write
    plan = _plan(strided)
    assert any(isinstance(s, ConcatStep) for s in plan.steps) or all(
        isinstance(s, BlasStep) for s in plan.steps if not isinstance(s, AliasStep)
    )
    _check(strided, (x, a, b))


def test_off_it_is_the_copy_and_the_same_values(monkeypatch):
    x, a, b = _arr(32, 16), _arr(16, 8), _arr(16, 12)
    m = dq.make_ir(lambda x, a, b: dq.concatenate([x @ a, x @ b], 1))(x, a, b)
    on = compile(m, next(iter(m.functions)), optimize=False)(x, a, b)
    monkeypatch.setattr(concat_in_place, "ENABLED", False)
    assert any(isinstance(s, ConcatStep) for s in _plan(m).steps)
    off = compile(m, next(iter(m.functions)), optimize=False)(x, a, b)
    np.testing.assert_allclose(on, off, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- random programs

KINDS = ("dot", "map", "param", "view", "dot_shared", "map_shared", "concat")


@st.composite
def programs(draw):
    """(function, example args, whether the plan must write the outer concatenation in place)."""
    axis = draw(st.integers(0, 1))
    rows = draw(st.integers(1, 5))
    k = draw(st.integers(1, 6))
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=2, max_size=4))
    widths = draw(st.lists(st.integers(1, 5), min_size=len(kinds), max_size=len(kinds)))
    inner_axis = draw(st.integers(0, 1))
    returned = draw(st.booleans())  # the concatenation is also a result (an output buffer)
    args, specs = [_arr(rows if axis == 1 else 7, k)], []
    for kind, w in zip(kinds, widths):
        r, c = (rows, w) if axis == 1 else (w, 3)
        if kind in ("dot", "dot_shared", "map", "map_shared"):
            args += [_arr(r, k), _arr(k, c)]
        elif kind == "view":
            args.append(_arr(c, r))
        elif kind == "concat":  # two pieces concatenated along inner_axis, or the other one
            at = inner_axis if (r, c)[inner_axis] > 1 else 1 - inner_axis
            if (r, c)[at] < 2:
                kind = "param"
                args.append(_arr(r, c))
            else:
                first = (1, c) if at == 0 else (r, 1)
                rest = (r - 1, c) if at == 0 else (r, c - 1)
                args += [_arr(*first), _arr(*rest)]
                kind = ("concat", at)
        else:
            args.append(_arr(r, c))
        specs.append(kind)

    def f(*ps):
        ps = list(ps)
        ps.pop(0)
        parts, extra = [], []
        for kind in specs:
            if kind in ("dot", "dot_shared", "map", "map_shared"):
                u, w = ps.pop(0), ps.pop(0)
                p = u @ w
                if kind.startswith("map"):
                    p = dq.tanh(p) * 0.5 + 1.0
                if kind.endswith("shared"):
                    extra.append(dq.exp(p))
            elif kind == "view":
                p = dq.transpose(ps.pop(0))
            elif isinstance(kind, tuple):  # a concatenation of a concatenation
                u, v = ps.pop(0), ps.pop(0)
                p = dq.concatenate([u * 2.0, v * 3.0], axis=kind[1])
            else:
                p = ps.pop(0)
            parts.append(p)
        cat = dq.concatenate(parts, axis=axis)
        out = dq.sum(cat * cat, axis=1 - axis)
        return (out, cat, *extra) if returned else (out, *extra) if extra else out

    return f, args


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_concatenations_agree_with_the_interpreter(prog):
    f, args = prog
    _check(dq.make_ir(f)(*args), args)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 1), st.lists(st.integers(1, 6), min_size=2, max_size=4), st.integers(1, 5))
def test_unshared_products_never_leave_a_copy(axis, widths, rows):
    """Products read only by the concatenation: the plan has no concatenate step, any axis."""
    k = 4
    shapes = [((rows, k), (k, w)) if axis == 1 else ((w, k), (k, 3)) for w in widths]
    args = [_arr(*s) for pair in shapes for s in pair]

    def f(*ps):
        parts = [ps[i] @ ps[i + 1] for i in range(0, len(ps), 2)]
        return dq.exp(dq.concatenate(parts, axis=axis))

    m = dq.make_ir(f)(*args)
    assert not any(isinstance(s, ConcatStep) for s in _plan(m).steps)
    _check(m, args)
