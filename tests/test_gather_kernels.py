"""The compiled gather, scatter-add, slice-scatter and cumsum kernels (cpu/index_ir.py,
runtime/index_kernel.py; gpu/index_ptx.py run by host emulation and assembled by ptxas)
against numpy written out by hand: hypothesis-drawn shapes, axes and ids (repeated, edge,
out of range), f32/f64/i32 (bool for the copies), every split of the work, many threads
calling one compiled program."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.codegen.cpu.llvm_cpu import CpuIR
from dlvm_eq.codegen.gpu.index_ptx import index_bits, index_host_emulation_ir, index_ptx
from dlvm_eq.codegen.kernels.index_spec import IndexExtents, IndexSpec, extents
from dlvm_eq.codegen.runtime.index_kernel import IndexKernel
from dlvm_eq.codegen.runtime.jit import JIT
from dlvm_eq.errors import DlvmError

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
DTYPES = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "bool": np.bool_}


# ---------------------------------------------------------------- references, written out


def take_reference(x, ids, axis):
    out = np.empty(x.shape[:axis] + (len(ids),) + x.shape[axis + 1 :], x.dtype)
    for j, i in enumerate(ids):
        out[(slice(None),) * axis + (j,)] = x[(slice(None),) * axis + (int(i),)]
    return out


def scatter_reference(g, ids, axis, size, dtype):
    """Rows of g added into zeros in ascending j, in `dtype` (float64: the exact-ish answer)."""
    out = np.zeros(g.shape[:axis] + (size,) + g.shape[axis + 1 :], dtype)
    for j, i in enumerate(ids):
        out[(slice(None),) * axis + (int(i),)] += g[(slice(None),) * axis + (j,)].astype(dtype)
    return out


def cumsum_reference(x, axis, reverse, dtype):
    x = np.moveaxis(x.astype(dtype), axis, 0)
    out = np.empty_like(x)
    order = range(len(x) - 1, -1, -1) if reverse else range(len(x))
    acc = None
    for i in order:
        acc = x[i].copy() if acc is None else (acc + x[i]).astype(dtype)
        out[i] = acc
    return np.moveaxis(out, 0, axis)


def values(rng, shape, dt):
    if dt == "bool":
        return rng.random(shape) < 0.5
    if dt == "i32":
        return rng.integers(-1000, 1000, shape).astype(np.int32)
    return rng.standard_normal(shape).astype(DTYPES[dt])


@st.composite
def indexed(draw, dtypes=("f32", "f64", "i32")):
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    axis = draw(st.integers(0, len(shape) - 1))
    size = shape[axis]
    edge = st.sampled_from([0, size - 1])  # the edge rows, often
    ids = draw(st.lists(st.one_of(edge, st.integers(0, size - 1)), min_size=1, max_size=9))
    return (
        shape,
        axis,
        np.array(ids, np.int32),
        draw(st.sampled_from(dtypes)),
        draw(st.integers(0, 2**16)),
    )


def run_split(kernel, out, src, ids, ext, cuts):
    """The kernel over its units cut at `cuts` (calls in reverse order): any cut, same result."""
    units = ext.rows(kernel.spec.kind)
    flag = np.zeros(1, np.int64)
    bounds = [0] + sorted({min(c, units) for c in cuts}) + [units]
    for lo, hi in reversed(list(zip(bounds, bounds[1:]))):
        kernel.fn(
            lo,
            hi,
            out.ctypes.data,
            src.ctypes.data,
            0 if ids is None else ids.ctypes.data,
            flag.ctypes.data,
            ext.n,
            ext.size,
            ext.inner,
            ext.first,
            ext.step,
        )
    return bool(flag[0])


_KERNELS: dict = {}


def kernel(kind, dt, reverse=False) -> IndexKernel:
    spec = IndexSpec(kind, dt, reverse)
    if spec not in _KERNELS:
        _KERNELS[spec] = IndexKernel(spec, threads=2)
    return _KERNELS[spec]


# ---------------------------------------------------------------- CPU kernels


@settings(max_examples=40, **SETTINGS)
@given(indexed(("f32", "f64", "i32", "bool")), st.lists(st.integers(0, 40), max_size=3))
def test_take_copies_rows_at_the_ids(case, cuts):
    shape, axis, ids, dt, seed = case
    x = values(np.random.default_rng(seed), shape, dt)
    outer, inner = extents(shape, axis)
    want = take_reference(x, ids, axis)
    out = np.full(want.shape, 7, want.dtype)
    ext = IndexExtents(outer, len(ids), shape[axis], inner)
    assert not run_split(kernel("take", dt), out, x, ids, ext, cuts)
    np.testing.assert_array_equal(out, want)


@settings(max_examples=40, **SETTINGS)
@given(indexed(), st.lists(st.integers(0, 40), max_size=3))
def test_scatter_add_accumulates_repeated_ids_in_the_interpreters_order(case, cuts):
    shape, axis, ids, dt, seed = case
    size = shape[axis]
    g_shape = shape[:axis] + (len(ids),) + shape[axis + 1 :]
    g = values(np.random.default_rng(seed), g_shape, dt)
    outer, inner = extents(g_shape, axis)
    out = np.full(shape, 7, g.dtype)
    ext = IndexExtents(outer, len(ids), size, inner)
    assert not run_split(kernel("scatterAdd", dt), out, g, ids, ext, cuts)
    # the same bits as the dtype's own sums in ascending j (what np.add.at does)...
    np.testing.assert_array_equal(out, scatter_reference(g, ids, axis, size, g.dtype))
    # ...and float64 to rounding
    exact = scatter_reference(g, ids, axis, size, np.float64)
    np.testing.assert_allclose(out, exact, rtol=1e-5 if dt == "f32" else 1e-12, atol=1e-5)


@settings(max_examples=40, **SETTINGS)
@given(indexed(), st.booleans(), st.lists(st.integers(0, 40), max_size=3))
def test_cumsum_along_any_axis_both_ways(case, reverse, cuts):
    shape, axis, _, dt, seed = case
    x = values(np.random.default_rng(seed), shape, dt)
    outer, inner = extents(shape, axis)
    out = np.full(shape, 7, x.dtype)
    n = shape[axis]
    run_split(kernel("cumsum", dt, reverse), out, x, None, IndexExtents(outer, n, n, inner), cuts)
    np.testing.assert_array_equal(out, cumsum_reference(x, axis, reverse, x.dtype))
    if dt != "i32":
        np.testing.assert_allclose(
            out, cumsum_reference(x, axis, reverse, np.float64), rtol=1e-5, atol=1e-5
        )


@settings(max_examples=40, **SETTINGS)
@given(
    indexed(("f32", "f64", "i32", "bool")),
    st.integers(0, 3),
    st.integers(1, 3),
    st.lists(st.integers(0, 40), max_size=3),
)
def test_slice_scatter_writes_every_step_th_row_and_zeros(case, first, step, cuts):
    shape, axis, _, dt, seed = case
    size = shape[axis] + first + 2 * step
    n = (size - 1 - first) // step + 1 - (seed % 2)  # sometimes short of the end
    g = values(np.random.default_rng(seed), shape[:axis] + (n,) + shape[axis + 1 :], dt)
    outer, inner = extents(g.shape, axis)
    want = np.zeros(shape[:axis] + (size,) + shape[axis + 1 :], g.dtype)
    for k in range(n):
        want[(slice(None),) * axis + (first + k * step,)] = g[(slice(None),) * axis + (k,)]
    out = np.full(want.shape, 7, want.dtype)
    run_split(
        kernel("sliceScatter", dt),
        out,
        g,
        None,
        IndexExtents(outer, n, size, inner, first, step),
        cuts,
    )
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("kind", ["take", "scatterAdd"])
def test_out_of_range_ids_are_reported_never_followed(kind):
    """ids far outside the table (a read or write there would fault): flagged, rows zeroed."""
    x = np.arange(10.0, dtype=np.float32).reshape(5, 2)
    ids = np.array([1, 2**31 - 1, -(2**31), 5, -1, 4], np.int32)
    src = x if kind == "take" else np.ones((6, 2), np.float32)
    out = np.full((6, 2) if kind == "take" else (5, 2), 7, np.float32)
    assert kernel(kind, "f32").run(out, src, ids, IndexExtents(1, 6, 5, 2))
    if kind == "take":
        np.testing.assert_array_equal(out, [[2, 3], [0, 0], [0, 0], [0, 0], [0, 0], [8, 9]])
    else:
        np.testing.assert_array_equal(out, [[0, 0], [1, 1], [0, 0], [0, 0], [1, 1]])
    assert not kernel(kind, "f32").run(
        out, src, np.array([1, 0, 4, 4, 3, 2], np.int32), IndexExtents(1, 6, 5, 2)
    )


def test_big_calls_split_over_threads_give_the_single_threaded_bits():
    rng = np.random.default_rng(3)
    table = rng.standard_normal((5000, 64)).astype(np.float32)
    ids = rng.integers(0, 5000, 6000).astype(np.int32)
    ids[:50] = 17  # many repeats of one row
    ext = IndexExtents(1, len(ids), 5000, 64)
    one = {k: IndexKernel(IndexSpec(k, "f32"), threads=1) for k in ("take", "scatterAdd")}
    out1, out2 = np.empty((6000, 64), np.float32), np.empty((6000, 64), np.float32)
    one["take"].run(out1, table, ids, ext)
    kernel("take", "f32").run(out2, table, ids, ext)
    np.testing.assert_array_equal(out1, out2)
    np.testing.assert_array_equal(out1, table[ids])
    g = rng.standard_normal((6000, 64)).astype(np.float32)
    s1, s2 = np.empty_like(table), np.empty_like(table)
    one["scatterAdd"].run(s1, g, ids, ext)
    kernel("scatterAdd", "f32").run(s2, g, ids, ext)
    want = np.zeros_like(table)
    np.add.at(want, ids, g)
    np.testing.assert_array_equal(s1, s2)
    np.testing.assert_array_equal(s1, want)


def test_spec_errors():
    with pytest.raises(DlvmError, match="cannot add bool"):
        IndexSpec("scatterAdd", "bool")
    with pytest.raises(DlvmError, match="unknown index kernel"):
        IndexSpec("gather", "f32")
    with pytest.raises(DlvmError, match="only cumsum runs in reverse"):
        IndexSpec("take", "f32", True)


# ---------------------------------------------------------------- compiled programs


def test_programs_match_the_interpreter_in_f32_and_f64():
    rng = np.random.default_rng(4)
    for dt in (np.float32, np.float64):
        x = rng.standard_normal((4, 6, 3)).astype(dt)
        ids = np.array([5, 0, 0, 2, 5], np.int32)

        def f(x, i):
            t = dq.take(x, i, axis=1)
            return (
                dq.cumsum(t, axis=1) * 2.0
                + dq.cumsum(x, axis=2, reverse=True)[:, :5, :]
                + x[:, ::2, :].sum()
            )

        got, want = dq.jit(f)(x, ids), dq.jit(f, target="interp")(x, ids)
        np.testing.assert_allclose(got, want, rtol=1e-5 if dt == np.float32 else 1e-12)
        g = dq.jit(
            dq.grad(lambda x, i: dq.sum(dq.take(x, i, axis=1) ** 2) + dq.sum(x[:, 1::2, :] * 3.0))
        )(x, ids)
        want = scatter_reference(2 * take_reference(x, ids, 1), ids, 1, 6, np.float64)
        want[:, 1::2, :] += 3.0
        np.testing.assert_allclose(g, want, rtol=1e-5 if dt == np.float32 else 1e-12, atol=1e-6)


def test_an_out_of_range_id_is_the_interpreters_error_in_a_program():
    f = dq.jit(lambda e, i: dq.take(e, i) * 2.0)
    e = np.ones((3, 4), np.float32)
    with pytest.raises(
        DlvmError, match=r"take: index 3 \(position 2\) is out of range for an axis of size 3"
    ):
        f(e, np.array([0, 2, 3], np.int32))
    np.testing.assert_array_equal(
        f(e, np.array([0, 2], np.int32)), 2 * np.ones((2, 4))
    )  # still usable


def test_many_threads_call_one_compiled_program():
    vg = dq.jit(dq.value_and_grad(lambda e, i: dq.sum(dq.cumsum(dq.take(e, i), axis=0) * 0.5)))
    rng = np.random.default_rng(5)
    e = rng.standard_normal((50, 32)).astype(np.float32)
    cases = [rng.integers(0, 50, 300).astype(np.int32) for _ in range(8)]
    vg(e, cases[0])  # compiled once, before the threads
    results: dict = {}

    def work(k):
        for _ in range(5):
            results[k] = vg(e, cases[k])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for k, ids in enumerate(cases):
        value, grad = results[k]
        weights = 0.5 * np.arange(len(ids), 0, -1)  # row j is in len - j partial sums
        np.testing.assert_allclose(
            value, (e[ids].astype(np.float64) * weights[:, None]).sum(), rtol=1e-4
        )
        want = np.zeros((50, 32))
        np.add.at(want, ids, np.broadcast_to(weights[:, None], (len(ids), 32)))
        np.testing.assert_allclose(grad, want, rtol=1e-5)


# ---------------------------------------------------------------- GPU kernels


def emulated(spec: IndexSpec, bits: int):
    """The GPU kernel on the host: fn(threads)(total, ptrs..., ints...) runs a launch of
    `threads` threads in one block, each grid-striding, one after another."""
    text, symbol = index_host_emulation_ir(spec, bits)
    addr = JIT.address(CpuIR(text, symbol, None, "emulated"))
    it = ctypes.c_int32 if bits == 32 else ctypes.c_int64
    fn = ctypes.CFUNCTYPE(None, it, *[ctypes.c_void_p] * 4, *[it] * 5, *[ctypes.c_int32] * 6)(addr)

    def launch(threads, total, out, src, ids, flag, ext):
        for tid in range(threads):
            fn(
                total,
                out.ctypes.data,
                src.ctypes.data,
                0 if ids is None else ids.ctypes.data,
                flag.ctypes.data,
                ext.n,
                ext.size,
                ext.inner,
                ext.first,
                ext.step,
                0,
                threads,
                tid,
                1,
                0,
                1,
            )

    return launch


@settings(max_examples=15, **SETTINGS)
@given(indexed(), st.integers(1, 5), st.sampled_from([32, 64]))
def test_gpu_kernels_under_host_emulation(case, threads, bits):
    shape, axis, ids, dt, seed = case
    rng = np.random.default_rng(seed)
    x = values(rng, shape, dt)
    outer, inner = extents(shape, axis)
    size = shape[axis]
    flag = np.zeros(1, np.int32)
    ext = IndexExtents(outer, len(ids), size, inner)
    out = np.full(take_reference(x, ids, axis).shape, 7, x.dtype)
    emulated(IndexSpec("take", dt), bits)(threads, out.size, out, x, ids, flag, ext)
    np.testing.assert_array_equal(out, take_reference(x, ids, axis))
    g = values(rng, out.shape, dt)
    acc = np.zeros(shape, x.dtype)  # the launcher zeroes it
    emulated(IndexSpec("scatterAdd", dt), bits)(threads, g.size, acc, g, ids, flag, ext)
    np.testing.assert_allclose(
        acc, scatter_reference(g, ids, axis, size, np.float64), rtol=1e-5, atol=1e-5
    )
    for reverse in (False, True):
        cs = np.full(shape, 7, x.dtype)
        emulated(IndexSpec("cumsum", dt, reverse), bits)(
            threads, outer * inner, cs, x, None, flag, IndexExtents(outer, size, size, inner)
        )
        np.testing.assert_array_equal(cs, cumsum_reference(x, axis, reverse, x.dtype))
    first, step = seed % 3, 1 + seed % 2
    big = first + (size - 1) * step + 1 + seed % 2
    ss = np.full(shape[:axis] + (big,) + shape[axis + 1 :], 7, x.dtype)
    emulated(IndexSpec("sliceScatter", dt), bits)(
        threads, ss.size, ss, x, None, flag, IndexExtents(outer, size, big, inner, first, step)
    )
    want = np.zeros_like(ss)
    want[(slice(None),) * axis + (slice(first, first + (size - 1) * step + 1, step),)] = x
    np.testing.assert_array_equal(ss, want)
    assert flag[0] == 0
    bad = np.array([0, size, -1], np.int32)
    emulated(IndexSpec("take", dt), bits)(
        threads,
        outer * 3 * inner,
        np.empty(outer * 3 * inner, x.dtype),
        x,
        bad,
        flag,
        IndexExtents(outer, 3, size, inner),
    )
    assert flag[0] == 1


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on PATH")
@pytest.mark.parametrize(
    "kind, dt",
    [
        ("take", "f32"),
        ("take", "bool"),
        ("scatterAdd", "f32"),
        ("scatterAdd", "f64"),
        ("scatterAdd", "i32"),
        ("sliceScatter", "f64"),
        ("cumsum", "f32"),
        ("cumsum", "i32"),
    ],
)
def test_ptx_assembles_for_sm_90(tmp_path, kind, dt):
    for bits in (32, 64):
        kp = index_ptx(IndexSpec(kind, dt, reverse=kind == "cumsum" and bits == 64), bits, "sm_90")
        assert f".entry {kp.symbol}" in kp.ptx
        if kind == "scatterAdd":
            assert "atom.global.add" in kp.ptx, "scatterAdd adds atomically"
        (tmp_path / "k.ptx").write_text(kp.ptx)
        done = subprocess.run(
            ["ptxas", "-arch=sm_90", str(tmp_path / "k.ptx"), "-o", str(tmp_path / "k.cubin")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr


def test_index_bits():
    assert index_bits(2**30 - 1) == 32 and index_bits(2**30) == 64
