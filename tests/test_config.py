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
    assert (s.num_threads, s.spin_us, s.gemm) == ("", 300.0, "auto")


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
    assert (s.num_threads, s.spin_us, s.gemm, s.epilogues) == ("3", 12.5, "0", False)
    assert config.read({"DLVM_EQ_GEMM": "maybe"}).gemm == "auto"  # as before: the host decides


def test_a_bad_number_is_the_users_error():
    with pytest.raises(DlvmError, match=r"DLVM_EQ_SPIN_US='fast': expected a number"):
        config.read({"DLVM_EQ_SPIN_US": "fast"})


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
            rows[m.group(1)] = m.group(2).strip().strip("`")
    assert rows == {s.name: s.default or "unset" for s in config.SETTINGS}


def test_rules_dir_holds_the_schema():
    assert (config.rules_dir() / "schema.egg").is_file()
