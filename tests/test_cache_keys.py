"""Every cache entry records the kind and key it was stored under, inside its checksum: an
entry copied over another's (a valid file at the wrong place) is a miss, counted, and rebuilt;
the program computes the right values."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from dlvm_eq.cache import DiskCache

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import dlvm_eq as dq
    from dlvm_eq.cache import shared_cache
    from dlvm_eq.codegen import stats
    from dlvm_eq.ir import function_cache as ir_cache
    which = sys.argv[1]
    def f(w, x):
        return dq.sum(dq.tanh(x @ w) * 3.0)
    def g(w, x):
        return dq.sum(dq.exp(x @ w) - 1.0)
    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    x = np.linspace(0, 2, 20, dtype=np.float32).reshape(5, 4)
    value, grad = dq.jit(dq.value_and_grad({"f": f, "g": g}[which]))(w, x)
    print(json.dumps({"value": float(value), "grad": np.asarray(grad).tolist(),
                      "ir_hits": ir_cache.stats.hits, "corrupt": shared_cache().corrupt,
                      "loaded": stats()["loaded_from_disk"]}))
""")


def _run(cache_dir, which):
    env = dict(os.environ, DLVM_EQ_CACHE_DIR=str(cache_dir), PYTHONPATH=str(ROOT))
    env.pop("DLVM_EQ_NO_IR_CACHE", None)
    r = subprocess.run(
        [sys.executable, "-c", CHILD, which], env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _expected(which):
    w = np.linspace(-1, 1, 12).reshape(4, 3)
    x = np.linspace(0, 2, 20).reshape(5, 4)
    z = x @ w
    if which == "f":
        return 3 * np.tanh(z).sum(), x.T @ (3 * (1 - np.tanh(z) ** 2))
    return (np.exp(z) - 1).sum(), x.T @ np.exp(z)


def _entries(cache_dir) -> dict[Path, str]:
    return {p: p.parent.parent.name for p in Path(cache_dir).rglob("*.bin")}


def test_an_entry_copied_over_another_functions_is_rebuilt(tmp_path):
    cache_dir = tmp_path / "cache"
    _run(cache_dir, "f")
    of_f = _entries(cache_dir)
    cold = _run(cache_dir, "g")
    of_g = {p: k for p, k in _entries(cache_dir).items() if p not in of_f}
    # (a jitted value_and_grad caches its adjoint, not a second optimized program: issue 32)
    assert {"ir-adjoint", "plan", "cpu"} <= set(of_g.values())
    # every entry g added, overwritten by one of f's of the same kind (valid checksums)
    copied = 0
    for p, kind in of_g.items():
        src = next((q for q, k in of_f.items() if k == kind), None)
        if src is not None:
            shutil.copyfile(src, p)
            copied += 1
    assert copied >= 3
    moved = _run(cache_dir, "g")
    value, grad = _expected("g")
    assert np.isclose(moved["value"], value, rtol=1e-5)
    assert np.allclose(moved["grad"], grad, rtol=1e-4, atol=1e-5)
    assert moved["corrupt"] >= copied  # each copied entry refused and counted
    assert moved["value"] == cold["value"] and moved["grad"] == cold["grad"]
    healed = _run(cache_dir, "g")  # rebuilt entries were written back under their own keys
    assert healed["corrupt"] == 0 and healed["ir_hits"] >= 1 and healed["loaded"] >= 1
    assert healed["value"] == cold["value"]


def test_an_entry_is_read_only_under_its_own_kind_and_key(tmp_path):
    cache = DiskCache(tmp_path / "c")
    a, b = "ab" * 32, "cd" * 32
    cache.put("plan", a, b"plan of a")
    cache.put("cpu", a, b"object of a")
    os.makedirs(cache.path("plan", b).parent)
    shutil.copyfile(cache.path("plan", a), cache.path("plan", b))
    assert cache.get("plan", b) is None and cache.corrupt == 1
    shutil.copyfile(cache.path("cpu", a), cache.path("plan", a))  # same key, another kind
    assert cache.get("plan", a) is None and cache.corrupt == 2
    assert cache.get("cpu", a) == b"object of a" and cache.corrupt == 2
