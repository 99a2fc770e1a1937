"""plan_cost prices a slice scatter by how it writes (calibration/plan_cost.slice_scatter_kind):
slices that are contiguous rows ("sliceScatter_rows", calibrated on its own grid) against
element-strided ones along the innermost axis ("sliceScatter"), which run ~20x slower per byte;
a profile without the row grid prices row scatters as the copy of their bytes. The calibration
plan of the row kind computes what numpy computes."""

from __future__ import annotations

import numpy as np
from test_calibration import sample_profile
from test_plan_prediction import GRID

from dlvm_eq.calibration.measure_steps import KINDS, c_view, tiny_plan
from dlvm_eq.calibration.plan_cost import STEP_KINDS, slice_scatter_kind, step_price
from dlvm_eq.codegen import program
from dlvm_eq.codegen.planning.gather import SliceScatterStep
from dlvm_eq.extract.machine import MACHINES, from_profile

SLOW = tuple((b, t * 20) for b, t in GRID)  # an element-strided scatter's grid


def scatter_plan(shape, axis: int, lo: int, step: int):
    src = list(shape)
    src[axis] = (shape[axis] - lo + step - 1) // step
    s = SliceScatterStep(c_view(0, tuple(src)), axis, lo, step, 1)
    plan = tiny_plan("ss", [(tuple(src), "f32")], [(tuple(shape), "f32")], [s])
    return plan, s, np.arange(np.prod(src), dtype=np.float32).reshape(src)


def machine_with(**grids):
    steps = {k: GRID for k in STEP_KINDS if k != "sliceScatter_rows"}
    return from_profile(sample_profile(steps={**steps, **grids}), MACHINES["cpu"])


def test_each_slice_scatter_is_priced_by_its_own_kind():
    rows, rs, _ = scatter_plan((64, 256), 0, 1, 1)  # a block of rows: zero padding
    cols, cs, _ = scatter_plan((256, 64), 1, 0, 2)  # every other column
    short, ss, _ = scatter_plan((256, 8, 8), 1, 0, 2)  # rows of 8: shorter than a run
    assert slice_scatter_kind(rs, rows) == "sliceScatter_rows"
    assert slice_scatter_kind(cs, cols) == "sliceScatter"
    assert slice_scatter_kind(ss, short) == "sliceScatter"
    mc = machine_with(sliceScatter=SLOW, sliceScatter_rows=GRID)
    p_rows, p_cols = step_price(rs, rows, mc), step_price(cs, cols, mc)
    assert (p_rows.kind, p_cols.kind) == ("sliceScatter_rows", "sliceScatter")
    # the same bytes moved: the strided one is priced on the slow grid
    assert p_cols.seconds > 5 * p_rows.seconds


def test_a_profile_without_the_row_grid_prices_row_scatters_as_a_copy():
    rows, rs, _ = scatter_plan((64, 256), 0, 1, 1)
    half = tuple((b, t / 2) for b, t in GRID)
    old = machine_with(sliceScatter=SLOW, copy=half)  # measured before the row kind existed
    new = machine_with(sliceScatter=SLOW, sliceScatter_rows=half, copy=half)
    strided = machine_with(sliceScatter=SLOW, sliceScatter_rows=SLOW, copy=half)
    assert "sliceScatter_rows" not in old.step_grids
    assert abs(step_price(rs, rows, old).seconds - step_price(rs, rows, new).seconds) < 1e-12
    assert step_price(rs, rows, old).seconds < step_price(rs, rows, strided).seconds / 5


def test_the_row_calibration_plan_scatters_every_other_row():
    plan, args, nbytes = KINDS["sliceScatter_rows"](1 << 12)
    want = np.zeros((2 * args[0].shape[0], args[0].shape[1]), np.float32)
    want[::2] = args[0]
    np.testing.assert_array_equal(program(plan)(*args), want)
    assert nbytes == 4 * (args[0].size + want.size)


def test_the_native_kernel_agrees_with_numpy_on_both_kinds():
    for shape, axis, lo, step in (
        ((64, 256), 0, 1, 1),
        ((256, 64), 1, 0, 2),
        ((6, 5, 32), 1, 1, 2),
    ):
        plan, _, src = scatter_plan(shape, axis, lo, step)
        want = np.zeros(shape, np.float32)
        idx = [slice(None)] * len(shape)
        idx[axis] = slice(lo, None, step)
        want[tuple(idx)] = src
        np.testing.assert_array_equal(program(plan)(src), want)
