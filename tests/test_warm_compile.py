"""Warm-cache compiles: `import dlvm_eq` loads no heavy dependency, and a second process that
compiles the same program finds the optimized program, the adjoint, the kernel plan and every
kernel on disk, so that it builds no e-graph, plans nothing and generates no LLVM IR. Every
cache level rebuilds an entry it cannot read, and keys change with what the result depends on."""

import json
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

HEAVY = ("egglog", "scipy", "lark", "llvmlite", "sympy")
# what a warm compile of a straight program without convolutions or gathers needs none of:
# the LLVM IR builders (a kernel loaded from disk: codegen/runtime/jit.py), the loop pipeline,
# the never-slower guard (it runs with the e-graph), the convolution and index-step runtimes,
# and LLVM itself (kernels load without it: codegen/runtime/object_loader.py)
IR_BUILDERS = (
    "llvmlite.binding",
    "dlvm_eq.codegen.cpu.llvm_cpu",
    "dlvm_eq.codegen.llvm.emitter",
    "dlvm_eq.pipeline.loops",
    "dlvm_eq.pipeline.never_slower",
    "dlvm_eq.codegen.runtime.conv_cpu",
    "dlvm_eq.codegen.execution.index_steps",
    # and the step runs and programs of other plans: the GPU program, windows, gathers
    "dlvm_eq.codegen.execution.gpu_program",
    "dlvm_eq.codegen.execution.window_steps",
    "dlvm_eq.codegen.execution.gather_steps",
    # nor the step classes of plans it does not hold (plan_records reads them lazily)
    "dlvm_eq.codegen.planning.gather",
    "dlvm_eq.codegen.planning.scan",
    # kernels from disk need no thread pool executor (runtime/kernel_memo.build_all)
    "concurrent.futures",
    # nor the planner and its values (a plan's attention step class needs neither), nor the
    # rule-error types and their s-expression reader (native.py imports them on an error)
    "dlvm_eq.codegen.planning.planner",
    "dlvm_eq.codegen.planning.values",
    "dlvm_eq.egraph.rule_origin",
    "dlvm_eq.sexpr",
)

CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import dlvm_eq as dq
    IR_BUILDERS = {builders!r}
    at_import = sorted(m for m in {heavy!r} if m in sys.modules)
    from dlvm_eq.models import mlp
    params = mlp.init_params([12, 6, 4], seed=1)
    rng = np.random.default_rng(0)
    x = rng.random((8, 12), dtype=np.float32)
    onehot = np.eye(4, dtype=np.float32)[rng.integers(0, 4, 8)]
    step = dq.jit(dq.value_and_grad(mlp.loss, argnums=(0, 1, 2, 3)))
    value, grads = step(*params, x, onehot)
    after = sorted(m for m in ("egglog", "scipy", "lark", "sympy") + IR_BUILDERS if m in sys.modules)
    ref_value, ref_grads = mlp.numpy_value_and_grad(*params, x, onehot)
    assert np.allclose(value, ref_value, rtol=1e-4), (value, ref_value)
    for g, r in zip(grads, ref_grads):
        assert np.allclose(g, r, rtol=1e-3, atol=1e-5)
    from dlvm_eq.ir import function_cache as ir_cache
    from dlvm_eq.cache import shared_cache
    from dlvm_eq.codegen import stats
    from dlvm_eq.pipeline import planning as backend
    from dlvm_eq.digests import digest_stats
    import dataclasses
    # a dataclass without a docstring costs an inspect.signature when it is created (3.11)
    undocumented = sorted(
        f"{{m}}.{{c.__qualname__}}" for m, mod in list(sys.modules.items())
        if m.startswith("dlvm_eq") for c in vars(mod).values()
        if isinstance(c, type) and c.__module__ == m and dataclasses.is_dataclass(c)
        and (c.__doc__ or "").startswith(c.__name__ + "(")
    )
    print(json.dumps({{"digests": digest_stats, "at_import": at_import, "after_call": after,
                      "ir": [ir_cache.stats.hits, ir_cache.stats.misses],
                      "plan": [backend.plan_cache_stats["hits"], backend.plan_cache_stats["misses"]],
                      "kernels": stats(), "n_kernels": len(step.report(*params, x, onehot).plan.kernels),
                      "corrupt": shared_cache().corrupt, "undocumented": undocumented,
                      "value": float(value), "grads": [float(np.abs(g).sum()) for g in grads]}}))
""").format(heavy=HEAVY, builders=IR_BUILDERS)


def _run(cache_dir) -> dict:
    env = dict(os.environ, DLVM_EQ_CACHE_DIR=str(cache_dir))
    env.pop("DLVM_EQ_NO_IR_CACHE", None)
    r = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _entries(cache_dir, kind):
    return sorted((cache_dir / kind).rglob("*.bin"))


def test_import_loads_no_heavy_dependency():
    # nor tempfile (and with it shutil, random, bz2, lzma): the disk cache imports it to write
    light = HEAVY + ("tempfile", "shutil", "dlvm_eq.pipeline.native", "dlvm_eq.codegen.planning")
    code = f"import sys, dlvm_eq; print(sorted(m for m in {light!r} if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_a_warm_process_builds_nothing(tmp_path):
    cold = _run(tmp_path)
    assert cold["at_import"] == []
    # the adjoint only: its e-graph saturated the algebra, the module's pass is skipped (issue 32)
    assert cold["ir"] == [0, 1] and cold["plan"] == [0, 1]
    # kernels of equal LLVM IR under two names are compiled once; besides the plan's kernels:
    # the GEMM for each micro-tile shape used (two at most) and the native worker pool
    assert 1 <= cold["kernels"]["compiled"] <= cold["n_kernels"] + 3
    warm = _run(tmp_path)
    # no egglog, scipy, lark, sympy, and no LLVM IR builder
    assert warm["at_import"] == [] and warm["after_call"] == []
    assert warm["undocumented"] == []
    assert warm["ir"] == [1, 0] and warm["plan"] == [1, 0]
    assert warm["kernels"]["compiled"] == 0
    # the source and rule files' digests (in every key) from their stat signatures: no read
    assert cold["digests"]["read"] >= 2
    assert warm["digests"] == {"stat": 2, "read": 0}
    # every kernel from disk, and the GEMMs and worker pool it used (at most 3 objects)
    assert warm["n_kernels"] <= warm["kernels"]["loaded_from_disk"] <= warm["n_kernels"] + 3
    assert warm["corrupt"] == 0
    assert warm["value"] == pytest.approx(cold["value"], rel=1e-6)
    assert warm["grads"] == pytest.approx(cold["grads"], rel=1e-5)


def _overwrite(cache_dir, kind, payload: bytes) -> int:
    """Replace every entry of `kind` with `payload` under a valid checksum (a readable file
    whose content is not what the cache level expects)."""
    from dlvm_eq.cache import DiskCache

    cache = DiskCache(cache_dir)
    entries = _entries(cache_dir, kind)
    for p in entries:
        cache.put(kind, p.stem, payload)
    return len(entries)


def test_unreadable_entries_of_every_level_are_rebuilt(tmp_path):
    cold = _run(tmp_path)
    assert _overwrite(tmp_path, "plan", b"not JSON") == 1
    assert _overwrite(tmp_path, "ir-adjoint", pickle.dumps(["not", "a", "function"])) == 1
    n_kernels = _overwrite(tmp_path, "cpu", b"no symbol here")
    assert n_kernels >= cold["n_kernels"]  # the kernels, the GEMMs and the worker pool
    broken = _run(tmp_path)
    assert broken["plan"] == [0, 1]
    assert broken["ir"] == [0, 1]  # the adjoint rebuilt
    assert broken["kernels"]["compiled"] == cold["kernels"]["compiled"]
    assert broken["corrupt"] == 2 + n_kernels
    assert broken["value"] == pytest.approx(cold["value"], rel=1e-6)
    healed = _run(tmp_path)
    assert healed["plan"] == [1, 0] and healed["ir"] == [1, 0]
    assert healed["kernels"]["compiled"] == 0 and healed["corrupt"] == 0


def test_a_damaged_plan_file_is_a_miss(tmp_path):
    _run(tmp_path)
    (entry,) = _entries(tmp_path, "plan")
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    damaged = _run(tmp_path)
    assert damaged["plan"] == [0, 1] and damaged["corrupt"] == 1
    assert _run(tmp_path)["plan"] == [1, 0]


# ------------------------------------------------------------------ keys, in process


def test_spec_text_tells_constants_apart_and_stays_linear():
    from dlvm_eq.codegen import KernelInput, KernelSpec, Load, unary
    from dlvm_eq.codegen.kernels.spec_text import spec_text

    def spec(c):
        return KernelSpec("k", (4,), [KernelInput("f32")], [Load(0) * c])

    texts = {spec_text(spec(c)) for c in (2.0, 2.5, 2.0000001)}
    assert len(texts) == 3  # floats written exactly
    assert spec_text(spec(2)) == spec_text(spec(2.0))  # equal specs (2 is typed as f32 here)
    e = Load(0)
    for _ in range(60):  # a DAG of 60 levels: 2**60 nodes as a tree
        e = unary("tanh", e) + unary("tanh", e) * 0.5
    assert len(spec_text(KernelSpec("deep", (4,), [KernelInput("f32")], [e]))) < 50_000


def test_kernel_key_covers_the_package_source(tmp_path, monkeypatch):
    from dlvm_eq import cache
    from dlvm_eq.codegen import KernelInput, KernelSpec, Load, unary
    from dlvm_eq.codegen.runtime.cpu_kernel import CpuKernel
    from dlvm_eq.codegen.runtime.jit import stats

    old = cache.shared_cache().root
    cache.set_cache_dir(tmp_path)
    try:
        spec = KernelSpec("src", (16,), [KernelInput("f32")], [unary("cosh", Load(0)) * 1.75])
        before = stats()["compiled"]
        CpuKernel(spec)
        CpuKernel(spec)  # memory hit
        assert stats()["compiled"] == before + 1
        assert len(_entries(tmp_path, "cpu")) == 1
        monkeypatch.setattr(cache, "_SOURCE_DIGEST", "an edited dlvm_eq")
        k = CpuKernel(spec)  # another key: a miss, a new entry
        assert len(_entries(tmp_path, "cpu")) == 2
        x = np.linspace(-1, 1, 16, dtype=np.float32)
        assert np.allclose(k(x), np.cosh(x) * 1.75, rtol=1e-6)
        assert "define" in k.ir.text  # the IR is still there on demand
    finally:
        cache.set_cache_dir(old)


def test_tree_digest_follows_file_contents(tmp_path):
    from dlvm_eq.cache import tree_digest

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "notes.txt").write_text("ignored")
    first = tree_digest(tmp_path / "pkg")
    assert tree_digest(tmp_path / "pkg") == first
    (tmp_path / "pkg" / "notes.txt").write_text("still ignored")
    assert tree_digest(tmp_path / "pkg") == first
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert tree_digest(tmp_path / "pkg") != first


def test_egglog_bindings_load_alone_and_egglog_still_imports():
    code = textwrap.dedent("""
        import sys
        from dlvm_eq.egraph import load_bindings
        load_bindings()
        from dlvm_eq.egraph import EGraphSession
        assert "egglog.bindings" in sys.modules
        assert "egglog" not in sys.modules and "black" not in sys.modules
        import egglog                     # a user's import afterwards: the whole package
        assert egglog.bindings is sys.modules["egglog.bindings"]
        eg = egglog.EGraph()
        x = eg.let("x", egglog.i64(1) + egglog.i64(2))
        eg.run(1)
        print(eg.extract(x))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "i64(3)"


@pytest.mark.parametrize("entry", ["dlvm_eq.egraph.optimize", "dlvm_eq.verify.rules"])
def test_importing_an_egraph_module_first_loads_the_bindings_alone(entry):
    # no load_bindings() by the caller: the modules that use egglog load its bindings alone
    code = textwrap.dedent(f"""
        import sys, importlib
        importlib.import_module({entry!r})
        from dlvm_eq.egraph.optimize import prepare_session
        prepare_session()
        print(sorted(m for m in ("egglog", "black", "click", "graphviz") if m in sys.modules))
        print("egglog.bindings" in sys.modules)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[]", "True"]
