"""A result cut short by a wall-clock budget is not stored in the persistent caches: it
depends on the load of the moment, and stored it would be every later process's program
(cache.py). Results that finished are stored as before."""

from __future__ import annotations

import numpy as np

import dlvm_eq as dq
from dlvm_eq.cache import note_time_cut, watching_time_cuts
from dlvm_eq.ir import function_cache
from dlvm_eq.pipeline import planning


def _function(seed: int):
    """A small function whose IR text is unique to this test (no entry from another test)."""
    scale = 1.0 + seed / 1000.0
    return dq.make_ir(lambda a, b: dq.exp(a @ b) * scale)(
        np.ones((3, 4), np.float32), np.ones((4, 2), np.float32)
    )


def test_cuts_reach_every_enclosing_recorder_and_nothing_outside():
    note_time_cut("outside any build")  # nobody watching: dropped
    with watching_time_cuts() as outer:
        with watching_time_cuts() as inner:
            note_time_cut("fusion: time limit")
        note_time_cut("saturation: time budget")
    assert inner == ["fusion: time limit"]
    assert outer == ["fusion: time limit", "saturation: time budget"]


def test_a_cut_function_is_not_stored_a_finished_one_is():
    calls = []

    def build(cut):
        def run():
            calls.append(cut)
            if cut:
                note_time_cut("saturation: time budget (0 s) reached")
            return next(iter(_function(7).functions.values()))

        return run

    parts = ["test_time_cut_cache", "unique-7"]
    before = (function_cache.stats.misses, function_cache.stats.time_cut)
    function_cache.cached_function("optimize", parts, build(True), "rules")
    function_cache.cached_function("optimize", parts, build(True), "rules")
    assert calls == [True, True]  # built twice: nothing was stored
    assert (function_cache.stats.misses, function_cache.stats.time_cut) == (
        before[0] + 2,
        before[1] + 2,
    )
    function_cache.cached_function("optimize", parts, build(False), "rules")
    hits = function_cache.stats.hits
    function_cache.cached_function("optimize", parts, build(False), "rules")
    assert calls == [True, True, False]  # the finished result was read back
    assert function_cache.stats.hits == hits + 1


def test_a_cut_plan_is_not_stored_a_finished_one_is(monkeypatch):
    module = _function(11)
    name = next(iter(module.functions))
    real = planning.plan_function

    def cut_plan(*args, **kwargs):
        note_time_cut("fusion: time limit (0 s) reached")
        return real(*args, **kwargs)

    stats = planning.plan_cache_stats
    with monkeypatch.context() as m:
        m.setattr(planning, "plan_function", cut_plan)
        misses, cut = stats["misses"], stats["time_cut"]
        planning.planned(module, name, "cpu")
        planning.planned(module, name, "cpu")
        assert (stats["misses"], stats["time_cut"]) == (misses + 2, cut + 2)
    hits = stats["hits"]
    planning.planned(module, name, "cpu")
    planning.planned(module, name, "cpu")
    assert stats["hits"] == hits + 1


def test_saturation_stopped_by_its_time_budget_says_so():
    module = _function(13)
    with watching_time_cuts() as cuts:
        out = dq.optimize(module, budget={"seconds": 0.0})
    (report,) = out.report.functions.values()
    assert report.saturation.stop_reason == "seconds"
    assert cuts and cuts[0].startswith("saturation: time budget")
    with watching_time_cuts() as cuts:
        out = dq.optimize(module, budget={"seconds": 30.0})
    (report,) = out.report.functions.values()
    assert report.saturation.stop_reason == "saturated" and cuts == []


def test_a_cut_in_one_thread_is_not_another_threads():
    """Two builds on two threads at once: each recorder hears only its own thread's cuts (a
    cut seen by the other would leave a finished result uncached; a lost one would cache a
    load-dependent one)."""
    import threading

    barrier = threading.Barrier(2)
    heard = {}

    def build(name, cut):
        with watching_time_cuts() as cuts:
            barrier.wait(timeout=30)
            if cut:
                note_time_cut(f"{name}: time limit")
            barrier.wait(timeout=30)
        heard[name] = cuts

    threads = [
        threading.Thread(target=build, args=("cut", True)),
        threading.Thread(target=build, args=("finished", False)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert heard == {"cut": ["cut: time limit"], "finished": []}
