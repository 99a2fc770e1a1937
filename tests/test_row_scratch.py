"""Long rows keep their costly values in the stack buffer (codegen/kernels/row_limit.py's
SCRATCH: a profile's measured crossover, else 32768 elements since issue 36; 8192 before), and keeping changes no bit: a softmax over rows on
either side of both limits gives the same bits whether its exp is kept or recomputed (the kept
value is the recomputed one, stored), and agrees with float64 numpy within float32 rounding."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlvm_eq.codegen import KernelInput, Load, unary
from dlvm_eq.codegen.kernels import row_limit
from dlvm_eq.codegen.kernels.rows import RowSpec
from dlvm_eq.codegen.runtime.row_kernel import RowKernel


def _softmax(rows: int, cols: int, scratch: int) -> RowKernel:
    v = Load(0)
    spec = RowSpec(
        f"softmax_keep{scratch}",  # its own kernel (cache key) per limit
        rows,
        cols,
        [KernelInput("f32")],
        [(v, "max", None), (unary("exp", v - Load(1)), "add", None)],
        [unary("exp", v - Load(1)) / Load(2)],
    )
    return RowKernel(spec, threads=1)


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cols=st.sampled_from([8192, 8193, 16384, 32768, 32769]), rows=st.integers(1, 3))
def test_kept_and_recomputed_rows_give_the_same_bits(cols, rows, monkeypatch):
    x = np.random.default_rng(cols + rows).standard_normal((rows, cols)).astype(np.float32) * 4
    got = {}
    for scratch in (1, row_limit.SHIPPED_SCRATCH):  # 1: every row recomputes
        monkeypatch.setattr(row_limit, "SCRATCH", scratch)
        k = _softmax(rows, cols, scratch)
        got[scratch] = k(x)[0]
        if scratch > 1:
            assert ("stash" in k.ir.text) == (cols <= row_limit.SCRATCH)
    a, b = got.values()
    assert a.tobytes() == b.tobytes()
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    # each output: an exp (a few ulps) over a float32 sum of `cols` terms (at most cols * u)
    np.testing.assert_allclose(b, want, rtol=8 * 2.0**-24 + cols * 2.0**-24, atol=0)


def test_the_shipped_limit_keeps_rows_of_16384():
    assert row_limit.SCRATCH == row_limit.SHIPPED_SCRATCH >= 16384
    pytest.importorskip("llvmlite")
    assert "stash" in _softmax(2, 16384, row_limit.SCRATCH).ir.text
