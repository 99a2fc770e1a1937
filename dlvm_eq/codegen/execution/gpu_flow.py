"""Scans whose body has branches or loops of its own (a cond in a scan, a scan in a scan) on
the gpu executor (gpu_loop.py runs a body that is one straight piece): the body's pieces run
their plan steps on slot lists made once per loop call, a cond or switch reads its selector
(one device-to-host read, as the Python driver) and runs the taken branch's steps the same
way, an inner scan or while loop runs on gpu_loop.py's executor.

    scan = gpu_flow_scan(body, carries=1, xs=1, reverse=False, fn=body_function)  # or a str
    carries_and_ys = scan(carries, xs, withs, length)

`body` is what pipeline/loops.py compiles for a function with control flow: its `parts()` are
(params, steps, results), a step ("piece", compiled, inputs, outputs) or ("region", inst,
[compiled functions], outputs). A piece's results stay in its buffers until the next step, so
the scan copies each carry (into one of two buffers in turn) and each y (into its row),
device to device; nothing is allocated per step but an inner loop's own buffers.
"""

from __future__ import annotations

from ...ir.control_flow import COND, SCAN, SWITCH, WHILE, elements
from ...ir.module import Const
from .gpu_loop import GpuScan, GpuWhile, step_row
from .gpu_program import GpuProgram


class NotOnExecutor(Exception):
    """Why a body cannot run on the gpu executor (its loop runs on the Python driver)."""


def _program(compiled):
    prog = getattr(compiled, "program", None)
    if isinstance(prog, GpuProgram):
        return prog
    if hasattr(compiled, "parts"):
        return Flow(compiled.parts(), None)
    raise NotOnExecutor("a piece without a gpu program")


class Flow:
    """A function with control flow as steps on device arrays: `start()` makes a call's
    buffers, `step(state, values)` runs the function once and returns its results."""

    def __init__(self, parts, cp):
        params, steps, results = parts
        self.params, self.results = params, results
        self.steps: list = []
        for kind, what, bodies, outputs in steps:
            if kind == "piece":
                prog = _program(what)
                if not isinstance(prog, GpuProgram):
                    raise NotOnExecutor("a piece with control flow")
                self.steps.append(("piece", prog, bodies, outputs))
                continue
            inst, attrs = what, what.attrs
            progs = [_program(c) for c in bodies]
            if inst.op in (COND, SWITCH):
                run = ("branch", (inst.op == SWITCH, progs))
            elif inst.op == SCAN and isinstance(progs[0], GpuProgram):
                nc, nx = attrs["carries"], attrs["xs"]
                scan = GpuScan(progs[0], nc, nx, attrs["reverse"], attrs["body"])
                run = ("scan", (scan, nc, nx, attrs["length"]))
            elif inst.op == SCAN:
                scan = FlowScan(
                    progs[0], attrs["carries"], attrs["xs"], attrs["reverse"], attrs["body"]
                )
                run = ("scan", (scan, attrs["carries"], attrs["xs"], attrs["length"]))
            elif inst.op == WHILE and all(isinstance(p, GpuProgram) for p in progs):
                run = ("while", GpuWhile(progs[0], progs[1], attrs["carries"]))
            else:
                raise NotOnExecutor(f"a {inst.op} with control flow in its test or body")
            self.steps.append((run[0], run[1], inst.operands, outputs))
        self.cp = cp

    def start(self) -> dict:
        """A call's buffers: one slot list per piece and per branch."""
        state: dict = {}
        for kind, what, _, _ in self.steps:
            for prog in [what] if kind == "piece" else what[1] if kind == "branch" else []:
                state[id(prog)] = prog.new_env() if isinstance(prog, GpuProgram) else prog.start()
        return state

    def step(self, state: dict, values: list) -> list:
        env = {id(p): v for p, v in zip(self.params, values)}
        cp = self.cp

        def get(o):
            if isinstance(o, Const):  # on the device once per call, not per step
                if id(o) not in state:
                    state[id(o)] = cp.asarray(o.value, dtype=o.type.dtype.numpy)
                return state[id(o)]
            return env[id(o)]

        for kind, what, inputs, outputs in self.steps:
            vals = [get(v) for v in inputs]
            if kind == "piece":
                outs = _run(what, state[id(what)], vals)
            elif kind == "branch":
                switch, progs = what  # the selector: one read (a switch clamps it, as JAX)
                k = int(vals[0]) if switch else (0 if bool(vals[0]) else 1)
                prog = progs[min(max(k, 0), len(progs) - 1)]
                if isinstance(prog, GpuProgram):
                    outs = _run(prog, state[id(prog)], vals[1:])
                else:
                    outs = prog.step(state[id(prog)], vals[1:])
            elif kind == "scan":
                scan, nc, nx, n = what
                outs = scan(vals[:nc], vals[nc : nc + nx], vals[nc + nx :], n)
            else:
                outs = what(vals)
            for v, o in zip(outputs, outs):
                env[id(v)] = o
        return [get(r) for r in self.results]


def _run(prog: GpuProgram, env: list, vals: list) -> list:
    """One run of a straight piece on its slot list; its results, views of that list."""
    for (slot, _, _), v in zip(prog.param_slots, vals):
        env[slot] = v
    for run in prog.step_runs:
        run(env)
    prog.index_check(env)
    return [env[s] if f is None else f(env[s]) for s, f in prog.result_views]


class FlowScan:
    """A scan whose body is a Flow: carries and ys copied each step (see the docstring)."""

    def __init__(self, flow: Flow, nc: int, nx: int, reverse: bool, fn):
        self.flow, self.nc, self.nx, self.reverse = flow, nc, nx, reverse
        self.y_types = elements(fn.result_type)[nc:]

    def __call__(self, carries, xs, withs, n: int) -> list:
        flow, nc, nx = self.flow, self.nc, self.nx
        cp = flow.cp
        types = [p.type for p in flow.params]
        carries, xs, withs = (
            [cp.ascontiguousarray(cp.asarray(a, dtype=t.dtype.numpy)) for a, t in zip(group, ts)]
            for group, ts in (
                (carries, types[:nc]),
                (xs, types[nc : nc + nx]),
                (withs, types[nc + nx :]),
            )
        )
        state = flow.start()
        y_types = [(tuple(t.shape), t.dtype.numpy) for t in self.y_types]
        ys = [cp.empty((n, *shape), dt) for shape, dt in y_types]
        pairs = [(cp.empty(c.shape, c.dtype), cp.empty(c.shape, c.dtype)) for c in carries]
        current = list(carries)
        for k, t in enumerate(range(n - 1, -1, -1) if self.reverse else range(n)):
            got = flow.step(state, [*current, *[step_row(x, t) for x in xs], *withs])
            for j in range(len(ys)):
                cp.copyto(step_row(ys[j], t), got[nc + j])
            for i in range(nc):
                cp.copyto(pairs[i][k % 2], got[i])
                current[i] = pairs[i][k % 2]
        return current + ys


def gpu_flow_scan(body, nc: int, nx: int, reverse: bool, fn):
    """The scan of a body with control flow on the gpu executor, or a str saying why not."""
    from ..gpu.gpu_runtime import cupy_module

    try:
        flow = Flow(body.parts(), None)
    except NotOnExecutor as e:
        return str(e)
    _give_cp(flow, cupy_module())
    return FlowScan(flow, nc, nx, reverse, fn)


def _give_cp(flow: Flow, cp) -> None:
    """Every nested Flow's array module (made without one)."""
    todo = [flow]
    while todo:
        f = todo.pop()
        f.cp = cp
        for kind, what, _, _ in f.steps:
            if kind == "branch":
                todo.extend(p for p in what[1] if isinstance(p, Flow))
            elif kind == "scan" and isinstance(what[0], FlowScan):
                todo.append(what[0].flow)


__all__ = ["FlowScan", "gpu_flow_scan"]
