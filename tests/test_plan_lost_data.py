"""Data the caches lost between a buffer's touches (calibration/reuse.py, program_state.py and
plan_cost's lost-data price): the reuse distances against a brute-force count, the price's
rules on plans whose answer is certain, the measured curves' shape, and the profile fields."""

from __future__ import annotations

import json
import math
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_calibration import cache_dir, sample_profile  # noqa: F401 - the fixture is used by name
from test_plan_prediction import calibrated_profile

from dlvm_eq.calibration.measure_steps import tiny_plan
from dlvm_eq.calibration.plan_cost import lost_fraction, predict_plan
from dlvm_eq.calibration.reuse import distances, reuse, step_touches
from dlvm_eq.codegen import KernelInput, KernelSpec, Load
from dlvm_eq.codegen.planning.plan import KernelStep
from dlvm_eq.extract.machine import MACHINES, from_profile
from dlvm_eq.extract.profile import CacheCurve, Profile, ProfileError

MIB = 1 << 20
BY_BYTES = ((0.0, 0.0), (8 * MIB, 0.0), (32 * MIB, 1.0))
BY_SECONDS = ((0.0, 0.0), (1e-3, 0.0), (8e-3, 1.0))
MISS = 1e-10  # seconds per lost byte


def curve(probe_bytes=1 << 20, by_bytes=BY_BYTES, by_seconds=BY_SECONDS, miss=MISS):
    return CacheCurve(float(probe_bytes), miss, by_bytes, by_seconds)


def lossy_machine(*curves):
    return from_profile(calibrated_profile(cache=curves or (curve(),)), MACHINES["cpu"])


# ---------------------------------------------------------------- reuse distances


def brute_force(touches, seconds):
    """The same quantities by their definitions, quadratic: the steps twice, the second reported."""
    flat = [(call, i, k, b) for call in range(2) for i, t in enumerate(touches) for k, b in t]
    starts, clock = [], 0.0
    for _ in range(2):
        for s in seconds:
            starts.append(clock)
            clock += s
    out = [[] for _ in touches]
    for e, (call, i, k, b) in enumerate(flat):
        if call != 1:
            continue
        prev = (
            max(j for j in range(e) if flat[j][2] == k)
            if any(f[2] == k for f in flat[:e])
            else None
        )
        latest = {}
        for j in range(prev + 1, e):
            latest[flat[j][2]] = flat[j][3]
        latest.pop(k, None)
        pc, pi = flat[prev][0], flat[prev][1]
        ended = starts[pc * len(touches) + pi] + seconds[pi]
        out[i].append((b, sum(latest.values()), max(0.0, starts[len(touches) + i] - ended)))
    return out


step_lists = st.lists(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 1000)), max_size=4, unique_by=lambda t: t[0]
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(step_lists, st.data())
def test_reuse_distances_match_their_definition(touches, data):
    seconds = data.draw(st.lists(st.floats(0, 1e-3), min_size=len(touches), max_size=len(touches)))
    got, want = distances(touches, seconds), brute_force(touches, seconds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for (gb, gd, gs), (wb, wd, ws) in zip(g, w):
            assert (gb, gd) == (wb, wd) and gs == pytest.approx(ws, abs=1e-12)


def chain_plan(n: int, steps: int):
    """x -> t1 -> t2 ... -> out: each map reads the last one's result."""
    slots = [((n,), "f32")]
    kernel_steps, src = [], 0
    temps = [((n,), "f32") for _ in range(steps - 1)]
    for i in range(steps):
        spec = KernelSpec(f"chain_{n}_{i}", (n,), [KernelInput("f32")], [Load(0) + 1.0])
        dst = 1 if i == steps - 1 else 2 + i
        kernel_steps.append(KernelStep(spec, (src,), (dst,)))
        src = dst
    return tiny_plan(f"chain_{n}_{steps}", slots, [((n,), "f32")], kernel_steps, temps=temps)


def test_a_buffer_read_right_after_it_is_written_has_nothing_in_between():
    plan = chain_plan(1 << 10, 3)
    touches = reuse(plan, [1e-6] * len(plan.steps))
    # step 1 reads what step 0 wrote: no other buffer, no time in between
    read = dict(zip((k for k, _ in step_touches(plan)[1]), touches[1]))
    first_input = step_touches(plan)[1][0][0]
    assert read[first_input][1:] == (0, 0.0)


def test_a_long_plan_is_measured_without_recursion():
    plan = chain_plan(8, 5000)
    assert len(reuse(plan, [1e-6] * 5000)) == 5000


# ---------------------------------------------------------------- the price


def test_the_shipped_defaults_and_older_profiles_lose_nothing():
    plan = chain_plan(1 << 22, 12)
    for mc in (MACHINES["cpu"], from_profile(calibrated_profile(), MACHINES["cpu"])):
        assert all(s.lost == 0.0 for s in predict_plan(plan, mc).steps)


def test_a_chain_in_cache_loses_nothing_and_one_beyond_it_pays_per_byte():
    mc = lossy_machine()
    small = predict_plan(chain_plan(1 << 10, 4), mc)  # 4 KiB buffers: all in cache
    assert all(s.lost == 0.0 for s in small.steps)
    big = predict_plan(chain_plan(1 << 23, 4), mc)  # 32 MiB buffers
    # each later step reads what the last wrote (nothing in between) and writes a buffer last
    # touched a call ago (3 x 32 MiB and more in between: all lost); the first reads x, last
    # touched a call ago too
    assert big.steps[0].lost == pytest.approx(2 * 32 * MIB * MISS, rel=1e-6)
    for s in big.steps[1:]:
        assert s.lost == pytest.approx(32 * MIB * MISS, rel=1e-6)
        assert s.seconds > s.lost


def test_the_lost_share_follows_the_measured_curves():
    assert lost_fraction(BY_BYTES, 4 * MIB) == 0.0
    assert lost_fraction(BY_BYTES, 20 * MIB) == pytest.approx(0.5)
    assert lost_fraction(BY_BYTES, math.inf) == 1.0
    assert lost_fraction(BY_SECONDS, 4.5e-3) == pytest.approx(0.5)
    assert lost_fraction((), 1.0) == 0.0


def test_time_alone_loses_data():
    # a buffer reused with little in between but long after: lost by the seconds curve
    mc = lossy_machine(curve(by_bytes=((0.0, 0.0), (1e12, 0.0))))
    plan = chain_plan(1 << 16, 3)
    quick = predict_plan(plan, mc)
    slow_mc = lossy_machine(
        curve(by_bytes=((0.0, 0.0), (1e12, 0.0)), by_seconds=((0.0, 0.0), (1e-9, 1.0)))
    )
    slow = predict_plan(plan, slow_mc)
    assert sum(s.lost for s in slow.steps) > sum(s.lost for s in quick.steps)


# ---------------------------------------------------------------- measurement and profile


def test_each_buffer_is_priced_on_the_curve_of_the_probe_nearest_its_size():
    # a small buffer's curve loses everything at once, a large one's nothing
    small = curve(
        256 << 10, by_bytes=((0.0, 0.0), (1.0, 1.0)), by_seconds=((0.0, 0.0), (1e-9, 1.0))
    )
    large = curve(1 << 20, by_bytes=((0.0, 0.0), (1e12, 0.0)), by_seconds=((0.0, 0.0), (1e3, 0.0)))
    mc = lossy_machine(small, large)
    assert sum(s.lost for s in predict_plan(chain_plan(1 << 16, 3), mc).steps) > 0  # 256 KiB
    assert sum(s.lost for s in predict_plan(chain_plan(1 << 20, 3), mc).steps) == 0.0  # 4 MiB


def test_the_measured_curves_start_in_cache_and_never_fall():
    from dlvm_eq.calibration.program_state import PROBE_SIZES, cache_timings

    curves = cache_timings()
    assert [c.probe_bytes for c in curves] == list(PROBE_SIZES)
    for c in curves:
        assert c.miss_seconds >= 0.0
        for points in (c.by_bytes, c.by_seconds):
            assert points[0] == (0.0, 0.0)
            assert all(0.0 <= f <= 1.0 for _, f in points)
            assert all(b[0] > a[0] and b[1] >= a[1] for a, b in zip(points, points[1:]))


def test_the_cache_timings_round_trip_in_the_profile():
    p = sample_profile(cache=(curve(256 << 10), curve()))
    q = Profile.from_json(p.to_json())
    assert q == p and q.cache[1].by_bytes == BY_BYTES


@pytest.mark.parametrize(
    "points", [[[0, 0], [1, 1.5]], [[0, 0], [0, 0.5]], [[2, 0.1], [1, 0.2]], [[0, -0.1]]]
)
def test_a_malformed_cache_curve_is_refused(points):
    data = json.loads(sample_profile(cache=(curve(),)).to_json())
    data["cache"][0]["by_bytes"] = points
    with pytest.raises(ProfileError):
        Profile.from_json(json.dumps(data))


def test_a_version_3_profile_warns_that_it_lacks_the_cache_timings(cache_dir):
    from dlvm_eq.extract.profile import load_profile, profile_path

    data = json.loads(calibrated_profile().to_json())
    data["version"] = 3
    data.pop("cache")
    profile_path("cpu").parent.mkdir(parents=True)
    profile_path("cpu").write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="version 3.*without the cache timings"):
        p = load_profile("cpu")
    assert p is not None and p.outdated and p.cache == ()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert (
            predict_plan(chain_plan(1 << 10, 2), from_profile(p, MACHINES["cpu"])).steps[0].lost
            == 0.0
        )


def test_a_noisy_low_point_is_averaged_with_its_neighbours_not_carried_on():
    from dlvm_eq.calibration.program_state import _monotone

    fitted = _monotone([(1, 0.3), (2, 0.0), (3, 0.0), (4, 0.9)])
    assert fitted == ((0.0, 0.0), (1.0, 0.1), (2.0, 0.1), (3.0, 0.1), (4.0, 0.9))
    assert _monotone([(1, 0.0), (2, 0.5), (3, 0.2), (4, 1.0)])[1:] == (
        (1.0, 0.0),
        (2.0, 0.35),
        (3.0, 0.35),
        (4.0, 1.0),
    )


def test_every_kind_of_step_is_priced_with_its_lost_data():
    # windows, gathers and their scatter-add adjoint, cumsum, concatenation, products
    import numpy as np

    import dlvm_eq as dq
    from dlvm_eq.pipeline import plan_function

    rng = np.random.default_rng(0)

    def loss(x, w, e, ids):
        p = dq.max_pool2d(dq.relu(dq.conv2d(x, w, padding=1)), 2)
        z = dq.concatenate([dq.reshape(p, (2, -1)), dq.take(e, ids, axis=0)], axis=1)
        return dq.sum(dq.cumsum(z, axis=1) * ((z @ dq.transpose(z)) @ z))

    args = (
        rng.standard_normal((2, 3, 8, 8)).astype(np.float32),
        rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        rng.standard_normal((10, 5)).astype(np.float32),
        np.array([1, 7], np.int32),
    )
    ir = dq.make_ir(dq.value_and_grad(loss, argnums=(0, 1, 2)))(*args)
    name = next(iter(ir.functions))
    plan = plan_function(ir[name], ir)
    kinds = {type(s).__name__ for s in plan.steps}
    assert {"WindowStep", "IndexStep", "KernelStep", "BlasStep"} <= kinds, kinds
    # everything touched is lost the moment any time passes
    mc = lossy_machine(curve(by_seconds=((0.0, 0.0), (1e-12, 1.0))))
    prediction = predict_plan(plan, mc)
    touched = [sum(b for _, b in t) for t in step_touches(plan)]
    assert len(prediction.steps) == len(plan.steps) and sum(s.lost for s in prediction.steps) > 0
    for price, nbytes in zip(prediction.steps, touched):
        assert 0.0 <= price.lost <= nbytes * MISS * (1 + 1e-9)
