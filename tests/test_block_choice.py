"""Which blocking calibration keeps (calibration/block_choice.py, issue 36): relative times per
shape, the shipped blocking (first) unless another is MARGIN faster. Oracle: a brute-force
reading of the rule on random timings, and the properties it must have."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from dlvm_eq.calibration import measure
from dlvm_eq.calibration.block_choice import MARGIN, fastest_blocks, relative_score

TIMES = st.integers(1, 5).flatmap(
    lambda shapes: st.lists(
        st.lists(st.floats(1e-4, 1.0), min_size=shapes, max_size=shapes), min_size=1, max_size=6
    )
)


def _geomean(xs):
    return math.prod(xs) ** (1 / len(xs))


@given(TIMES)
def test_the_choice_is_the_best_relative_time_beyond_the_margin(seconds):
    shapes = len(seconds[0])
    rel = [
        _geomean([row[s] / min(r[s] for r in seconds) for s in range(shapes)]) for row in seconds
    ]
    got = fastest_blocks(seconds)
    assert all(abs(a - b) <= 1e-9 * b for a, b in zip(relative_score(seconds), rel))
    if got != 0:
        assert rel[got] < MARGIN * rel[0] * (1 + 1e-12)
        assert rel[got] <= min(rel) * (1 + 1e-12)
    else:
        assert min(rel) >= MARGIN * rel[0] * (1 - 1e-12)


@given(TIMES, st.floats(1e-3, 1e3))
def test_scaling_one_shape_changes_nothing(seconds, factor):
    """A big shape weighs what a small one does: its times scaled, the choice stays."""
    scaled = [[row[0] * factor] + row[1:] for row in seconds]
    assert fastest_blocks(scaled) == fastest_blocks(seconds)


def test_a_large_shapes_noise_does_not_outvote_a_small_shapes_loss():
    # candidate 1 is 2x slower on the small shape and 2% faster (noise) on the large one:
    # by summed seconds it would win (1.0 + 4 + ... ), by relative time the shipped one stays
    seconds = [[0.002, 0.100], [0.004, 0.097]]
    assert sum(seconds[1]) < sum(seconds[0])
    assert fastest_blocks(seconds) == 0


def test_gemm_calibration_puts_the_hosts_shipped_blocks_first(monkeypatch):
    from dlvm_eq.codegen.runtime.gemm_runtime import HOST_WIDE

    seen = []

    def timed(fn, repeats, cap_s):
        seen.append(fn.__defaults__[0].spec.kc)
        return 1.0  # all equal: the shipped blocks stay

    monkeypatch.setattr(measure, "fastest_seconds", timed)
    got = measure.gemm_blocks(sizes=((16, 16, 16),))
    assert got == {"kc": HOST_WIDE["kc"], "mc": HOST_WIDE["mc"]}
    assert seen[0] == HOST_WIDE["kc"]


def test_the_shipped_blocks_stay_unless_another_is_beyond_the_margin():
    assert fastest_blocks([[1.0, 1.0], [0.99, 0.98]]) == 0  # 1.5% faster: noise
    assert fastest_blocks([[1.0, 1.0], [0.95, 0.94]]) == 1  # 5.5% faster: kept
    assert fastest_blocks([[1.0, 1.0], [0.95, 0.94], [0.90, 1.02]]) == 1  # the best of those
