"""Structured control flow: `scan`, `while`, `cond`, `switch`. Their bodies are Functions held
in the instruction's attributes (the regions: `body`, `cond`, `branches`); the type rules,
printing and evaluation live in ir/control_flow.py, the interpreter runs them, the e-graph
never sees them (loop rules: ir/loop_rules.py).

    %r = scan @step carry (%h0: <4 x f32>) over (%xs: <8 x 3 x f32>) length 8

Their vmap rules (each body batched with `bt.batch_body`, ir/batching.py) are in
ir/registry/control_batch.py.
"""

from __future__ import annotations

from .. import control_flow
from ..op_spec import CONTROL, OpSpec, pascal
from .control_batch import branch_rule, scan_rule, while_rule

REGIONS = {
    "scan": ("body",),
    "while": ("cond", "body"),
    "cond": ("branches",),
    "switch": ("branches",),
}
BATCH = {"scan": scan_rule, "while": while_rule, "cond": branch_rule, "switch": branch_rule}


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
            batch=BATCH[name],
        )
        for name in control_flow.CONTROL_FLOW_OPS
    ]
