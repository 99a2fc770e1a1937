"""The thread count (codegen/runtime/cpu_count.py): DLVM_EQ_NUM_THREADS, the affinity mask, cgroup v1
and v2 CPU quotas (on fake cgroup trees), and in a subprocess, what the runtime reads."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlvm_eq.codegen.runtime.cpu_count import affinity_cpus, cgroup_cpu_limit, thread_count
from dlvm_eq.errors import DlvmError

ROOT = Path(__file__).resolve().parents[1]


def _tree(tmp_path, proc: str, files: dict[str, str]):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc").write_text(proc)
    root = tmp_path / "cg"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    root.mkdir(exist_ok=True)
    return str(tmp_path / "proc"), str(root)


def test_v2_quota_the_tightest_along_the_path(tmp_path):
    proc, root = _tree(
        tmp_path, "0::/a/b\n", {"a/cpu.max": "250000 100000\n", "a/b/cpu.max": "max 100000\n"}
    )
    assert cgroup_cpu_limit(proc, root) == 2.5
    proc, root = _tree(
        tmp_path / "x", "0::/a/b\n", {"a/cpu.max": "max 100000", "a/b/cpu.max": "150000 100000"}
    )
    assert cgroup_cpu_limit(proc, root) == 1.5
    assert thread_count({}, proc, root) == min(affinity_cpus(), 2)  # rounded up


def test_v2_no_limit_and_missing_files(tmp_path):
    proc, root = _tree(tmp_path, "0::/a\n", {"a/cpu.max": "max 100000\n"})
    assert cgroup_cpu_limit(proc, root) is None
    assert thread_count({}, proc, root) == affinity_cpus()
    assert cgroup_cpu_limit(str(tmp_path / "none"), root) is None
    proc, root = _tree(tmp_path / "y", "garbage\n0::/\n", {"cpu.max": "nonsense"})
    assert cgroup_cpu_limit(proc, root) is None


def test_v2_in_a_cgroup_namespace_and_hybrid_layout(tmp_path):
    """The path in /proc/self/cgroup need not exist under the mount (a container sees its
    own cgroup as /): the mount's own cpu.max counts then. Hybrid v1/v2: v2 under unified/."""
    proc, root = _tree(tmp_path, "0::/not/here\n", {"cpu.max": "50000 100000"})
    assert cgroup_cpu_limit(proc, root) == 0.5
    assert thread_count({}, proc, root) == 1
    proc, root = _tree(
        tmp_path / "h", "1:cpu:/\n0::/s\n", {"unified/s/cpu.max": "300000 100000", "cpu/x": ""}
    )
    assert cgroup_cpu_limit(proc, root) == 3.0


def test_v1_quota(tmp_path):
    proc, root = _tree(
        tmp_path,
        "4:cpu,cpuacct:/docker/c1\n3:memory:/docker/c1\n",
        {
            "cpu,cpuacct/docker/c1/cpu.cfs_quota_us": "50000\n",
            "cpu,cpuacct/docker/c1/cpu.cfs_period_us": "100000\n",
            "cpu,cpuacct/docker/cpu.cfs_quota_us": "-1\n",
            "cpu,cpuacct/docker/cpu.cfs_period_us": "100000\n",
        },
    )
    assert cgroup_cpu_limit(proc, root) == 0.5
    assert thread_count({}, proc, root) == 1
    proc, root = _tree(
        tmp_path / "u",
        "2:cpu:/\n",
        {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"},
    )
    assert cgroup_cpu_limit(proc, root) is None


def test_the_setting_wins_and_bad_values_are_user_errors(tmp_path):
    proc, root = _tree(tmp_path, "0::/\n", {"cpu.max": "100000 100000"})
    assert thread_count({"DLVM_EQ_NUM_THREADS": "3"}, proc, root) == 3
    assert thread_count({"DLVM_EQ_NUM_THREADS": " 1 "}, proc, root) == 1
    for bad in ("0", "-2", "two", "1.5"):
        with pytest.raises(DlvmError, match="DLVM_EQ_NUM_THREADS"):
            thread_count({"DLVM_EQ_NUM_THREADS": bad}, proc, root)


_PRINT = (
    "from dlvm_eq.codegen.runtime.cpu_count import usable_cpus; from dlvm_eq.codegen.runtime.native_pool import native_pool; "
    "p = native_pool(); print(usable_cpus(), 1 + (p.workers if p else 0))"
)


def _child(env_extra, cache, prefix=()):
    env = {k: v for k, v in os.environ.items() if k != "DLVM_EQ_NUM_THREADS"}
    env.update(PYTHONPATH=str(ROOT), DLVM_EQ_CACHE_DIR=str(cache), **env_extra)
    out = subprocess.run(
        [*prefix, sys.executable, "-c", _PRINT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [int(v) for v in out.stdout.split()]


def test_the_runtime_reads_the_setting_and_the_affinity(tmp_path):
    """(usable_cpus(), threads of the native pool with the caller): 1 means no pool at all."""
    from dlvm_eq.codegen.runtime.native_pool import supported

    assert _child({"DLVM_EQ_NUM_THREADS": "5"}, tmp_path) == [5, 5 if supported() else 1]
    assert _child({"DLVM_EQ_NUM_THREADS": "1"}, tmp_path) == [1, 1]
    if shutil.which("taskset"):
        assert _child({}, tmp_path, ("taskset", "-c", str(min(os.sched_getaffinity(0))))) == [1, 1]
