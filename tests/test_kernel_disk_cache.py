"""The CPU kernels' disk cache across processes: a second process loads the kernel the first
compiled, and a corrupted entry is rebuilt, then loaded again (split from test_codegen_kernels.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json, numpy as np
    from dlvm_eq.codegen import KernelSpec, KernelInput, Load, unary, compile_cpu, stats
    x = np.linspace(-2, 2, 100, dtype=np.float32)
    k = compile_cpu(KernelSpec("c", (100,), [KernelInput("f32")], [unary("tanh", Load(0)) * 3.0]))
    assert np.allclose(k(x), 3 * np.tanh(x.astype(np.float64)), rtol=1e-6)
    print(json.dumps(stats()))
""")


def _child_stats(cache_dir) -> dict:
    env = dict(os.environ, DLVM_EQ_CACHE_DIR=str(cache_dir))
    r = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_second_process_loads_from_disk_and_corrupt_entry_is_rebuilt(tmp_path):
    first = _child_stats(tmp_path)
    assert (first["compiled"], first["loaded_from_disk"]) == (1, 0)
    second = _child_stats(tmp_path)
    assert (second["compiled"], second["loaded_from_disk"]) == (0, 1)
    (entry,) = list((tmp_path / "cpu").rglob("*.bin"))
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    third = _child_stats(tmp_path)
    assert (third["compiled"], third["corrupt"]) == (1, 1)
    fourth = _child_stats(tmp_path)
    assert (fourth["compiled"], fourth["loaded_from_disk"], fourth["corrupt"]) == (0, 1, 0)
