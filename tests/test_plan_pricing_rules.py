"""Pricing rules of the planned-program prediction (calibration/plan_cost.py, view_cost.py) and
the calibration measurements behind them: operand views priced by their measured ops, outer
products (k = 1) by their own measured products, a kernel by the slower of its bytes and its
arithmetic, the flop rate beyond the kernel call, products measured over several sweeps."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from test_calibration import cache_dir, sample_profile  # noqa: F401 - the fixture is used by name
from test_plan_prediction import GRID, calibrated_profile, map_plan

from dlvm_eq.calibration import measure, measure_steps
from dlvm_eq.calibration.measure_steps import c_view, tiny_plan, view_plan
from dlvm_eq.calibration.plan_cost import predict_plan, product_seconds, step_price
from dlvm_eq.calibration.view_cost import VIEW_KINDS, VIEW_OPS, step_views
from dlvm_eq.codegen import KernelInput, KernelSpec, Load, program
from dlvm_eq.codegen.planning.plan import BlasStep, ConcatStep, GemmStep, KernelStep, View
from dlvm_eq.extract.machine import MACHINES, from_profile
from dlvm_eq.extract.profile import MatmulPoint, Profile

BROADCAST_S = 7e-6  # what np.broadcast_to costs a call here, about


def view_machine(**views):
    steps = {k: GRID for k in ("map", "concat", "copy")}
    steps.update({f"view_{op}": ((1.0, s),) for op, s in views.items()})
    return from_profile(calibrated_profile(steps=steps), MACHINES["cpu"])


def concat_plan(broadcast: bool):
    """[zeros | x] along axis 1, the zeros a broadcast scalar (the adjoint of a slice) or an
    array of the same shape."""
    zeros = (
        View(0, (32, 96), (0, 0), (("broadcast", (32, 96)),)) if broadcast else c_view(0, (32, 96))
    )
    step = ConcatStep((zeros, c_view(1, (32, 32))), 1, 2)
    return tiny_plan(
        "cat",
        [((), "f32") if broadcast else ((32, 96), "f32"), ((32, 32), "f32")],
        [((32, 128), "f32")],
        [step],
    )


# ---------------------------------------------------------------- views


def test_a_broadcast_part_costs_its_measured_view_op():
    mc = view_machine(broadcast=BROADCAST_S, transpose=2e-7)
    plain, broadcast = predict_plan(concat_plan(False), mc), predict_plan(concat_plan(True), mc)
    # the same bytes moved: the difference is the broadcast alone
    assert broadcast.seconds - plain.seconds == pytest.approx(BROADCAST_S, rel=1e-6)


def test_views_cost_nothing_without_a_measurement():
    for mc in (
        MACHINES["cpu"],
        from_profile(calibrated_profile(steps={"concat": GRID}), MACHINES["cpu"]),
    ):
        assert predict_plan(concat_plan(True), mc).seconds == pytest.approx(
            predict_plan(concat_plan(False), mc).seconds
        )


def test_a_gemm_step_reads_through_its_products_views_and_results_are_priced_in_the_call():
    a_t = View(0, (16, 8), (1, 16), (("transpose", (1, 0)),))
    blas = BlasStep(a_t, c_view(1, (8, 4)), 2)
    spec = KernelSpec("relu", (16, 4), [KernelInput("f32")], [Load(0)])
    gemm = GemmStep(blas, KernelStep(spec, (2,), (3,)), 0)
    assert step_views(gemm) == [a_t, blas.b]
    plan = tiny_plan(
        "gemm", [((8, 16), "f32"), ((8, 4), "f32")], [((16, 4), "f32"), ((16, 4), "f32")], [gemm]
    )
    mc, free = view_machine(transpose=3e-7), view_machine()
    assert step_price(gemm, plan, mc).seconds - step_price(
        gemm, plan, free
    ).seconds == pytest.approx(3e-7)
    plan.results = [View(3, (4, 16), (1, 4), (("transpose", (1, 0)),))]
    assert predict_plan(plan, mc).call == pytest.approx(mc.program_call + 3e-7)


@pytest.mark.parametrize("op", VIEW_OPS)
def test_each_view_calibration_plan_reads_through_its_view(op):
    plan, args = view_plan(op)
    assert [link[0] for link in plan.steps[0].src.chain] == [op]
    x = args[0]
    want = {
        "transpose": lambda: x.T,
        "reshape": lambda: x.reshape(-1),
        "broadcast": lambda: np.broadcast_to(x, (8, 8)),
        "slice": lambda: x[:, :8],
        "strided": lambda: x.reshape(8, 8),
    }[op]()
    np.testing.assert_array_equal(program(plan)(*args), want)


def test_the_view_grids_round_trip_in_the_profile():
    grids = measure_steps.view_grids()
    assert set(grids) == set(VIEW_KINDS)
    assert all(len(g) == 1 and g[0][1] > 0 for g in grids.values())
    p = calibrated_profile(steps={**calibrated_profile().steps, **grids})
    q = Profile.from_json(p.to_json())
    assert q == p
    assert from_profile(q, MACHINES["cpu"]).step_grids["view_broadcast"] == grids["view_broadcast"]


# ---------------------------------------------------------------- outer products


def outer_machine():
    """k = 1 products measured 4x slower per flop than k = 8 (numpy's loop without BLAS)."""
    return from_profile(
        sample_profile(
            matmuls=(
                MatmulPoint(16, 16, 16, 2e-6),
                MatmulPoint(256, 1, 256, 1e-4),
                MatmulPoint(256, 8, 256, 2.5e-5),
            )
        ),
        MACHINES["cpu"],
    )


def test_an_outer_product_is_priced_from_the_measured_outer_products():
    mc = outer_machine()
    # as many flops as the measured outer product: its time, whatever the BLAS points say
    assert product_seconds(mc, 512, 1, 128) == pytest.approx(1e-4, rel=1e-6)


def test_a_small_k_product_is_not_priced_from_an_outer_product():
    mc = outer_machine()
    # 256x3x256 from the k = 8 product, about 3/8 of its work (blended with the outer product,
    # nearer in shape, it would cost 5x that)
    work = (2.5e-5 - 2e-6) * 3 / 8
    assert product_seconds(mc, 256, 3, 256) == pytest.approx(2e-6 + work, rel=0.05)


# ---------------------------------------------------------------- kernels: bytes or arithmetic


def test_arithmetic_within_a_kernels_traffic_costs_nothing_more():
    # fast arithmetic: an exp per element is hidden by the bytes moved
    fast = from_profile(calibrated_profile(flop_rate=1e15), MACHINES["cpu"])
    assert (
        predict_plan(map_plan(1 << 14, ops=1), fast).seconds
        == predict_plan(map_plan(1 << 14, ops=0), fast).seconds
    )
    # slow arithmetic: the kernel costs its call and its arithmetic, not its bytes on top
    slow = from_profile(calibrated_profile(flop_rate=1e8), MACHINES["cpu"])
    n, call = 1 << 14, GRID[0][1]
    compute = n * 14.0 / 1e8  # sample_profile's exp: 14 flops per element; one thread
    assert predict_plan(map_plan(n, ops=1), slow).steps[0].seconds == pytest.approx(
        slow.step_call + call + compute
    )


def test_a_column_sum_is_priced_as_a_contiguous_reduction():
    from dlvm_eq.codegen import ReduceSpec

    steps = {"reduce": ((1e3, 1e-6), (1e7, 1e-3)), "reduce_lead": ((1e3, 5e-6), (1e7, 5e-3))}
    mc = from_profile(calibrated_profile(steps=steps), MACHINES["cpu"])

    def kind(shape, axes):
        spec = ReduceSpec("s", shape, [KernelInput("f32")], Load(0), "add", axes)
        out = tuple(d for i, d in enumerate(shape) if i not in axes)
        plan = tiny_plan("s", [(shape, "f32")], [(out, "f32")], [KernelStep(spec, (0,), (1,))])
        return step_price(plan.steps[0], plan, mc).kind

    assert kind((1024, 1), (0,)) == kind((1024,), (0,)) == "reduce"
    assert kind((1024, 8), (0,)) == "reduce_lead"


# ---------------------------------------------------------------- calibration measurements


def test_the_flop_rate_leaves_out_the_copy_kernel_around_the_arithmetic(monkeypatch):
    # per element: the chain's kernel 1.0 ns, the copy kernel 0.4 (each disturbed once)
    times = {
        "calib_fma": iter([1.5e-9, 1.0e-9, 1.2e-9]),
        "calib_add": iter([0.4e-9, 0.4e-9, 0.9e-9]),
    }
    monkeypatch.setattr(
        measure, "_cached_timer", lambda name, body, inputs=1: lambda: next(times[f"calib_{name}"])
    )
    # 16 multiply-adds less the copy kernel's one add, in the 0.6 ns they add
    assert measure.flop_rate() == pytest.approx((2 * measure.FMA_CHAIN - 1) / 0.6e-9)


def test_each_product_is_its_fastest_sweep(monkeypatch):
    sweeps = iter(
        [5e-3, 2e-5, 1e-5, 3e-5]
    )  # two shapes, two sweeps: the first product disturbed once
    monkeypatch.setattr(measure, "fastest_seconds", lambda fn, repeats=9, cap_s=1.0: next(sweeps))
    points = measure.matmuls(
        shapes=[(8, 8, 8), (16, 16, 16)], layouts=((False, False),), passes=2, retries=0
    )
    calls = [max(1, int(2e6 // (2 * s**3))) for s in (8, 16)]
    assert [p.seconds for p in points] == pytest.approx([1e-5 / calls[0], 2e-5 / calls[1]])


# ---------------------------------------------------------------- the extraction cost of a product


def test_a_measured_product_is_not_charged_its_operands_traffic_again():
    from dlvm_eq.extract.target_cost import TargetCost

    calibrated = TargetCost(from_profile(sample_profile(), MACHINES["cpu"]), {})
    assert calibrated.gemm_seconds(1024, 1024, 1024, 4) == calibrated.dot_seconds(1024, 1024, 1024)
    # the shipped formula (flops at a peak rate) still adds the operands beyond the cache
    defaults = TargetCost(MACHINES["cpu"], {})
    assert defaults.gemm_seconds(1024, 1024, 1024, 4) > defaults.dot_seconds(1024, 1024, 1024)


# ---------------------------------------------------------------- profiles of an older calibrate


def test_a_version_2_profile_still_prices_with_a_warning(cache_dir):
    from dlvm_eq.extract.machine import machine
    from dlvm_eq.extract.profile import load_profile, profile_path

    data = json.loads(calibrated_profile().to_json())
    data["version"] = 2
    for kind in VIEW_KINDS:
        data["steps"].pop(kind, None)
    profile_path("cpu").parent.mkdir(parents=True)
    profile_path("cpu").write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="older `dlvm-eq calibrate`.*version 2"):
        p = load_profile("cpu")
    assert p is not None and p.outdated and not p.stale
    assert (
        predict_plan(concat_plan(True), machine("cpu")).priced_by
        == f"measured profile {machine('cpu').profile}"
    )
    assert Profile.from_json(p.to_json()) == p  # it stays a version-2 profile


def test_a_profile_of_this_calibrate_loads_without_a_warning(cache_dir):
    from dlvm_eq.extract.profile import load_profile, write_profile

    write_profile(calibrated_profile())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = load_profile("cpu")
    assert p is not None and not p.outdated


def fake_sweeps(monkeypatch, per_call_seconds: dict) -> list:
    """matmuls' timings replaced: product of side s takes the next of per_call_seconds[s] per
    call; returns the sides in the order they were timed."""
    timed = []

    def fastest(run, repeats=9, cap_s=1.0):
        side, calls = run
        timed.append(side)
        return next(per_call_seconds[side]) * calls

    # a product's timed function stands for (its side: its A operand's rows, its calls)
    monkeypatch.setattr(
        measure, "per_call", lambda run, calls: (run.__defaults__[0].shape[0], calls)
    )
    monkeypatch.setattr(measure, "fastest_seconds", fastest)
    return timed


def test_a_product_slower_than_a_larger_one_is_measured_again(monkeypatch):
    # 8^3 disturbed in both sweeps (slower than 16^3), quiet on the third: only it is timed again
    timed = fake_sweeps(monkeypatch, {8: iter([5e-3, 4e-3, 1e-6]), 16: iter([8e-6, 9e-6])})
    points = measure.matmuls(
        shapes=[(8, 8, 8), (16, 16, 16)], layouts=((False, False),), passes=2, retries=3
    )
    assert [p.seconds for p in points] == pytest.approx([1e-6, 8e-6])
    assert timed == [8, 16, 8, 16, 8]


def test_a_product_far_slower_per_flop_than_a_smaller_one_is_measured_again(monkeypatch):
    # 16^3 at 8x the per-flop time of 8^3 in both sweeps (nothing larger to compare with), then quiet
    timed = fake_sweeps(monkeypatch, {8: iter([1e-6, 1e-6]), 16: iter([64e-6, 64e-6, 8e-6])})
    points = measure.matmuls(
        shapes=[(8, 8, 8), (16, 16, 16)], layouts=((False, False),), passes=2, retries=3
    )
    assert [p.seconds for p in points] == pytest.approx([1e-6, 8e-6])
    assert timed == [8, 16, 8, 16, 16]


def test_the_other_measurements_run_between_the_product_sweeps(monkeypatch):
    # three sweeps, a measurement after each of the first two; a third measurement with no
    # sweep left after it still runs, once
    events = []
    timed = fake_sweeps(monkeypatch, {8: iter([1e-6] * 3), 16: iter([8e-6] * 3)})
    between = [lambda k=k: events.append((k, len(timed))) for k in range(4)]
    points = measure.matmuls(
        shapes=[(8, 8, 8), (16, 16, 16)],
        layouts=((False, False),),
        passes=3,
        retries=0,
        between=between,
    )
    assert [p.seconds for p in points] == pytest.approx([1e-6, 8e-6])
    assert events == [(0, 2), (1, 4), (2, 6), (3, 6)]
