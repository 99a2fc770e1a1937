"""Our GEMM (codegen/cpu/gemm_ir.py, codegen/runtime/gemm_runtime.py) against float64 numpy: random shapes around the
micro-tile and block edges, plain and transposed operands, strided views, accumulation, one
and several threads; and compiled programs whose matmuls it runs."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq import config
from dlvm_eq.codegen.cpu.gemm_ir import GemmSpec
from dlvm_eq.codegen.runtime import gemm_runtime
from dlvm_eq.codegen.runtime.gemm_runtime import (
    BLOCKS_PER_THREAD,
    PARALLEL_MACS,
    CpuGemm,
    a_order,
    gemm_for,
)
from dlvm_eq.codegen.runtime.gemm_tiles import AVX2_TILE, AVX512_WIDE

EPS32 = np.finfo(np.float32).eps


def _check(c, a, b, base=None):
    """|c - a@b| within the float32 summation bound k * eps * (|a| @ |b|) (plus the base)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = a64 @ b64 + (0 if base is None else base.astype(np.float64))
    bound = (
        (a.shape[1] + 2)
        * EPS32
        * (np.abs(a64) @ np.abs(b64) + (0 if base is None else np.abs(base)))
    )
    err = np.abs(c.astype(np.float64) - ref)
    assert (err <= bound + 1e-30).all(), (
        f"max error {err.max():.3g}, bound there {bound.flat[err.argmax()]:.3g}"
    )


def _operand(rng, rows, cols, transposed, pad):
    """A rows x cols float32 matrix: C-ordered, or the transpose of a C-ordered one; with `pad`
    extra columns in the underlying array so that the row stride is not the width."""
    if transposed:
        base = rng.standard_normal((cols, rows + pad), dtype=np.float32)
        return base[:, :rows].T
    base = rng.standard_normal((rows, cols + pad), dtype=np.float32)
    return base[:, :cols]


dims = st.one_of(
    st.integers(1, 40), st.sampled_from([11, 12, 13, 31, 32, 33, 143, 144, 145, 255, 256, 257, 300])
)


@settings(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    m=dims,
    n=dims,
    k=dims,
    ta=st.booleans(),
    tb=st.booleans(),
    pad=st.sampled_from([0, 3]),
    threads=st.sampled_from([1, 2, 3]),
    narrow=st.booleans(),
    pack_rows=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_random_shapes_layouts_and_threads(m, n, k, ta, tb, pad, threads, narrow, pack_rows, seed):
    """Both micro-tiles (12x32 and the narrow 24x16) on every layout, a row-major A read in
    place or packed."""
    rng = np.random.default_rng(seed)
    a = _operand(rng, m, k, ta, pad)
    b = _operand(rng, k, n, tb, pad)
    order = a_order(a)
    assert order is not None  # a C-ordered matrix or a transpose of one, padded or not
    g = CpuGemm(narrow, threads=threads, pack_rows=pack_rows)
    out = np.full((m, n), np.nan, np.float32)
    g(a, b, out)
    _check(out, a, b)


# the AVX2 tile's edges: MR 6, NR 16 (one 8-lane vector, two), KC 256, MC 144
avx2_dims = st.one_of(
    st.integers(1, 20),
    st.sampled_from(
        [5, 6, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 33, 143, 144, 145, 150, 255, 256, 257, 300, 513]
    ),
)


@settings(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    m=avx2_dims,
    n=avx2_dims,
    k=avx2_dims,
    ta=st.booleans(),
    tb=st.booleans(),
    pad=st.sampled_from([0, 5]),
    threads=st.sampled_from([1, 2, 3]),
    pack_rows=st.sampled_from([None, True]),
    accumulate=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_avx2_tile_on_drawn_shapes(m, n, k, ta, tb, pad, threads, pack_rows, accumulate, seed):
    """The 6x16 AVX2 tile (8-lane vectors: its plain-store paths for whole tiles and for
    packing A, masked ones at the edges) on every layout; NaN around and in out shows any
    write outside C or a missed element (NaN + x is NaN)."""
    rng = np.random.default_rng(seed)
    a = _operand(rng, m, k, ta, pad)
    b = _operand(rng, k, n, tb, pad)
    g = CpuGemm(threads=threads, pack_rows=pack_rows, tile=AVX2_TILE)
    frame = np.full((m + 2, n + 2 * 16), np.nan, np.float32)
    out = frame[1:-1, 16:-16]
    base = rng.standard_normal((m, n), dtype=np.float32) if accumulate else None
    if accumulate:
        out[:] = base
    g(a, b, out, accumulate=accumulate)  # out: a view with a row stride wider than n
    _check(out, a, b, base)
    inner = np.zeros(frame.shape, bool)
    inner[1:-1, 16:-16] = True
    assert np.isnan(frame[~inner]).all()  # nothing written outside C


@pytest.mark.parametrize("order", ["rows", "cols"])
def test_accumulate_adds_to_out(order):
    rng = np.random.default_rng(1)
    a = _operand(rng, 70, 300, order == "cols", 0)
    b = rng.standard_normal((300, 50), dtype=np.float32)
    base = rng.standard_normal((70, 50), dtype=np.float32)
    out = base.copy()
    CpuGemm()(a, b, out, accumulate=True)
    _check(out, a, b, base)


def test_the_mlp_products_split_over_threads():
    """The two big products of the MLP step, as the step runs them (2 threads, split rows)."""
    rng = np.random.default_rng(2)
    x = rng.random((256, 784), dtype=np.float32)
    for a, b in [
        (x, rng.random((784, 256), dtype=np.float32)),
        (x.T, rng.random((256, 256), dtype=np.float32)),
    ]:
        out = np.empty((a.shape[0], b.shape[1]), np.float32)
        g = gemm_for(a, b, out)
        assert g is not None
        blocks = g.blocks(*out.shape, a.shape[1])
        assert (
            len(blocks) == 1
            if g.threads == 1
            else 2 * g.threads <= len(blocks) <= BLOCKS_PER_THREAD * g.threads
        )
        g(a, b, out)
        _check(out, a, b)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    m=st.integers(1, 2000),
    n=st.integers(1, 2000),
    k=st.integers(1, 2000),
    threads=st.integers(1, 16),
    a_packed=st.booleans(),
    narrow=st.booleans(),
)
def test_blocks_tile_the_product_once(m, n, k, threads, a_packed, narrow):
    """The pool's GEMM blocks cover C exactly once, on whole micro-tiles, a few per thread."""
    g = CpuGemm(narrow=narrow, threads=threads)
    blocks = g.blocks(m, n, k, a_packed)
    cover = np.zeros((m, n), np.int32)
    for m0, m1, n0, n1 in blocks:
        assert 0 <= m0 < m1 <= m and 0 <= n0 < n1 <= n
        assert m0 % g.spec.mr == 0 and n0 % g.spec.nr == 0
        cover[m0:m1, n0:n1] += 1
    assert (cover == 1).all()
    assert len(blocks) <= max(1, BLOCKS_PER_THREAD * threads)
    if threads == 1 or m * n * k < PARALLEL_MACS:
        assert len(blocks) == 1


def test_empty_and_zero_depth_products():
    g = CpuGemm()
    out = np.full((5, 7), np.nan, np.float32)
    g(np.zeros((5, 0), np.float32), np.zeros((0, 7), np.float32), out)
    assert (out == 0).all()
    g(np.zeros((0, 3), np.float32), np.zeros((3, 7), np.float32), np.zeros((0, 7), np.float32))


def test_non_finite_values_propagate_and_stay_in_place():
    """inf/nan in a row of A reach only that row of C (the zero padding of edge tiles must not
    turn a neighbour's inf*0 into a nan in the result)."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((13, 40), dtype=np.float32)
    b = rng.standard_normal((40, 33), dtype=np.float32)
    a[12, 5] = np.inf
    out = np.empty((13, 33), np.float32)
    CpuGemm()(a, b, out)
    assert np.isfinite(out[:12]).all()
    assert not np.isfinite(out[12]).any()
    _check(out[:12], a[:12], b)


def test_a_order_names_the_contiguous_direction():
    x = np.ones((6, 9), np.float32)
    assert a_order(x) == "rows" and a_order(x.T) == "cols"
    assert a_order(np.ones((6, 18), np.float32)[:, ::2]) is None


def test_rows_whose_lines_share_l1_sets_are_packed():
    """A 1024-float row stride puts every row of a micro-tile in one L1 set: the AVX-512
    tile's 12 rows are more than the L1's 8 ways, A is packed; the AVX2 tile's 6 fit."""
    from dlvm_eq.codegen.cpu.gemm_ir import A_ROWS_PACKED
    from dlvm_eq.codegen.runtime.gemm_tiles import AVX512_NARROW

    f32 = np.float32
    wide, narrow = CpuGemm(tile=AVX512_WIDE), CpuGemm(narrow=True, tile=AVX512_NARROW)
    assert wide.flags(np.ones((64, 1024), f32), np.ones((1024, 64), f32)) & A_ROWS_PACKED
    assert not wide.flags(np.ones((64, 784), f32), np.ones((784, 64), f32)) & A_ROWS_PACKED
    # one panel of B: each row is read once anyway
    assert not narrow.flags(np.ones((64, 1024), f32), np.ones((1024, 10), f32)) & A_ROWS_PACKED
    assert (
        not CpuGemm(tile=AVX2_TILE).flags(np.ones((64, 1024), f32), np.ones((1024, 64), f32))
        & A_ROWS_PACKED
    )


def test_gemm_for_declines_what_it_cannot_read():
    f32 = np.float32
    big = np.ones((128, 128), f32)
    out = np.empty((128, 128), f32)
    assert gemm_for(big, big, out) is not None
    assert gemm_for(big.astype(np.float64), big, out) is None  # dtype
    assert (
        gemm_for(np.ones((4, 4), f32), np.ones((4, 4), f32), np.empty((4, 4), f32)) is None
    )  # tiny
    strided = np.ones((128, 256), f32)[:, ::2]  # no unit stride
    assert gemm_for(strided, big, out) is None
    assert gemm_for(big, big, np.empty((128, 256), f32)[:, ::2]) is None  # out strided


def test_spec_validation():
    from dlvm_eq.codegen.cpu.gemm_ir import check_epilogue
    from dlvm_eq.codegen.kernels.kernel_spec import KernelInput, KernelSpec
    from dlvm_eq.codegen.kernels.spec import Load

    with pytest.raises(ValueError, match="multiple"):
        GemmSpec(nr=24)
    flat = KernelSpec("k", (64,), [KernelInput("f32")], [Load(0)])
    with pytest.raises(ValueError, match="2-D map"):
        check_epilogue(flat, 0)


def test_jit_programs_run_their_matmuls_through_it(monkeypatch):
    """A compiled MLP gradient calls our GEMM for its products (counted), and agrees with the
    float64 interpreter."""
    from dlvm_eq.models import mlp

    calls = []
    real = CpuGemm.__call__

    def counting(self, a, b, out, accumulate=False, epilogue=None, extra=()):
        calls.append((a.shape, b.shape, epilogue is not None))
        return real(self, a, b, out, accumulate, epilogue, extra)

    monkeypatch.setattr(CpuGemm, "__call__", counting)
    rng = np.random.default_rng(4)
    params = mlp.init_params([784, 256, 10], seed=4)
    x = rng.random((256, 784), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 256)]
    f = dq.jit(dq.value_and_grad(mlp.loss, argnums=(0, 1, 2, 3)))
    loss, grads = f(*params, x, y)
    assert len(calls) == 5, calls
    # bias + ReLU after x @ w1 and the ReLU gradient after dz @ w2.T run as GEMM epilogues
    assert sum(e for *_, e in calls) == 2, calls
    ref_loss, ref_grads = mlp.numpy_value_and_grad(
        *[p.astype(np.float64) for p in params], x.astype(np.float64), y.astype(np.float64)
    )
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-5)


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setattr(gemm_runtime, "_ENABLED", False)
    big = np.ones((128, 128), np.float32)
    assert gemm_for(big, big, np.empty_like(big)) is None


@pytest.mark.parametrize("tile", [AVX512_WIDE, AVX2_TILE], ids=["avx512", "avx2"])
def test_one_row_of_tiles_reads_b_in_place(tile):
    """At most MR rows and whole NR panels: B is read where it lies (no packing); with a row
    stride wider than B and two K slices."""
    rng = np.random.default_rng(5)
    rows = min(10, tile["mr"])
    a = rng.standard_normal((rows, 300), dtype=np.float32)
    b = rng.standard_normal((300, 256 + 7), dtype=np.float32)[:, :256]
    out = np.empty((rows, 256), np.float32)
    g = CpuGemm(tile=tile)
    g(a, b, out)
    _check(out, a, b)
    [launch] = g._launches.idle()
    launch.scratch[0][1][:] = np.nan  # packB: a packing pass would overwrite it
    g(a, b, out)
    _check(out, a, b)
    assert np.isnan(launch.scratch[0][1]).all()


def test_matmul_computes_narrow_transposed_products_the_other_way_round():
    """h.T @ dz with 10 columns runs as (dz.T @ h).T; the result is the same product."""
    rng = np.random.default_rng(6)
    h = rng.standard_normal((256, 256), dtype=np.float32)
    dz = rng.standard_normal((256, 10), dtype=np.float32)
    out = np.empty((256, 10), np.float32)
    assert gemm_runtime.matmul(h.T, dz, out)
    _check(out, h.T, dz)
    assert (256, 10) in gemm_runtime._swap.scratch  # this thread's scratch


def test_concurrent_products_from_python_threads():
    """Launch plans (scratch, argument blocks) are shared per GEMM: calls from several Python
    threads must not mix them up."""
    import threading

    rng = np.random.default_rng(7)
    pairs = [
        (
            rng.standard_normal((256, 300), dtype=np.float32),
            rng.standard_normal((300, 256), dtype=np.float32),
        )
        for _ in range(4)
    ]
    bad = []

    def work(a, b):
        out = np.empty((256, 256), np.float32)
        for _ in range(20):
            assert gemm_runtime.matmul(a, b, out)
            try:
                _check(out, a, b)
            except AssertionError as e:  # pragma: no cover - reported below
                bad.append(e)

    threads = [threading.Thread(target=work, args=p) for p in pairs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def test_python_threads_instead_of_the_native_pool(monkeypatch):
    from dlvm_eq.codegen.runtime import threads

    monkeypatch.setattr(threads, "native_workers", lambda: None)
    rng = np.random.default_rng(8)
    a = rng.standard_normal((300, 200), dtype=np.float32)
    b = rng.standard_normal((200, 100), dtype=np.float32)
    out = np.empty((300, 100), np.float32)
    g = CpuGemm(threads=2)
    assert len(g.blocks(300, 100, 200)) >= 2
    g(a, b, out)
    _check(out, a, b)


# ---------------------------------------------------------------- epilogues in compiled programs

_EPILOGUE_OPS = ["bias", "relu", "other", "select", "sigmoid", "exp_tanh", "scale", "mask_out"]


@settings(
    max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    m=dims,
    n=dims,
    k=dims,
    transposed=st.booleans(),
    ops=st.lists(st.sampled_from(_EPILOGUE_OPS), min_size=1, max_size=5),
    seed=st.integers(0, 2**31),
)
def test_random_epilogues_against_the_interpreter(m, n, k, transposed, ops, seed):
    """dot then a random elementwise chain (broadcast bias, another matrix, compares, selects,
    transcendental ops, a bool output): the chain runs as the GEMM's epilogue (every product
    through our GEMM) and agrees with the float64 interpreter."""
    from dlvm_eq.codegen.planning.plan import GemmStep
    from dlvm_eq.ir import F32, FunctionBuilder, Module, interpret, tensor
    from dlvm_eq.pipeline import compile

    b = FunctionBuilder(
        "f",
        [
            tensor(k, m, F32) if transposed else tensor(m, k, F32),
            tensor(k, n, F32),
            tensor(n, F32),
            tensor(m, n, F32),
        ],
    )
    x, w, bias, other = b.params
    if transposed:
        x = b.emit("transpose", [x])
    z = b.emit("dot", [x, w])
    outs, mask = [], None
    for op in ops:
        if op == "bias":
            z = b.emit("add", [z, bias])
        elif op == "relu":
            z = b.emit("relu", [z])
        elif op == "other":
            z = b.emit("multiply", [z, other])
        elif op == "select":
            mask, witness = b.emit("greaterThan", [z, other]), b.emit("subtract", [z, other])
            z = b.emit("select", [z, other, mask])
        elif op == "sigmoid":
            z = b.emit("sigmoid", [z])
        elif op == "exp_tanh":
            z = b.emit("exp", [b.emit("tanh", [z])])
        elif op == "scale":
            z = b.emit("multiply", [z, b.const(0.5, F32)])
        else:
            mask, witness = b.emit("greaterThan", [z, b.const(0.0, F32)]), z
    outs.append(z)
    if mask is not None:  # the compare, and the difference it decided on (the witness)
        outs += [mask, witness]
    fn = b.finish(outs if len(outs) > 1 else z)
    mod = Module("epi")
    mod.add(fn)
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(p.type.shape).astype(np.float32) for p in fn.params]
    saved = gemm_runtime.GEMM_MIN_MACS
    gemm_runtime.GEMM_MIN_MACS = 1
    try:
        compiled = compile(mod, "f", optimize=False)
        got = compiled(*args)
    finally:
        gemm_runtime.GEMM_MIN_MACS = saved
    assert any(isinstance(s, GemmStep) for s in compiled.plan.steps), compiled.plan
    want = interpret(mod, "f", *args, float64=True)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    a64 = np.abs(args[0].astype(np.float64))
    scale = (
        float((a64.T if transposed else a64).max(initial=0) * np.abs(args[1]).max(initial=0) * k)
        + 1
    )
    for i, (g, w_) in enumerate(zip(got, want)):
        if w_.dtype == bool:
            # a compare may flip under f32 rounding where the float64 difference it decided on
            # is within rounding of zero (e.g. sigmoid saturating to 1.0 in f32): only there
            near = np.abs(want[i + 1]) <= 1e-5 * scale + 1e-5
            assert ((g == w_) | near).all(), ops
        else:
            err = np.abs(g.astype(np.float64) - w_)
            assert (err <= 1e-5 * scale + 1e-5 * np.abs(w_)).all(), (err.max(), scale, ops)


def _mlp_plans():
    """The MLP gradient's plans for the cpu and gpu targets."""
    from dlvm_eq.models import mlp
    from dlvm_eq.pipeline import plan_function

    rng = np.random.default_rng(9)
    params = mlp.init_params([784, 256, 10], seed=9)
    x = rng.random((256, 784), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 256)]
    module = dq.jit(dq.value_and_grad(mlp.loss, argnums=(0, 1, 2, 3))).lower(*params, x, y)
    fn = next(iter(module.functions.values()))
    return (plan_function(fn, module, target="cpu"), plan_function(fn, module, target="gpu"))


def test_the_mlp_plan_fuses_its_two_epilogues_on_the_cpu_only(monkeypatch):
    from dlvm_eq.codegen.planning.plan import GemmStep

    cpu, gpu = _mlp_plans()
    fused = [s for s in cpu.steps if isinstance(s, GemmStep)]
    # bias + ReLU (+ its mask) after x @ w1; the ReLU gradient's select after dz @ w2.T
    assert [(f.blas.a.text(cpu.slots), f.blas.b.text(cpu.slots)) for f in fused][0] == ("%x", "%w1")
    assert fused[1].blas.b.text(cpu.slots) == "%w2.T"
    assert len(fused) == 2
    assert [f.epilogue.spec.name.split("_", 1)[1] for f in fused] == [
        "add_relu_greaterThan",
        "select",
    ]
    assert "+ epilogue k0_add_relu_greaterThan" in str(cpu)
    assert not any(isinstance(s, GemmStep) for s in gpu.steps)
    assert len(cpu.kernels) == 7  # the epilogues count as kernels (of their GEMMs)
    monkeypatch.setenv("DLVM_EQ_EPILOGUES", "0")
    config.reload()  # (conftest re-reads the restored environment after the test)
    off, _ = _mlp_plans()
    assert not any(isinstance(s, GemmStep) for s in off.steps)


def test_big_products_keep_their_consumers_unfused():
    """Only products of at most MAX_FUSED_ELEMENTS elements take an epilogue."""
    from dlvm_eq.codegen.planning.epilogue import MAX_FUSED_ELEMENTS
    from dlvm_eq.codegen.planning.plan import GemmStep
    from dlvm_eq.pipeline import plan_function

    def layer(x, w, b):
        return dq.relu(x @ w + b)

    def fused(n):
        args = (np.ones((n, 8), np.float32), np.ones((8, n), np.float32), np.ones(n, np.float32))
        module = dq.jit(layer).lower(*args)
        fn = next(iter(module.functions.values()))
        return any(isinstance(s, GemmStep) for s in plan_function(fn, module, target="cpu").steps)

    side = int(MAX_FUSED_ELEMENTS**0.5)
    assert fused(side) and not fused(2 * side)


def test_numpys_blas_is_the_default_and_dlvm_eq_gemm_1_turns_ours_on():
    """DLVM_EQ_GEMM unset or "auto": numpy's BLAS on every host (measured faster at the program
    level on an AVX2 and an AVX-512 host, gemm_runtime.DEFAULT_ENABLED); "1" our GEMM, "0"
    never. (The test session sets "1", conftest.py, so the GEMM paths are tested on every host.)"""
    code = "from dlvm_eq.codegen.runtime import gemm_runtime as g; print(g.enabled(), g.worth_our_gemm(512, 512, 512))"
    for setting, want in (("auto", False), ("", False), ("0", False), ("1", True)):
        env = {**os.environ, "DLVM_EQ_GEMM": setting}
        r = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [str(want), str(want)], (setting, r.stdout)
