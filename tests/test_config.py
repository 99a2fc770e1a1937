"""dlvm_eq.config: the one reader of DLVM_EQ_* variables, and the settings page's table of them
(docs/guide/settings.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dlvm_eq import config
from dlvm_eq.errors import DlvmError

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "dlvm_eq"


def test_defaults_when_nothing_is_set():
    s = config.read({})
    assert s.cache_dir == Path.home() / ".cache" / "dlvm_eq"
    assert s.ir_cache and s.native_pool and s.epilogues
    assert (s.num_threads, s.spin_us, s.gemm) == (None, 300.0, "auto")


def test_values_are_parsed():
    s = config.read(
        {
            "DLVM_EQ_CACHE_DIR": "/tmp/x",
            "DLVM_EQ_NO_IR_CACHE": "1",
            "DLVM_EQ_NUM_THREADS": "3",
            "DLVM_EQ_NATIVE_POOL": "0",
            "DLVM_EQ_SPIN_US": "12.5",
            "DLVM_EQ_GEMM": "0",
            "DLVM_EQ_EPILOGUES": "0",
        }
    )
    assert s.cache_dir == Path("/tmp/x") and not s.ir_cache and not s.native_pool
    assert (s.num_threads, s.spin_us, s.gemm, s.epilogues) == (3, 12.5, "0", False)
    assert config.read({"DLVM_EQ_GEMM": "auto", "DLVM_EQ_NUM_THREADS": " 1024 "}).gemm == "auto"
    assert config.read({"DLVM_EQ_SPIN_US": "0", "DLVM_EQ_BLAS_POOL": "1"}).spin_us == 0.0


@pytest.mark.parametrize(
    "name,value,accepted",
    [
        ("DLVM_EQ_SPIN_US", "fast", "a number of microseconds from 0 to 1,000,000"),
        ("DLVM_EQ_SPIN_US", "1e99", "a number of microseconds from 0 to 1,000,000"),
        ("DLVM_EQ_SPIN_US", "-5", "a number of microseconds"),
        ("DLVM_EQ_SPIN_US", "nan", "a number of microseconds"),
        ("DLVM_EQ_SPIN_US", "inf", "a number of microseconds"),
        ("DLVM_EQ_NUM_THREADS", "100000", "a whole number of threads from 1 to 1024"),
        ("DLVM_EQ_NUM_THREADS", "0", "a whole number of threads from 1 to 1024"),
        ("DLVM_EQ_NUM_THREADS", "2.5", "a whole number of threads"),
        ("DLVM_EQ_GEMM", "maybe", "0 (never), 1 (always), auto or unset"),
        ("DLVM_EQ_NATIVE_POOL", "yes", "0 or 1"),
        ("DLVM_EQ_BLAS_POOL", "true", "0 or 1"),
        ("DLVM_EQ_EPILOGUES", "off", "0 or 1"),
    ],
)
def test_a_bad_value_is_the_users_error_naming_what_is_accepted(name, value, accepted):
    with pytest.raises(DlvmError) as e:
        config.read({name: value})
    assert str(e.value).startswith(f"{name}={value!r}: expected {accepted}")


def test_every_setting_is_checked_by_its_row():
    """Each row's parser refuses a value no variable accepts (no setting read unchecked)."""
    for s in config.SETTINGS:
        if s.name in ("DLVM_EQ_CACHE_DIR", "DLVM_EQ_NO_IR_CACHE"):  # a path; any value
            continue
        with pytest.raises(DlvmError, match=s.name):
            config.read({s.name: "not-a-value"})


@pytest.mark.parametrize(
    "env", [{"DLVM_EQ_NUM_THREADS": "100000"}, {"DLVM_EQ_SPIN_US": "1e99"}, {"DLVM_EQ_GEMM": "x"}]
)
def test_the_command_line_says_it_in_one_line(tmp_path, env):
    import os
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "dlvm_eq.cli", "check", str(ROOT / "examples" / "mlp.dl")],
        env=dict(os.environ, PYTHONPATH=str(ROOT), DLVM_EQ_CACHE_DIR=str(tmp_path), **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    (name,) = env
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith(f"dlvm-eq: error: {name}=") and len(r.stderr.splitlines()) == 1


def test_settings_are_read_once_and_reload_rereads(monkeypatch):
    first = config.settings()
    assert config.settings() is first
    monkeypatch.setenv("DLVM_EQ_EPILOGUES", "0")
    assert config.settings().epilogues == first.epilogues  # not re-read on its own
    assert config.reload().epilogues is False and config.settings().epilogues is False
    from dlvm_eq.codegen.runtime import gemm_runtime

    assert gemm_runtime.epilogues_enabled() is False


def _sources():
    return [(p, p.read_text()) for p in PACKAGE.rglob("*.py")]


def test_only_config_reads_the_environment():
    readers = [
        str(p.relative_to(ROOT))
        for p, text in _sources()
        if p.name != "config.py" and re.search(r"os\.environ|os\.getenv|getenv\(", text)
    ]
    assert readers == []


def test_every_variable_named_in_the_package_is_a_setting():
    names = {s.name for s in config.SETTINGS}
    named = {m for _, text in _sources() for m in re.findall(r"DLVM_EQ_[A-Z_]+", text)}
    assert named - names == set()


def test_the_settings_page_lists_every_setting_with_its_default():
    rows = {}
    for line in (ROOT / "docs" / "guide" / "settings.md").read_text().splitlines():
        m = re.match(r"\|\s*`(DLVM_EQ_[A-Z_]+)`\s*\|\s*([^|]*)\|", line)
        if m:
            rows[m.group(1)] = m.group(2).strip().strip("`"), line.split("|")[3].strip()
    assert rows == {s.name: (s.default or "unset", s.help) for s in config.SETTINGS}


def test_rules_dir_holds_the_schema():
    assert (config.rules_dir() / "schema.egg").is_file()
