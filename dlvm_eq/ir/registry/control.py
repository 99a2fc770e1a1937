"""Structured control flow: `scan`, `while`, `cond`, `switch`. Their bodies are Functions held
in the instruction's attributes (the regions: `body`, `cond`, `branches`); the type rules,
printing and evaluation live in ir/control_flow.py, the interpreter runs them, the e-graph
never sees them (loop rules: ir/loop_rules.py).

    %r = scan @step carry (%h0: <4 x f32>) over (%xs: <8 x 3 x f32>) length 8

No batching rule yet: vmap of a program with control flow is a BatchError naming the op (a
rule batches each body with `bt.batch_body`, ir/batching.py).
"""

from __future__ import annotations

from .. import control_flow
from ..op_spec import CONTROL, OpSpec, pascal

REGIONS = {
    "scan": ("body",),
    "while": ("cond", "body"),
    "cond": ("branches",),
    "switch": ("branches",),
}


def specs() -> list[OpSpec]:
    return [
        OpSpec(
            name,
            CONTROL,
            None,
            pascal(name),
            control_flow.result_type(name),
            control_flow.unevaluable,
            attrs=control_flow.ATTRS[name],
            regions=REGIONS[name],
        )
        for name in control_flow.CONTROL_FLOW_OPS
    ]
