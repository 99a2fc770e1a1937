"""Planning: the fusion decision (egraph/fusion_decision.py) handed to the code generator's planner,
and the plan cache.

    plan = plan_function(module["f"], module, target="cpu")   # what was fused: print(plan)
    plan = planned(module, "f", "cpu")                        # the same, from the cache if there

The plan cache holds JSON data (`codegen.plan_schema()`), keyed by the module's text, the
target, the rule files, the package source and the GEMM settings; `plan_cache_stats` counts
hits and misses. Neither egglog nor the planner is imported on a hit.

Shared state (threads): `plan_cache_stats` and the cache's `corrupt` counter are written under
`_lock`.
"""

from __future__ import annotations

import threading

from ..cache import shared_cache, source_digest, watching_time_cuts
from ..codegen import Plan, cache_key, plan_schema, plan_settings
from ..egraph.rulefiles import rules_digest
from ..extract.machine import machine
from ..ir import function_cache
from ..ir.module import Function, Module
from ..ir.printer import print_module
from ..json_records import RecordError
from ..version import __version__

_lock = threading.Lock()


def plan_function(
    fn: Function,
    module: Module | None = None,
    rows: bool | int = True,
    target: str | None = None,
    budget=None,
) -> Plan:
    """The kernel plan of IR function `fn` (of `module`, for applies), its fusion decided by
    extraction from the fusion e-graph for `target` (default cpu). rows: as in
    `codegen.plan_flat` (True: row kernels of any length, an int: rows of at most that many
    elements, False: none). budget: the fusion stage's (a Budget or a dict; default
    egraph.fusion_decision.DEFAULT_BUDGET). Declared adjoints must be resolved (`resolve_adjoints`)."""
    from ..codegen import fusion_rows, plan_flat  # the planner loads only when a plan is built
    from ..egraph.fusion_decision import decide_fusion
    from ..ir.inline import flatten

    target = target or "cpu"
    flat = flatten(fn, module)
    decision = decide_fusion(flat, target, budget, rows=fusion_rows(rows))
    return plan_flat(flat, fn.name, decision, rows, target)


PLAN_FORMAT = "2"  # bump when what a plan entry holds changes (2: JSON, was a pickle)
plan_cache_stats = {"hits": 0, "misses": 0, "time_cut": 0}  # time_cut: built, not stored


def planned(
    module: Module, name: str, target: str, ir_key: str | None = None, built: Plan | None = None
) -> Plan:
    """`plan_function(module[name], module, rows=rows_for(target), target=target)`, or the plan
    a previous process stored for the same module text, target, rule files and package source. A plan
    entry that does not read back as a Plan is rebuilt and overwritten. DLVM_EQ_NO_IR_CACHE=1
    turns this cache off along with the IR cache. ir_key: a key that names `module` as
    exactly as its text does (native: the optimizer's input key), so that it is not printed
    again. built: a plan of this module already made (the never-slower guard's), stored under
    the key instead of planning again."""

    def build() -> Plan:
        from ..codegen import rows_for

        if built is not None:
            return built
        return plan_function(module[name], module, rows=rows_for(target), target=target)

    if not function_cache.enabled():
        return build()
    key = cache_key(
        "plan",
        PLAN_FORMAT,
        __version__,
        source_digest(),
        rules_digest(),
        name,
        target,
        ir_key or print_module(module),
        plan_settings(),
        machine(target).cost_key,
    )  # the fusion decision is priced with the profile
    cache = shared_cache()
    data = None if built is not None else cache.get("plan", key)
    if data is not None:
        plan = _load_plan(data)
        if plan is not None:
            with _lock:
                plan_cache_stats["hits"] += 1
            return plan
        with _lock:
            cache.corrupt += 1  # checksum fine but not a plan: rebuilt and overwritten
    with _lock:
        plan_cache_stats["misses"] += 1
    with watching_time_cuts() as cuts:
        plan = build()
    if cuts:  # depends on this moment's load: a later process plans again (cache.py)
        with _lock:
            plan_cache_stats["time_cut"] += 1
        return plan
    try:
        cache.put("plan", key, plan_schema().dumps(plan).encode())
    except RecordError:
        pass  # a plan holding something that is not data is simply not cached
    return plan


def _load_plan(data: bytes) -> Plan | None:
    try:
        plan = plan_schema().loads(data)
    except RecordError:  # any unreadable entry is a miss
        return None
    return plan if isinstance(plan, Plan) else None


__all__ = ["plan_cache_stats", "plan_function", "planned"]
