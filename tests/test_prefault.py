"""A program's first arena and its convolutions' scratch are faulted in by a helper thread
while its kernels load (codegen/runtime/prefault.py, execution/cpu_program.py,
runtime/conv_cpu.reserve): the pages become resident without a write of the caller's, nothing
in them is written, the first call runs in exactly those buffers (the reserved scratch has the
sizes the convolutions ask for, on random geometries), and its results are those of a program
made without the helper, bit for bit, and the interpreter's."""

from __future__ import annotations

import mmap
import sys
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_kernels import _three, conv_cases

import dlvm_eq as dq
from dlvm_eq.codegen import set_cache_dir
from dlvm_eq.codegen.execution import cpu_program
from dlvm_eq.codegen.execution.cpu_program import CpuProgram
from dlvm_eq.codegen.runtime import conv_blocks, conv_cpu, conv_reuse, prefault
from dlvm_eq.ir import interpret
from dlvm_eq.pipeline import plan_function

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="madvise(MADV_POPULATE_WRITE) is Linux's"
)

RNG = np.random.default_rng(0)
X = RNG.standard_normal((256, 512)).astype(np.float32)  # 512 KiB per temporary
W = (RNG.standard_normal((512, 512)) / np.sqrt(512)).astype(np.float32)


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def _fresh(nbytes: int) -> np.ndarray:
    """Pages of a new anonymous mapping: none resident until touched."""
    return np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)


def test_populate_makes_every_page_resident_and_writes_nothing():
    a = _fresh(4 << 20)
    assert not prefault.populated(a)
    assert prefault.populate(a)
    assert prefault.populated(a)
    assert not a.any()  # a fresh mapping reads zeros, still
    b = _fresh(1 << 20)
    b[::4096] = 7  # written first by the caller: populate leaves the bytes as they are
    assert prefault.populate(b) and prefault.populated(b)
    assert (b[::4096] == 7).all() and int(b.sum()) == 7 * (b.size // 4096)


def test_a_populate_racing_the_callers_writes_loses_none_of_them():
    for _ in range(5):
        a = _fresh(32 << 20)
        done = prefault.populate_in_background([a])
        a[::512] = np.arange(a[::512].size, dtype=np.uint8)  # meanwhile, the caller writes
        assert done.wait(60)
        assert (a[::512] == np.arange(a[::512].size, dtype=np.uint8)).all()
        assert prefault.populated(a)


def _chain(x, w):
    for _ in range(4):
        x = dq.tanh(x @ w) * 0.5 + x
    return dq.sum(x * x, axis=1)


def _plan():
    module = dq.make_ir(_chain)(X, W)
    name = next(iter(module.functions))
    return module, name, plan_function(module[name], module)


def _program(monkeypatch, cpus: int) -> CpuProgram:
    monkeypatch.setattr(cpu_program, "thread_count", lambda environ=None: cpus)
    return CpuProgram(_plan()[2])


def test_the_first_call_runs_in_the_arena_the_helper_faulted_in(monkeypatch):
    module, name, plan = _plan()
    assert plan.arena_bytes >= prefault.MIN_BYTES
    prog = _program(monkeypatch, 2)
    assert prog.prefault is not None and prog.prefault.wait(60)
    (env,) = prog._arenas
    assert all(
        prefault.populated(a)
        for s, a in enumerate(env[: len(plan.slots)])
        if s in plan.offsets and isinstance(a, np.ndarray)
    )
    made = []
    monkeypatch.setattr(prog, "_arena", lambda: made.append(1) or CpuProgram._arena(prog))
    got = prog(X, W)
    assert made == []  # no second arena: the call took the faulted one
    alone = _program(monkeypatch, 1)  # one CPU: no helper, the arena is made by the call
    assert alone.prefault is None and alone._arenas == []
    want = alone(X, W)
    assert got.tobytes() == want.tobytes()
    ref = interpret(module, name, X, W, float64=True)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


def test_calls_from_threads_while_the_helper_runs_agree_bit_for_bit(monkeypatch):
    want = _program(monkeypatch, 1)(X, W).tobytes()
    for _ in range(3):
        prog = _program(monkeypatch, 2)  # called at once: the helper may still be faulting
        results: list = [None] * 4

        def call(i, prog=prog, results=results):
            results[i] = prog(X, W).tobytes()

        threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        call_here = prog(X, W).tobytes()
        for t in threads:
            t.join()
        assert prog.prefault.wait(60)
        assert set(results) == {want} and call_here == want


def test_a_small_arena_starts_no_helper(monkeypatch):
    small = RNG.standard_normal((8, 8)).astype(np.float32)
    module = dq.make_ir(lambda x: dq.sum(dq.tanh(x @ x) * x))(small)
    name = next(iter(module.functions))
    monkeypatch.setattr(cpu_program, "thread_count", lambda environ=None: 2)
    prog = CpuProgram(plan_function(module[name], module))
    assert prog.plan.arena_bytes < prefault.MIN_BYTES and prog.prefault is None
    np.testing.assert_allclose(prog(small), interpret(module, name, small, float64=True), rtol=1e-5)


def _cnn_plan():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 4, 16, 16)).astype(np.float32)
    w1 = (rng.standard_normal((8, 4, 3, 3)) / 6).astype(np.float32)  # one product per image
    w2 = (rng.standard_normal((32, 8, 3, 3)) / 8).astype(np.float32)  # one product per chunk

    def loss(w1, w2, x):
        h = dq.relu(dq.conv2d(x, w1, padding=1))
        return dq.mean(dq.tanh(dq.conv2d(h, w2, padding=1)))

    step = dq.jit(dq.value_and_grad(loss, argnums=(0, 1)))
    args = (w1, w2, x)
    return step.report(*args).plan, args, step(*args)


def _on_a_new_thread(fn):
    """fn() on a thread of its own: the convolutions' scratch is per thread, so it starts
    with none (what a fresh process has)."""
    out: list = []

    def run():
        try:
            out.append((True, fn()))
        except BaseException as e:  # raised again here, where pytest sees it
            out.append((False, e))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value


def test_the_convolutions_scratch_is_faulted_in_and_the_first_call_uses_it(monkeypatch):
    from dlvm_eq.codegen.execution.window_steps import conv_scratch

    plan, args, jitted = _cnn_plan()
    monkeypatch.setattr(cpu_program, "thread_count", lambda environ=None: 2)

    def first_call():
        prog = CpuProgram(plan)
        assert prog.prefault is not None and prog.prefault.wait(60)
        before = conv_scratch(plan)  # this thread's: the same matrices, made by the program
        big = [a for a in before if a.nbytes >= prefault.MIN_BYTES]
        assert len(big) >= 3 and all(prefault.populated(a) for a in big)  # cols, long, forward
        out = prog(*args)
        after = conv_scratch(plan)
        # the call used those matrices: none was replaced by a larger one
        assert [id(a) for a in after] == [id(a) for a in before]
        return out

    got = _on_a_new_thread(first_call)
    monkeypatch.setattr(cpu_program, "thread_count", lambda environ=None: 1)
    want = _on_a_new_thread(lambda: CpuProgram(plan)(*args))
    flat = lambda r: b"".join(np.asarray(a).tobytes() for a in jax_free_leaves(r))
    assert flat(got) == flat(want) == flat(jitted)


def jax_free_leaves(tree):
    """The arrays of a (value, grads) result, in order."""
    if isinstance(tree, (tuple, list)):
        return [leaf for item in tree for leaf in jax_free_leaves(item)]
    return [tree]


@settings(max_examples=40, deadline=None)
@given(conv_cases(), st.sampled_from([0, 1 << 30]), st.sampled_from([1, 3000, 64 << 20]))
def test_reserve_makes_the_matrices_the_three_convolutions_then_use(case, macs, chunk_bytes):
    """conv_cpu.reserve's sizes are the calls' own, for products per image or per chunk, one
    chunk or many: after it, the three ops (the forward first, its matrix kept for the weight
    adjoint) replace none of the matrices it made."""
    attrs, xs, ws, dt = case
    dtype = {"f32": np.float32, "f64": np.float64}[dt]
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype)
    dy = conv_cpu.evaluate("conv2d", [x, w], attrs, np.matmul)
    convs = [
        ("conv2d", xs, ws, dtype, attrs),
        ("conv2dBackwardInput", dy.shape, ws, dtype, dict(attrs, size=xs[2:])),
        ("conv2dBackwardWeight", xs, dy.shape, dtype, dict(attrs, size=ws[2:])),
    ]
    saved = dict(conv_blocks.BLOCKS)
    conv_blocks.BLOCKS.update(chunk_bytes=chunk_bytes, per_image_macs=macs)
    try:

        def run():
            before = conv_cpu.reserve(convs)
            out = _three(x, w, dy, attrs)
            assert [id(a) for a in conv_cpu.reserve(convs)] == [id(a) for a in before]
            # and the calls made no matrix of their own: each one there is a reserved one
            used = list(getattr(conv_cpu._local, "scratch", {}).values()) + [
                k.matrix for k in getattr(conv_reuse._local, "kept", {}).values()
            ]
            assert {id(a) for a in used} <= {id(a) for a in before}
            return out

        got = _on_a_new_thread(run)
        want = _on_a_new_thread(lambda: _three(x, w, dy, attrs))  # nothing reserved first
    finally:
        conv_blocks.BLOCKS.clear()
        conv_blocks.BLOCKS.update(saved)
    assert all(g.tobytes() == v.tobytes() for g, v in zip(got, want))
