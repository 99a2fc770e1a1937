"""Loops on the gpu target run by the gpu executor (gpu_program.py) itself: the body's plan
steps run on one slot list per loop call, so the body's buffers (temporaries and outputs) are
allocated once per call and reused by every step, with no argument checks or Python calls of
the body between steps.

    scan = gpu_scan(body_program, carries=1, xs=1, reverse=False, fn=body_function)
    carries_and_ys = scan(carries, xs, withs, length)           # (a str above: why not)
    loop = gpu_while(cond_program, body_program, carries=2)
    carries = loop(carries_and_withs)

Per step, nothing crosses to the host:
- the carries move by pointer: a carry whose result is an output buffer of its own writes into
  one of two buffers in turn (ping-pong) and the next step reads it there; a carry that is also
  a y is read back from its row of the stacked ys; only other carry results (a view, a
  parameter, a slot two results share) are copied, device to device;
- xs are read and ys written through their rows (views at an offset): a y whose result is an
  output buffer of its own is written by the body's kernel straight into its row;
- gathers' out-of-range flags are OR-ed on the device and read once per loop; when one is set
  the loop runs again, checking each step, for the interpreter's error naming the index.
A while loop reads its condition once per step (one device-to-host read: the loop cannot
know whether to launch the next body before), or once per STEPS_PER_SYNC steps, the steps
past the end keeping their carries on the device. The body's and the condition's launches
stay the per-step cost (tests/fake_cupy.py's `record` counts them).

A scan whose body has branches or loops of its own runs on gpu_flow.py (its pieces the same
way, its branches read their selector); a while loop whose test or body has them runs on the
Python driver (pipeline/loops.py), its inner loops on this executor.
"""

from __future__ import annotations

from ...ir.control_flow import elements
from ..planning.plan import OUTPUT, CopyStep
from .gpu_program import GpuProgram

# A while loop reads its test once per this many steps: the steps between run on the device
# with their carries kept once a test fails (a logical_and, a logical_not and one masked copy
# per carry a step more). Not timed on a device yet (no GPU was lent): 1, one read a step, until
# scripts/gpu-check measures both (tests/test_gpu_loops.py checks 4 gives the same bits).
STEPS_PER_SYNC = 1


def _folded(prog: GpuProgram) -> tuple[list, list]:
    """(the body's step runs, its results) with the plan's trailing copies of one output into
    another dropped and their results read at the source: a value returned twice (a GRU's h,
    both carry and y) has one buffer, which the loop then reads as both."""
    steps, runs, slots = prog.plan.steps, list(prog.step_runs), prog.plan.slots
    same: dict[int, int] = {}
    while runs:
        step = steps[len(runs) - 1]
        if not (
            isinstance(step, CopyStep)
            and not step.src.chain
            and slots[step.src.slot].role == OUTPUT
            and slots[step.out].role == OUTPUT
        ):
            break
        same[step.out] = step.src.slot
        runs.pop()
    results = [(same.get(s, s) if v is None else s, v) for s, v in prog.result_views]
    if any(v is not None and s in same for s, v in prog.result_views):
        return list(prog.step_runs), list(prog.result_views)  # (a view of a copy: kept)
    return runs, results


def step_row(a, t: int):
    """Row t of a stacked array as a view (a 0-d view for a vector's element)."""
    return a[t] if a.ndim > 1 else a[t : t + 1].reshape(())


def _carry_modes(prog: GpuProgram, nc: int) -> tuple[list, list]:
    """(per carry: ("same",) its own parameter, ("ys", j) the row of y j, ("swap",) its own
    output buffer, or ("copy",); per y: "direct" (the body writes its row) or "copy")."""
    results, slots = _folded(prog)[1], prog.plan.slots
    params = [p[0] for p in prog.param_slots]
    owner: dict[int, tuple] = {}  # an output slot -> the one result whose buffer it is
    for k in [*range(nc, len(results)), *range(nc)]:  # ys first: a carry then reads its row
        slot, view = results[k]
        if view is None and slots[slot].role == OUTPUT and slot not in owner:
            owner[slot] = ("y", k - nc) if k >= nc else ("carry", k)
    carries = []
    for i, (slot, view) in enumerate(results[:nc]):
        own = owner.get(slot) if view is None else None
        if view is None and slot == params[i]:
            carries.append(("same",))
        elif own is not None and own[0] == "y":
            carries.append(("ys", own[1]))
        elif own == ("carry", i):
            carries.append(("swap",))
        else:
            carries.append(("copy",))
    ys = [
        "direct" if view is None and owner.get(slot) == ("y", j) else "copy"
        for j, (slot, view) in enumerate(results[nc:])
    ]
    return carries, ys


class GpuScan:
    """A scan whose body is one GpuProgram, run step by step on one slot list."""

    def __init__(self, prog: GpuProgram, nc: int, nx: int, reverse: bool, fn):
        self.prog, self.cp, self.nc, self.nx, self.reverse = prog, prog.cp, nc, nx, reverse
        self.slots = [p[0] for p in prog.param_slots]
        self.carry_modes, self.y_modes = _carry_modes(prog, nc)
        self.y_types = [(tuple(t.shape), t.dtype.numpy) for t in elements(fn.result_type)[nc:]]
        self.runs, results = _folded(prog)
        self.results = results
        self.y_out = [results[nc + j][0] for j, m in enumerate(self.y_modes) if m == "direct"]
        self.y_out_j = [j for j, m in enumerate(self.y_modes) if m == "direct"]
        self.swap_out = [
            (results[i][0], i) for i, m in enumerate(self.carry_modes) if m[0] == "swap"
        ]

    def __call__(self, carries, xs, withs, n: int) -> list:
        prog, nc, nx = self.prog, self.nc, self.nx
        carries = [prog.argument(i, a) for i, a in enumerate(carries)]
        xs = [prog.argument(nc + m, a, (n,)) for m, a in enumerate(xs)]
        withs = [prog.argument(nc + nx + w, a) for w, a in enumerate(withs)]
        out = self._run(carries, xs, withs, n, check_each=False)
        if out is None:  # an id out of range in some step: again, checking each step
            out = self._run(carries, xs, withs, n, check_each=True)
        return out

    def _run(self, carries, xs, withs, n, check_each: bool):
        prog, cp, nc, nx, slots = self.prog, self.cp, self.nc, self.nx, self.slots
        env = prog.new_env()  # the body's buffers, once per call
        for slot, a in zip(slots[nc + nx :], withs):
            env[slot] = a
        ys = [cp.empty((n, *shape), dt) for shape, dt in self.y_types]
        pairs = [
            (cp.empty(c.shape, c.dtype), cp.empty(c.shape, c.dtype))
            if m[0] in ("swap", "copy")
            else None
            for c, m in zip(carries, self.carry_modes)
        ]
        current, bad = list(carries), None
        runs, results, check = self.runs, self.results, prog.index_check
        for k, t in enumerate(range(n - 1, -1, -1) if self.reverse else range(n)):
            for slot, c in zip(slots, current):
                env[slot] = c
            for slot, x in zip(slots[nc : nc + nx], xs):
                env[slot] = step_row(x, t)
            for slot, i in self.swap_out:
                env[slot] = pairs[i][k % 2]
            for slot, j in zip(self.y_out, self.y_out_j):
                env[slot] = step_row(ys[j], t)
            for run in runs:
                run(env)
            if check_each:
                check(env)
            elif check.checks:
                flag = check.flag(env)
                bad = flag if bad is None else bad | flag
            got = [env[s] if f is None else f(env[s]) for s, f in results]
            for j, m in enumerate(self.y_modes):
                if m == "copy":
                    cp.copyto(step_row(ys[j], t), got[nc + j])
            for i, m in enumerate(self.carry_modes):
                if m[0] == "ys":
                    current[i] = step_row(ys[m[1]], t)
                elif m[0] == "swap":
                    current[i] = pairs[i][k % 2]
                elif m[0] == "copy":
                    cp.copyto(pairs[i][k % 2], got[i])
                    current[i] = pairs[i][k % 2]
        if bad is not None and bool(bad):  # the loop's one read-back of the flags
            return None
        # a carry left in a row of the ys gets a buffer of its own: the results do not alias
        final = [c.copy() if m[0] == "ys" and n else c for c, m in zip(current, self.carry_modes)]
        return final + ys


class GpuWhile:
    """A while loop whose condition and body are GpuPrograms: the condition is read once per
    step; the body's carries move by pointer as a scan's."""

    def __init__(self, cond: GpuProgram, body: GpuProgram, nc: int):
        self.cond, self.body, self.cp, self.nc = cond, body, body.cp, nc
        modes, _ = _carry_modes(body, nc)
        self.modes = modes
        self.runs, results = _folded(body)
        self.results = results
        self.swap_out = [(results[i][0], i) for i, m in enumerate(modes) if m[0] == "swap"]

    def __call__(self, vals) -> list:
        cond, body, nc, cp = self.cond, self.body, self.nc, self.cp
        current = [body.argument(i, a) for i, a in enumerate(vals[:nc])]
        withs = [body.argument(nc + w, a) for w, a in enumerate(vals[nc:])]
        cenv, benv = cond.new_env(), body.new_env()
        cslots = [p[0] for p in cond.param_slots]
        bslots = [p[0] for p in body.param_slots]
        for slot, a in zip(cslots[nc:], withs):
            cenv[slot] = a
        for slot, a in zip(bslots[nc:], withs):
            benv[slot] = a
        pairs = [
            (cp.empty(c.shape, c.dtype), cp.empty(c.shape, c.dtype))
            if m[0] in ("swap", "copy")
            else None
            for c, m in zip(current, self.modes)
        ]
        (cslot, cview), k = cond.result_views[0], 0
        # (gathers' id checks must not see the steps run past the end: read each step there)
        batch = 1 if cond.index_check.checks or body.index_check.checks else STEPS_PER_SYNC
        alive = dead = None
        while True:
            for slot, c in zip(cslots, current):
                cenv[slot] = c
            for run in cond.step_runs:
                run(cenv)
            cond.index_check(cenv)
            flag = cenv[cslot] if cview is None else cview(cenv[cslot])
            if batch == 1:
                if not bool(flag):  # the step's one read
                    return current
            else:  # on the device: whether every test so far held
                alive = flag.copy() if alive is None else cp.logical_and(alive, flag)
                dead = cp.logical_not(alive)
            for slot, c in zip(bslots, current):
                benv[slot] = c
            for slot, i in self.swap_out:
                benv[slot] = pairs[i][k % 2]
            for run in self.runs:
                run(benv)
            body.index_check(benv)
            got = [benv[s] if f is None else f(benv[s]) for s, f in self.results]
            for i, m in enumerate(self.modes):
                if m[0] == "same":
                    continue
                if m[0] != "swap":  # (no ys: "ys" cannot occur)
                    cp.copyto(pairs[i][k % 2], got[i])
                if dead is not None:  # past the end: the carry stays as it was
                    cp.copyto(pairs[i][k % 2], current[i], where=dead)
                current[i] = pairs[i][k % 2]
            k += 1
            if alive is not None and k % batch == 0 and not bool(alive):  # one read a batch
                return current


def gpu_scan(prog, nc: int, nx: int, reverse: bool, fn):
    """The scan on the gpu executor, or a str saying why the Python driver runs it."""
    if not isinstance(prog, GpuProgram):
        return "a body without a gpu program"
    return GpuScan(prog, nc, nx, reverse, fn)


def gpu_while(cond, body, nc: int):
    """The while loop on the gpu executor, or a str saying why the Python driver runs it."""
    if not (isinstance(cond, GpuProgram) and isinstance(body, GpuProgram)):
        return "a test or body with loops or branches of its own (inner loops: gpu executor)"
    return GpuWhile(cond, body, nc)


__all__ = ["GpuScan", "GpuWhile", "gpu_scan", "gpu_while", "step_row"]
