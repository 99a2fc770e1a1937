"""How long ago each buffer a plan step touches was last touched: the bytes of other buffers
touched and the seconds spent since, the program called again and again (a parameter's last
touch is in the previous call). `plan_cost` prices, from these, the share of a step's data that
the caches have lost (`program_state.py` measures how they lose it).

    for touches in reuse(plan, seconds):            # seconds: each step's predicted time
        for nbytes, bytes_since, seconds_since in touches: ...

A buffer is a piece of memory, not a slot: temporaries that share arena bytes are one buffer,
an alias is the buffer it views, and a convolution's column matrix is a buffer of its own
(the forward's is kept for the weight adjoint of the same input: `runtime/conv_reuse.py`).
Bytes since is the LRU stack distance (each other buffer counted once, however often touched),
kept in a Fenwick tree over the touches: O(touches log touches) for the whole plan.
"""

from __future__ import annotations

import math

from ..codegen.kernels.spec import DTYPES
from ..codegen.planning.plan import TEMP, AliasStep, Plan, step_inputs, step_outputs
from ..codegen.planning.steps_order import alias_root
from ..codegen.planning.window import WindowStep
from ..ir import window_ops

# window ops whose column matrix is the forward's (same input x, same geometry: one buffer)
_FORWARD_COLUMNS = ("conv2d", "conv2dBackwardWeight")


class _Fenwick:
    """Prefix sums over positions 0..n-1 with point updates, each O(log n) (integers: exact)."""

    def __init__(self, n: int):
        self._t = [0] * (n + 1)

    def add(self, i: int, v: int) -> None:
        i += 1
        while i < len(self._t):
            self._t[i] += v
            i += i & -i

    def below(self, i: int) -> int:
        """Sum over positions < i."""
        s = 0
        while i > 0:
            s += self._t[i]
            i -= i & -i
        return s


def step_touches(plan: Plan) -> list[list[tuple[object, int]]]:
    """Per step, the buffers it reads or writes: (buffer key, bytes), each buffer once."""
    root = alias_root(plan.steps)

    def key(s: int):
        s = root(s)
        if plan.slots[s].role == TEMP and s in plan.offsets:
            return ("arena", plan.offsets[s])
        return ("slot", s)

    out = []
    for step in plan.steps:
        if isinstance(step, AliasStep):  # a view: it touches nothing
            out.append([])
            continue
        seen: dict = {}
        for s in step_inputs(step) + step_outputs(step):
            k = key(s)
            seen[k] = max(seen.get(k, 0), plan.slots[s].nbytes)
        if isinstance(step, WindowStep) and step.op in window_ops.CONV_OPS:
            columns = _column_bytes(step, plan)
            if columns:
                x = key(step.inputs[0].slot)
                seen[("columns", x) if step.op in _FORWARD_COLUMNS else ("scratch",)] = columns
        out.append(list(seen.items()))
    return out


def _column_bytes(step: WindowStep, plan: Plan) -> int:
    from .plan_cost import window_work

    out = plan.slots[step.out]
    nbytes, _ = window_work(
        step.op, step.packed, [v.shape for v in step.inputs], out.shape, DTYPES[out.dtype].itemsize
    )
    own = sum(plan.slots[v.slot].nbytes for v in step.inputs) + out.nbytes
    return max(0, int(nbytes) - own)


def reuse(plan: Plan, seconds: list[float]) -> list[list[tuple[int, float, float]]]:
    """Per step, (bytes, bytes of other buffers touched since, seconds since) of each buffer it
    touches, in the second of two calls in a row (so every buffer has a last touch)."""
    return distances(step_touches(plan), seconds)


def distances(
    touches: list[list[tuple[object, int]]], seconds: list[float]
) -> list[list[tuple[int, float, float]]]:
    """`reuse` over per-step touches ((buffer key, bytes), ...) and per-step seconds: the
    steps run twice in a row, the second time reported. A buffer's bytes are its latest
    touch's; steps start and end on one clock, a touch counting from the end of its step."""
    events = 2 * sum(len(t) for t in touches)
    tree = _Fenwick(max(events, 1))
    last: dict = {}  # key -> (event position, bytes, end of the touching step)
    position, clock = 0, 0.0
    result: list[list[tuple[int, float, float]]] = []
    for call in range(2):
        for step_touched, step_s in zip(touches, seconds):
            start, end = clock, clock + step_s
            mine = []
            for k, nbytes in step_touched:
                before = last.get(k)
                if before is None:
                    mine.append((nbytes, math.inf, math.inf))
                else:
                    p, size, ended = before
                    between = tree.below(position) - tree.below(p + 1)
                    mine.append((nbytes, between, max(0.0, start - ended)))
                    tree.add(p, -size)
                tree.add(position, nbytes)
                last[k] = (position, nbytes, end)
                position += 1
            clock = end
            if call == 1:
                result.append(mine)
    return result


__all__ = ["distances", "reuse", "step_touches"]
