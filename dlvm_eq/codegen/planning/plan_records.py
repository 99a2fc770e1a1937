"""The kernel plan as JSON data (`json_records`), for the plan cache: every class a plan may
hold, by name; reading one builds plan, step and kernel objects through their constructors,
nothing else.

    text = plan_schema().dumps(plan)
    plan_schema().loads(text)          # an equal Plan; RecordError if the text is not one
"""

from __future__ import annotations

from ...json_records import Schema

_SCHEMA: Schema | None = None  # built on first use; a race builds an equal one


def plan_schema() -> Schema:
    """The schema (built on first use: RowSpec's module loads llvmlite's IR builder)."""
    global _SCHEMA
    schema = _SCHEMA
    if schema is None:
        from ..kernels import kernel_spec
        from ..kernels import spec as kernel
        from ..kernels.map_reduce import MapReduceSpec
        from ..kernels.rows import RowSpec
        from . import attention, gather, plan, scan
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
                gather.IndexStep,
                gather.SliceScatterStep,
                scan.ScanStep,
                attention.AttentionStep,
                kernel_spec.KernelSpec,
                kernel_spec.ReduceSpec,
                kernel_spec.KernelInput,
                RowSpec,
                MapReduceSpec,
                kernel.Load,
                kernel.Const,
                kernel.Unary,
                kernel.Binary,
                kernel.Select,
                kernel.Cast,
                FusionReport,
            ],
        )
    return schema
