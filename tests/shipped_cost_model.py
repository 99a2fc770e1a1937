"""An autouse fixture for test modules whose assertions hold for the shipped cost model (the
DP-optimal matrix chain, which products merge, which target is cheaper): machine(target) is
the shipped defaults for each of their tests, whatever profile the cache directory holds (a
calibrated profile prices products by measured times and legitimately picks other programs).

    from shipped_cost_model import shipped_cost_model  # noqa: F401 - autouse for this module
"""

from __future__ import annotations

import pytest

from dlvm_eq.extract import machine as machine_module


@pytest.fixture(autouse=True)
def shipped_cost_model(monkeypatch):
    monkeypatch.setattr(machine_module, "load_profile", lambda target: None)
