"""`GpuProgram`: a kernel plan compiled for the current CUDA device, called with CuPy (or
numpy) arrays; temporaries and outputs come from CuPy's memory pool per call (allocation there
is cheap).

    prog = GpuProgram(plan)
    out = prog(x, w)          # CuPy arrays out
"""

from __future__ import annotations

import time

from ...errors import DlvmError
from ..kernels.kernel_spec import KernelSpec
from ..kernels.spec import DTYPES
from ..planning.attention import AttentionStep
from ..planning.plan import OUTPUT, TEMP, AliasStep, BlasStep, GemmStep, KernelStep, Plan, RowStep
from .arguments import argument_shape_error, check_argument
from .index_range_check import IndexRangeCheck
from .step_runs import alias_run, array_step, row_run, view_fn


class GpuProgram:
    """A plan compiled for the current CUDA device; call it with CuPy (or numpy) arrays;
    results are CuPy arrays."""

    def __init__(self, plan: Plan):
        from ..gpu.gpu_runtime import compile_gpu, cupy_module

        cp = self.cp = cupy_module()
        self.plan = plan
        t0 = time.perf_counter()
        self.kernels = {id(s): compile_gpu(s.spec) for s in plan.kernels}
        self.kernel_seconds = time.perf_counter() - t0
        self._params = [(s, plan.slots[s].shape, DTYPES[plan.slots[s].dtype]) for s in plan.params]
        self._fresh = [
            (s.index, s.shape, DTYPES[s.dtype])
            for s in plan.slots
            if s.role == OUTPUT or (s.role == TEMP and s.index in plan.offsets)
        ]
        self._consts = {i: cp.asarray(a) for i, a in plan.constants.items()}
        self._runs = [self._step(s) for s in plan.steps]
        # CuPy's gathers clamp ids: a bad one is the interpreter's error after the steps
        self._index_check = IndexRangeCheck(plan.steps, cp, view_fn)
        self._results = [(r.slot, view_fn(r.chain, cp)) for r in plan.results]
        self._tuple = plan.tuple_result
        # what a loop (gpu_loop.py) runs step by step on one slot list
        self.param_slots, self.result_views = self._params, self._results
        self.step_runs, self.index_check = self._runs, self._index_check

    def _step(self, step):
        cp = self.cp
        if isinstance(step, AliasStep):
            return alias_run(step)
        if isinstance(step, RowStep):
            return row_run(self.kernels[id(step)], step)
        if isinstance(step, KernelStep):
            k = self.kernels[id(step)]
            ins, outs = list(step.inputs), list(step.outputs)
            shapes = [self.plan.slots[s].shape for s in outs]
            if isinstance(step.spec, KernelSpec):
                spec_shape = step.spec.shape
                return lambda env: k(
                    *[env[s] for s in ins],
                    out=[
                        env[s].reshape(spec_shape) if sh != spec_shape else env[s]
                        for s, sh in zip(outs, shapes)
                    ],
                )
            return lambda env: k(*[env[s] for s in ins], out=env[outs[0]])
        if isinstance(step, AttentionStep):  # the fused kernels (issue 33)
            from ..gpu.attention_gpu import attention_backward_gpu_run, attention_gpu_run

            views = [view_fn(v.chain, cp) for v in step.inputs]
            runner = attention_backward_gpu_run if step.grads else attention_gpu_run
            return runner(step, cp, views, array_step(step, cp))
        if isinstance(step, GemmStep):  # CPU plans only; here: the two steps in turn
            runs = [self._step(step.blas), self._step(step.epilogue)]
            return lambda env: [r(env) for r in runs]
        if isinstance(step, BlasStep):
            a, b, o = step.a.slot, step.b.slot, step.out
            fa = view_fn(step.a.chain, cp) or (lambda x: x)
            fb = view_fn(step.b.chain, cp) or (lambda x: x)
            if self.plan.slots[o].shape == ():  # vector . vector: no 0-d out= in CuPy's matmul
                return lambda env: cp.copyto(env[o], cp.dot(fa(env[a]), fb(env[b])))
            return lambda env: cp.matmul(fa(env[a]), fb(env[b]), out=env[o])
        return array_step(step, cp)

    def __call__(self, *args):
        return self._call(args, self._runs)

    def timed_call(self, *args) -> tuple[object, list[float]]:
        """(the call's results, seconds of each plan step in this call), the device synchronized
        around each step (what calibration and `--measure` time; a plain call overlaps them)."""
        seconds = [0.0] * len(self._runs)
        sync = self.cp.cuda.runtime.deviceSynchronize

        def timed(i, run):
            def run_timed(env):
                sync()
                t0 = time.perf_counter()
                run(env)
                sync()
                seconds[i] = time.perf_counter() - t0

            return run_timed

        return self._call(args, [timed(i, r) for i, r in enumerate(self._runs)]), seconds

    def argument(self, i: int, a, lead: tuple = ()):
        """Argument i as a C-contiguous device array of its declared dtype and shape (after
        `lead` axes: a scan's steps), or the DlvmError saying why not."""
        slot, shape, dt = self._params[i]
        shape = (*lead, *shape)
        a = self.cp.asarray(
            check_argument(self.plan.name, i, self.plan.slots[slot].name, a, shape, dt, self.cast),
            dtype=dt,
        )
        if a.shape != shape:
            raise argument_shape_error(self.plan.name, i, a, shape, dt)
        return self.cp.ascontiguousarray(a)

    def new_env(self) -> list:
        """A call's slot list: constants and a fresh buffer for every output and temporary in
        place, parameters empty (a loop, gpu_loop.py, fills those each step and reuses the
        rest)."""
        env: list = [None] * len(self.plan.slots)
        for slot, arr in self._consts.items():
            env[slot] = arr
        for slot, shape, dt in self._fresh:
            env[slot] = self.cp.empty(shape, dt)
        return env

    def _call(self, args, runs):
        if len(args) != len(self._params):
            raise DlvmError(
                f"@{self.plan.name} takes {len(self._params)} arguments, got {len(args)}"
            )
        env = self.new_env()
        for i, a in enumerate(args):
            env[self._params[i][0]] = self.argument(i, a)
        for run in runs:
            run(env)
        self._index_check(env)
        results = [env[s] if f is None else f(env[s]) for s, f in self._results]
        return tuple(results) if self._tuple else results[0]


__all__ = ["GpuProgram"]
