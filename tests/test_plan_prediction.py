"""The predicted time of a planned program (calibration/plan_cost.py), the step timings that
`dlvm-eq calibrate` stores for it, and `dlvm-eq compile --measure`."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import math
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_calibration import cache_dir, sample_profile  # noqa: F401 - the fixture is used by name

from dlvm_eq.calibration import measure_steps
from dlvm_eq.calibration.measure_steps import KINDS, c_view, step_grids, tiny_plan, window_plan
from dlvm_eq.calibration.plan_cost import STEP_KINDS, predict_plan, product_seconds, step_price
from dlvm_eq.codegen import KernelInput, KernelSpec, Load, unary
from dlvm_eq.codegen.kernels.map_reduce import MapReduceSpec
from dlvm_eq.codegen.planning import plan as plan_mod
from dlvm_eq.codegen.planning.attention import AttentionStep
from dlvm_eq.codegen.planning.plan import (
    AliasStep,
    BlasStep,
    GemmStep,
    KernelStep,
    MapReduceStep,
    View,
)
from dlvm_eq.extract.machine import MACHINES, from_profile, machine
from dlvm_eq.extract.profile import (
    MatmulPoint,
    Profile,
    load_profile,
    profile_path,
)
from dlvm_eq.ir import window_ops

ROOT = Path(__file__).resolve().parent.parent
GRID = ((1e3, 2e-6), (1e5, 2e-5), (1e7, 2e-3))  # a synthetic step grid: bytes -> seconds


def calibrated_profile(**changes) -> Profile:
    """sample_profile with step grids for every kind, and call costs."""
    return sample_profile(
        **{
            "steps": {k: GRID for k in STEP_KINDS},
            "program_call": 4e-6,
            "step_call": 5e-7,
            **changes,
        }
    )


MACHINE_CASES = {
    "defaults": MACHINES["cpu"],
    "profile": from_profile(calibrated_profile(), MACHINES["cpu"]),
}


@pytest.fixture(params=sorted(MACHINE_CASES))
def mc(request):
    return MACHINE_CASES[request.param]


# ---------------------------------------------------------------- plans whose order is certain


def product_plan(m: int, k: int, n: int) -> tuple:
    step = BlasStep(c_view(0, (m, k)), c_view(1, (k, n)), 2)
    return tiny_plan(
        f"mm_{m}_{k}_{n}", [((m, k), "f32"), ((k, n), "f32")], [((m, n), "f32")], [step]
    )


def map_plan(n: int, ops: int = 1):
    """One map kernel of `ops` chained exps over n elements."""
    body = Load(0)
    for _ in range(ops):
        body = unary("exp", body)
    spec = KernelSpec(f"map_{n}_{ops}", (n,), [KernelInput("f32")], [body])
    return tiny_plan(spec.name, [((n,), "f32")], [((n,), "f32")], [KernelStep(spec, (0,), (1,))])


def three_kernels_plan(n: int):
    """The same three exps as three kernels, each writing a temporary the next reads."""
    steps = []
    for i in range(3):
        spec = KernelSpec(f"map3_{n}_{i}", (n,), [KernelInput("f32")], [unary("exp", Load(0))])
        src, dst = (0, 2, 3)[i], (2, 3, 1)[i]
        steps.append(KernelStep(spec, (src,), (dst,)))
    return tiny_plan(
        f"map3_{n}", [((n,), "f32")], [((n,), "f32")], steps, temps=[((n,), "f32")] * 2
    )


def test_twenty_times_fewer_flops_is_predicted_faster(mc):
    big, small = product_plan(512, 512, 512), product_plan(512, 512, 512 // 20)
    assert predict_plan(small, mc).seconds < predict_plan(big, mc).seconds


def test_ten_times_more_bytes_is_predicted_slower(mc):
    assert (
        predict_plan(map_plan(1 << 18), mc).seconds < predict_plan(map_plan(10 << 18), mc).seconds
    )


def test_one_fused_kernel_is_predicted_faster_than_three(mc):
    n = 1 << 18
    assert (
        predict_plan(map_plan(n, ops=3), mc).seconds
        < predict_plan(three_kernels_plan(n), mc).seconds
    )


def test_a_bigger_convolution_is_predicted_slower(mc):
    small = window_plan("conv2d", (4, 4, 8, 8))[0]
    big = window_plan("conv2d", (16, 8, 16, 16))[0]
    assert predict_plan(small, mc).seconds < predict_plan(big, mc).seconds


def test_a_calibrated_step_costs_the_call_its_step_and_its_grid_point():
    mc = MACHINE_CASES["profile"]
    n = int(GRID[1][0] / 8)  # a map moving 8 bytes per element: a grid point
    p = predict_plan(map_plan(n, ops=0), mc)  # no op: nothing to add for compute
    assert p.seconds == pytest.approx(4e-6 + 5e-7 + GRID[1][1])
    assert p.priced_by == f"measured profile {mc.profile}"
    assert predict_plan(map_plan(n), MACHINES["cpu"]).priced_by == "shipped defaults"


def test_an_expensive_op_costs_more_than_a_cheap_one(mc):
    # sixteen exps outweigh the kernel's bytes on either machine (below that it is memory-bound)
    spec = KernelSpec("neg", (1 << 16,), [KernelInput("f32")], [-Load(0)])
    cheap = tiny_plan(
        "neg", [((1 << 16,), "f32")], [((1 << 16,), "f32")], [KernelStep(spec, (0,), (1,))]
    )
    assert predict_plan(cheap, mc).seconds < predict_plan(map_plan(1 << 16, ops=16), mc).seconds


# ---------------------------------------------------------------- every step kind has a price


def _step_classes() -> set[type]:
    """Every plan step class codegen's planning package defines (a dataclass named *Step)."""
    import dlvm_eq.codegen.planning as planning

    found = set()
    for info in pkgutil.iter_modules(planning.__path__):
        mod = importlib.import_module(f"{planning.__name__}.{info.name}")
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if (
                cls.__module__ == mod.__name__
                and cls.__name__.endswith("Step")
                and dataclasses.is_dataclass(cls)
            ):
                found.add(cls)
    return found


def _example_steps() -> list[tuple]:
    """(plan, step) for every kind: the calibration's one-step plans, a product, a GEMM with an
    epilogue, an alias, every window op."""
    examples = [
        (plan, plan.steps[0]) for plan, _, _ in (build(1 << 12) for build in KINDS.values())
    ]
    examples += [(plan, plan.steps[0]) for plan in (product_plan(64, 32, 16),)]
    examples += [
        (plan, plan.steps[0])
        for plan, _, _, _ in (window_plan(op, (2, 3, 6, 4)) for op in window_ops.WINDOW_OPS)
    ]
    blas = BlasStep(View(0, (16, 8), (1, 16), (("transpose", (1, 0)),)), c_view(1, (8, 4)), 2)
    spec = KernelSpec("relu", (16, 4), [KernelInput("f32")], [unary("relu", Load(0))])
    gemm = GemmStep(blas, KernelStep(spec, (2,), (3,)), 0)
    examples.append(
        (
            tiny_plan(
                "gemm",
                [((8, 16), "f32"), ((8, 4), "f32")],
                [((16, 4), "f32"), ((16, 4), "f32")],
                [gemm],
            ),
            gemm,
        )
    )
    alias = tiny_plan("alias", [((8,), "f32")], [((8,), "f32")], [AliasStep(0, 2, 0)], aliases=1)
    examples.append((alias, alias.steps[0]))
    # issue 33: the fused attention kernel, q k v (1, 4, 64, 16) and a constant bias
    qkv = [((1, 4, 64, 16), "f32")] * 3
    step = AttentionStep(tuple(c_view(i, s) for i, (s, _) in enumerate(qkv)), 0.0, 0.25, False, 3)
    attention = tiny_plan("attention", qkv, [((1, 4, 64, 16), "f32")], [step])
    examples.append((attention, step))
    # issue 36: a map and its bias-gradient-like sum over the leading axes in one pass
    relu = MapReduceSpec(
        "relu_sum",
        (8, 16),
        [KernelInput("f32")],
        [unary("relu", Load(0))],
        [(unary("relu", Load(0)), "add", (0,))],
    )
    both = MapReduceStep(relu, (0,), (1,), (2,))
    fused = tiny_plan("map_reduce", [((8, 16), "f32")], [((8, 16), "f32"), ((16,), "f32")], [both])
    examples.append((fused, both))
    return examples


def test_every_step_class_has_a_positive_finite_price(mc):
    examples = _example_steps()
    assert _step_classes() <= {type(step) for _, step in examples}, (
        "a plan step class without an example here (and maybe without a price in plan_cost)"
    )
    for plan, step in examples:
        price = step_price(step, plan, mc)
        assert math.isfinite(price.seconds) and price.seconds > 0, (type(step).__name__, price)


def test_a_step_without_a_price_is_an_error():
    @dataclasses.dataclass
    class NewStep:
        out: int

    with pytest.raises(TypeError, match="no price for plan step NewStep"):
        step_price(NewStep(0), product_plan(2, 2, 2), MACHINES["cpu"])


def test_the_step_classes_are_the_plan_union_and_the_extra_kinds():
    union = set(plan_mod.Step.__args__)
    assert union <= _step_classes()


# ---------------------------------------------------------------- products by layout and shape


def test_products_are_priced_by_their_own_layout():
    slow_t = from_profile(
        sample_profile(
            matmuls=(
                MatmulPoint(16, 16, 16, 2e-6),
                MatmulPoint(256, 256, 256, 4e-4),
                MatmulPoint(256, 256, 256, 7e-4, True),
            )
        ),
        MACHINES["cpu"],
    )
    assert product_seconds(slow_t, 256, 256, 256, True) > product_seconds(slow_t, 256, 256, 256)
    assert product_seconds(slow_t, 256, 256, 256) == pytest.approx(4e-4, rel=1e-3)  # its own point
    # a batch of 8 small products in one call costs less than 8 calls
    one = product_seconds(slow_t, 16, 16, 16)
    assert one < product_seconds(slow_t, 16, 16, 16, batch=8) < 8 * one


def test_a_product_timed_on_a_busy_machine_does_not_price_its_neighbours():
    busy = from_profile(
        sample_profile(
            matmuls=(
                MatmulPoint(16, 16, 16, 2e-6),
                MatmulPoint(128, 128, 128, 0.5),
                MatmulPoint(256, 256, 256, 4e-4),
            )
        ),
        MACHINES["cpu"],
    )
    # a product smaller than a measured one is at most as slow as it (not 0.5 s)
    assert product_seconds(busy, 128, 128, 128) <= 4e-4 * (1 + 1e-9)


def test_an_outer_product_keeps_its_own_measured_time():
    # numpy runs k = 1 without BLAS: slower than a 10x larger product, and priced so
    mc = from_profile(
        sample_profile(
            matmuls=(
                MatmulPoint(16, 16, 16, 2e-6),
                MatmulPoint(256, 1, 256, 1e-4),
                MatmulPoint(256, 10, 256, 2.5e-5),
            )
        ),
        MACHINES["cpu"],
    )
    assert product_seconds(mc, 256, 1, 256) == pytest.approx(1e-4, rel=1e-2)


def test_step_grids_are_non_decreasing_in_size():
    mc = from_profile(
        calibrated_profile(steps={"copy": ((1e3, 5e-3), (1e5, 1e-5), (1e7, 1e-3))}), MACHINES["cpu"]
    )
    assert mc.step_grids["copy"] == ((1e3, 1e-5), (1e5, 1e-5), (1e7, 1e-3))


# ---------------------------------------------------------------- the profile's new fields


def test_profile_with_step_timings_round_trips():
    p = calibrated_profile()
    q = Profile.from_json(p.to_json())
    assert q == p and not q.stale and q.steps["conv2d"] == GRID


def test_corrupt_step_timings_fall_back_to_the_defaults_with_a_warning(cache_dir):
    data = json.loads(calibrated_profile().to_json())
    data["steps"]["map"] = [[1e3, -1.0]]
    profile_path("cpu").parent.mkdir(parents=True)
    profile_path("cpu").write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="ignoring the machine profile"):
        assert load_profile("cpu") is None
    assert machine("cpu") is MACHINES["cpu"]


def test_an_old_profile_loads_as_stale_with_a_warning(cache_dir):
    data = json.loads(sample_profile().to_json())
    for key in ("steps", "program_call", "step_call"):
        data.pop(key)
    data["version"] = 1
    profile_path("cpu").parent.mkdir(parents=True)
    profile_path("cpu").write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="stale"):
        p = load_profile("cpu")
    assert p is not None and p.stale
    mc = machine("cpu")
    assert mc.bandwidth == 20e9 and mc.step_grids == {}
    prediction = predict_plan(map_plan(1 << 16), mc)  # priced by the profile's rates
    assert prediction.seconds > 0 and prediction.priced_by == f"measured profile {mc.profile}"


# ---------------------------------------------------------------- calibration through the executor


def test_calibration_times_every_kind_the_prediction_prices():
    call, step = measure_steps.call_overheads()
    assert call > 0 and step >= 0
    grids = step_grids(
        MACHINES["cpu"], step, sizes=(1 << 10, 1 << 12), window_sizes=((2, 2, 6, 4),)
    )
    assert set(grids) == set(STEP_KINDS)
    for kind, grid in grids.items():
        assert len(grid) >= 1 and all(b > 0 and t > 0 and math.isfinite(t) for b, t in grid), kind
    profile = calibrated_profile(steps=grids, program_call=call, step_call=step)
    assert Profile.from_json(profile.to_json()) == profile


def test_the_calibration_plans_compute_what_numpy_computes():
    from dlvm_eq.codegen import program

    plan, args, _ = KINDS["copy_strided"](1 << 10)
    np.testing.assert_array_equal(program(plan)(*args), args[0].T)
    plan, args, _ = KINDS["copy"](1 << 10)
    np.testing.assert_array_equal(program(plan)(*args), args[0])
    plan, args, _ = KINDS["concat"](1 << 10)
    np.testing.assert_array_equal(program(plan)(*args), np.concatenate(args, axis=1))
    plan, args, _ = KINDS["reduce_lead"](1 << 10)
    np.testing.assert_allclose(program(plan)(*args), args[0].sum(axis=0))


# ---------------------------------------------------------------- the compile report and --measure


def test_compile_report_prints_the_predicted_time():
    import dlvm_eq as dq
    from dlvm_eq.ir.parser import parse

    module = parse(
        'module "m"\nfunc @f: (<64 x 32 x f32>, <32 x 16 x f32>) -> <64 x 16 x f32> {\n'
        "'entry(%x: <64 x 32 x f32>, %w: <32 x 16 x f32>):\n"
        "  %y = dot %x: <64 x 32 x f32>, %w: <32 x 16 x f32>\n"
        "  %z = tanh %y: <64 x 16 x f32>\n  return %z: <64 x 16 x f32>\n}\n"
    )
    f = dq.compile(module, "f", optimize=False)
    text = str(f.report)
    assert "predicted time per call: " in text and "measured" not in text
    from dlvm_eq.pipeline.measure_time import measure_compiled

    m = measure_compiled(f, repeats=3)
    assert m.median > 0 and len(m.steps) == len(f.plan.steps)
    assert "measured median" in str(f.report)


def test_measure_on_the_command_line_prints_both_times(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DLVM_EQ_CACHE_DIR": str(tmp_path)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlvm_eq.cli",
            "compile",
            str(ROOT / "examples" / "mlp.dl"),
            "-f",
            "mlp",
            "--measure",
            "--repeats",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    line = next(l for l in out.stdout.splitlines() if "predicted time per call" in l)
    assert "shipped defaults" in line and "measured median" in line
    steps = out.stdout.split("  steps:\n", 1)[1].splitlines()
    assert len(steps) == 4 and all("predicted" in s and "measured" in s for s in steps)


def test_measure_refuses_zero_repeats(tmp_path):
    from dlvm_eq.cli import main

    rc = main(
        ["compile", str(ROOT / "examples" / "mlp.dl"), "-f", "mlp", "--measure", "--repeats", "0"]
    )
    assert rc == 1


def test_the_prediction_splits_a_kernel_over_threads_where_the_executor_does():
    """A kernel is priced as split over the pool exactly when the executor splits it (a map
    from two minimum works, a row kernel by its chunks, a reduction from one): around each
    threshold, plan_cost's thread count against the compiled kernel's own decision."""
    from dlvm_eq.calibration.plan_cost import _parallel
    from dlvm_eq.codegen import KernelInput, KernelSpec, Load, ReduceSpec, RowSpec, compile_cpu
    from dlvm_eq.codegen.runtime.row_kernel import compile_rows
    from dlvm_eq.codegen.runtime.threads import MIN_PARALLEL_WORK as W

    mc = MACHINES["cpu"]
    for n in (W - 64, W, 2 * W - 64, 2 * W):
        k = compile_cpu(KernelSpec(f"split_map_{n}", (n,), [KernelInput("f32")], [Load(0) + 1.0]))
        assert (_parallel(mc, "map", n) > 1) == (k.one_call_head() is None and k.threads > 1), n
        r = compile_cpu(
            ReduceSpec(f"split_sum_{n}", (n // 64, 64), [KernelInput("f32")], Load(0), "add", (1,))
        )
        assert (_parallel(mc, "reduce", n) > 1) == (r.one_call_head() is None and r.threads > 1), n
        rows = n // 256
        x = Load(0)
        spec = RowSpec(
            f"split_rows_{n}", rows, 256, [KernelInput("f32")], [(x, "max", None)], [x - Load(1)]
        )
        rk = compile_rows(spec)
        assert (_parallel(mc, "rows", rows * 256 * 2) > 1) == (
            rk.one_call_head() is None and rk.threads > 1
        ), n
