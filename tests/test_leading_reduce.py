"""Reductions over leading axes (a bias gradient: (16, 128, 1024) summed to (1024,)) run as
slices of the reduced rows, each call updating a whole row of outputs, not as calls that each
own a few outputs and read a short piece of every input row a page apart (measured 12 ms
instead of ~1 here). Results against float64 numpy, and the same bits with 1 and 2 threads."""

from __future__ import annotations

import numpy as np
import pytest

from dlvm_eq.codegen.kernels.kernel_spec import KernelInput, ReduceSpec
from dlvm_eq.codegen.kernels.spec import Load
from dlvm_eq.codegen.runtime import cpu_kernel
from dlvm_eq.codegen.runtime.cpu_kernel import CpuKernel


def _calls(monkeypatch) -> list:
    """Records every (o0, o1, r0, r1) a reduction kernel is called with, then runs it."""
    seen: list = []
    real_chunks, real_ranges = cpu_kernel.run_chunks, cpu_kernel.run_ranges

    def chunks(fn, args, threads):
        seen.extend(tuple(a[:4]) for a in args)
        real_chunks(fn, args, threads)

    def ranges(fn, rs, tail, threads):
        seen.extend((lo, hi) + tuple(tail[:2]) for lo, hi in rs)
        real_ranges(fn, rs, tail, threads)

    monkeypatch.setattr(cpu_kernel, "run_chunks", chunks)
    monkeypatch.setattr(cpu_kernel, "run_ranges", ranges)
    return seen


@pytest.mark.parametrize(
    "shape, axes", [((16, 128, 1024), (0, 1)), ((3000, 7, 33), (0,)), ((2048, 64), (0,))]
)
def test_leading_axes_reductions_run_over_whole_rows_of_outputs(monkeypatch, shape, axes):
    spec = ReduceSpec("bias_grad", shape, [KernelInput("f32")], Load(0) * 2.0, "add", axes)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    seen = _calls(monkeypatch)
    one, two = CpuKernel(spec, threads=1)(x), CpuKernel(spec, threads=2)(x)
    n_out = int(np.prod(spec.out_shape))
    assert len(seen) >= 4 and all((o0, o1) == (0, n_out) for o0, o1, _, _ in seen), seen[:4]
    np.testing.assert_array_equal(one, two)  # the thread count changes no bit
    want = 2.0 * x.astype(np.float64).sum(axes)
    np.testing.assert_allclose(one, want, rtol=1e-5, atol=1e-4 * np.sqrt(x.size / n_out))


def test_middle_axis_reductions_still_split_their_outputs(monkeypatch):
    """Kept axes before the reduced one too: splitting the outputs measured faster there."""
    shape = (64, 96, 40)
    spec = ReduceSpec("mid", shape, [KernelInput("f32")], Load(0), "max", (1,))
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    seen = _calls(monkeypatch)
    np.testing.assert_array_equal(CpuKernel(spec, threads=2)(x), x.max(1))
    assert seen and all(r0 == 0 and r1 == 96 for _, _, r0, r1 in seen)


def test_leading_reduction_with_an_init_and_max():
    shape = (40, 3, 50)
    spec = ReduceSpec("m", shape, [KernelInput("f64")], Load(0), "max", (0, 1), init=0.5)
    x = np.random.default_rng(2).standard_normal(shape)
    np.testing.assert_array_equal(CpuKernel(spec, threads=2)(x), np.maximum(x.max((0, 1)), 0.5))
