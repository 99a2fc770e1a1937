"""What applying a step's operand views costs at call time: the executor turns each view chain
(transpose, reshape, broadcast, slice, strided) into numpy calls made on every call, and some
are not free (`np.broadcast_to` is a Python function: ~5 us per call on this EPYC, more than a
small concatenation's copy, so a concatenation of broadcast zeros, the adjoint of slicing, costs
three times one of plain parts).

    seconds = views_seconds(mc, step)        # the step's operands' chains, priced by op

Each view op is priced by its measured grid (kind `view_<op>`, one point: a view's cost does not
depend on the array's size), 0 without one (the shipped defaults and older profiles: as before).
"""

from __future__ import annotations

import dataclasses

from ..codegen.planning.plan import BlasStep, View
from ..extract.machine import Machine

VIEW_OPS = (
    "transpose",
    "reshape",
    "broadcast",
    "slice",
    "strided",
)  # codegen/planning/views.apply_chain
VIEW_KINDS = tuple(f"view_{op}" for op in VIEW_OPS)


def step_views(step) -> list[View]:
    """The views a step reads its operands through (a GEMM step's are its product's)."""
    found = []
    for f in dataclasses.fields(step):
        v = getattr(step, f.name)
        if isinstance(v, View):
            found.append(v)
        elif isinstance(v, tuple) and v and all(isinstance(x, View) for x in v):
            found.extend(v)
        elif isinstance(v, BlasStep):
            found.extend(step_views(v))
    return found


def chain_seconds(mc: Machine, chain) -> float:
    """Seconds of applying one view chain: each op at its measured cost."""
    total = 0.0
    for op, _ in chain:
        grid = mc.step_grids.get(f"view_{op}")
        if grid:
            total += grid[0][1]
    return total


def views_seconds(mc: Machine, step) -> float:
    return sum(chain_seconds(mc, v.chain) for v in step_views(step))


__all__ = ["VIEW_KINDS", "VIEW_OPS", "chain_seconds", "step_views", "views_seconds"]
