"""Test-session setup: a fresh compile cache, so no test reads what an earlier run stored."""

import os
import tempfile
import zlib

# Set before dlvm_eq creates its shared cache; subprocesses started by tests inherit it.
os.environ["DLVM_EQ_CACHE_DIR"] = tempfile.mkdtemp(prefix="dlvm_eq-test-cache-")
# Our GEMM on every host (by default products go to numpy's BLAS, gemm_runtime.DEFAULT_ENABLED):
# the tests of its paths and fused epilogues must run, and they run where users turn it on.
os.environ["DLVM_EQ_GEMM"] = "1"

from hypothesis import HealthCheck, settings

# This machine is shared and noisy: no per-example deadlines. In CI the examples are derived
# from each test's name (derandomize), so a landing never depends on a lucky draw; locally they
# stay random, which is where new counterexamples come from.
settings.register_profile("dlvm_eq", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "dlvm_eq-ci",
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("dlvm_eq-ci" if os.environ.get("CI") else "dlvm_eq")


import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _settings_follow_the_environment():
    """dlvm_eq.config reads the environment once; a test that changes it (monkeypatch.setenv,
    then config.reload()) leaves the settings of the restored environment behind it."""
    yield
    from dlvm_eq import config

    config.reload()


@pytest.fixture
def no_ir_cache(monkeypatch):
    """Every function and adjoint compiled in the test is built afresh, not read from the IR
    cache (disk or memory) that an earlier test filled: a compile read from the cache builds no
    e-graph and its report has no figures. The autouse fixture above restores the settings."""
    from dlvm_eq import config
    from dlvm_eq.pipeline import native

    monkeypatch.setenv("DLVM_EQ_NO_IR_CACHE", "1")
    config.reload()
    native._optimized.clear()
    yield


@pytest.fixture(autouse=True)
def _module_rng_seeded_by_test_name(request):
    """Many test modules draw inputs from a module-level ``RNG``/``rng``. Under pytest-xdist
    which tests ran before on the same worker changes those draws, so a tolerance that holds
    on one order can fail on another. Reseeding it from the test's id makes every test's
    inputs a function of its name alone, the same on every worker and every run."""
    module = request.module
    seed = zlib.crc32(request.node.nodeid.encode())
    for name in ("RNG", "rng"):
        if isinstance(getattr(module, name, None), np.random.Generator):
            setattr(module, name, np.random.default_rng(seed))
    yield
