"""The persistent IR cache: a second process reads adjoints back instead of saturating again,
and a corrupt entry is rebuilt."""

import os
import subprocess
import sys

PROGRAM = r"""
import numpy as np, dlvm_eq as dq
from dlvm_eq.ir import function_cache as ir_cache
def f(w, x):
    return dq.sum(dq.tanh(x @ w) ** 2)
w = np.linspace(-1, 1, 12).reshape(4, 3)
x = np.linspace(0, 2, 20).reshape(5, 4)
g = dq.grad(f)(w, x)
t = np.tanh(x @ w)
expected = x.T @ (2 * t * (1 - t ** 2))
assert np.allclose(g, expected, rtol=1e-10), (g, expected)
print(ir_cache.stats.hits, ir_cache.stats.misses)
"""


def _run(cache_dir):
    env = dict(os.environ, DLVM_EQ_CACHE_DIR=str(cache_dir))
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    hits, misses = map(int, out.stdout.split())
    return hits, misses


def test_second_process_reads_the_adjoint_from_disk(tmp_path):
    # one result per process: the synthesized adjoint, saturated with the whole schedule, so the
    # program jit compiles skips the module's second pass (issue 32) and caches nothing more
    assert _run(tmp_path) == (0, 1)
    assert _run(tmp_path) == (1, 0)


def test_corrupt_entry_is_rebuilt(tmp_path):
    _run(tmp_path)
    entries = list((tmp_path / "ir-adjoint").rglob("*.bin"))
    assert len(entries) == 1
    data = bytearray(entries[0].read_bytes())
    data[-5] ^= 0xFF
    entries[0].write_bytes(bytes(data))
    assert _run(tmp_path) == (0, 1)  # checksum mismatch: a miss, rebuilt and rewritten
    assert _run(tmp_path) == (1, 0)


def test_a_calibrated_profile_has_entries_of_its_own(tmp_path):
    """Optimizing the adjoint prices e-nodes with this host's profile:
    after `dlvm-eq calibrate` the entry made with the shipped defaults is not read back."""
    from test_calibration import sample_profile

    assert _run(tmp_path) == (0, 1)
    profiles = tmp_path / "profiles"
    profiles.mkdir(mode=0o700)
    (profiles / "cpu.json").write_text(sample_profile().to_json())
    assert _run(tmp_path) == (0, 1)
    assert _run(tmp_path) == (1, 0)
