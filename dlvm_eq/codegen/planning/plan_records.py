"""The kernel plan as JSON data (`json_records`), for the plan cache: every class a plan may
hold, by name; reading one builds plan, step and kernel objects through their constructors,
nothing else.

    text = plan_schema(FusionReport).dumps(plan)
    plan_schema(FusionReport).loads(text)    # an equal Plan; RecordError if the text is not one

The class of a plan's fusion report (`Plan.fusion`) comes from the fusion stage, which codegen
does not import: the caller names it (`report_types`).
"""
from __future__ import annotations

from ...json_records import Schema

_SCHEMAS: dict[tuple[type, ...], Schema] = {}   # by report types; a race builds an equal one


def plan_schema(*report_types: type) -> Schema:
    """The schema of plans whose fusion report is an instance of one of `report_types` (plain
    dataclasses), built on first use."""
    schema = _SCHEMAS.get(report_types)
    if schema is None:
        from ..kernels import spec as kernel
        from ..kernels.rows import RowSpec
        from . import plan
        schema = _SCHEMAS[report_types] = Schema("dlvm_eq.codegen.Plan", 1, [
            plan.Plan, plan.Slot, plan.View, plan.KernelStep, plan.RowStep, plan.BlasStep,
            plan.GemmStep, plan.ConcatStep, plan.CopyStep, plan.AliasStep,
            kernel.KernelSpec, kernel.ReduceSpec, kernel.KernelInput, RowSpec,
            kernel.Load, kernel.Const, kernel.Unary, kernel.Binary, kernel.Select, kernel.Cast,
            *report_types])
    return schema
