"""The kernel plan as JSON data (`json_records`), for the plan cache: every class a plan may
hold, by name; reading one builds plan, step and kernel objects through their constructors,
nothing else.

    text = plan_schema().dumps(plan)
    plan_schema().loads(text)          # an equal Plan; RecordError if the text is not one
"""

from __future__ import annotations

from ...json_records import Schema

_SCHEMA: Schema | None = None  # built on first use; a race builds an equal one

# step and kernel classes a plan holds only for some programs, imported when a plan names one
# (or holds one when written): a warm MLP loads no gather, scan, attention, row or map-reduce
# module for its cached plan
_LAZY = {
    "IndexStep": "dlvm_eq.codegen.planning.gather",
    "SliceScatterStep": "dlvm_eq.codegen.planning.gather",
    "ScanStep": "dlvm_eq.codegen.planning.scan",
    "AttentionStep": "dlvm_eq.codegen.planning.attention",
    "RowSpec": "dlvm_eq.codegen.kernels.rows",
    "MapReduceSpec": "dlvm_eq.codegen.kernels.map_reduce",
}


def plan_schema() -> Schema:
    """The schema (built on first use; the classes of `_LAZY` when a plan holds one)."""
    global _SCHEMA
    schema = _SCHEMA
    if schema is None:
        from ..kernels import kernel_spec
        from ..kernels import spec as kernel
        from . import plan
        from .fusion_report import FusionReport

        schema = _SCHEMA = Schema(
            "dlvm_eq.codegen.Plan",
            1,
            [
                plan.Plan,
                plan.Slot,
                plan.View,
                plan.KernelStep,
                plan.RowStep,
                plan.MapReduceStep,
                plan.BlasStep,
                plan.GemmStep,
                plan.ConcatStep,
                plan.CopyStep,
                plan.AliasStep,
                plan.WindowStep,
                kernel_spec.KernelSpec,
                kernel_spec.ReduceSpec,
                kernel_spec.KernelInput,
                kernel.Load,
                kernel.Const,
                kernel.Unary,
                kernel.Binary,
                kernel.Select,
                kernel.Cast,
                FusionReport,
            ],
            lazy=_LAZY,
        )
    return schema
