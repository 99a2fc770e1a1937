"""`CpuProgram`: a kernel plan compiled for the host CPU, called with numpy arrays.

    prog = CpuProgram(plan)
    out = prog(x, w)          # numpy arrays in, numpy arrays out (a tuple for tuple results)

Buffers. Temporaries live in an *arena*, one allocation laid out by the plan's liveness
analysis, reused by every call (fresh pages cost ~1.7 us per 4 KiB here). An arena is a slot
list twice the plan's slots long: env[s] is slot s's array, env[n + s] its data pointer, taken
once when the array is placed (per arena for temporaries, constants and the views of them that
alias steps make, which then never run; per call for arguments, outputs and their views), so
that a small kernel's call is its pointers picked from the list (data_ptr costs ~0.35 us, and
the LSTM's 102 steps took 265 of them per call). Outputs are handed to the caller
(output_buffers.py). A call from a second thread while one runs gets a second arena.

The first arena is made with the program, before its kernels load, and a helper thread faults
its pages in meanwhile (runtime/prefault.py: writing nothing, so the first call may start
before it is done), where another CPU can take that work, and so are the convolutions'
scratch matrices (window_steps.conv_scratch; they are the building thread's, the one a jit's
first call runs on): a warm process's first call then does not pay for fresh pages that a
steady call never sees (issue 32).

Shared state (threads: one CpuProgram may be called from many threads at once):
- arenas (`_arenas`): a call pops one (list.pop is atomic) or makes a new one, and gives it
  back when done, so an arena serves one call at a time; the prefaulting helper only reads
  the first arena's address (`prefault`: set when it has finished);
- output buffers (`OutputBuffers`): "is this buffer dropped by the caller? then it is mine" runs
  under the result's lock, the buffer stored in the call's slots before it is released;
- the kernels, step closures and constants are built once and only read; a GEMM step's
  epilogue (or its unfused fallback) is built on first use under that step's lock.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from ...config import settings
from ...errors import DlvmError
from ..kernels.kernel_spec import KernelSpec
from ..kernels.spec import DTYPES
from ..planning.attention import AttentionStep
from ..planning.plan import (
    ALIAS,
    CONST,
    OUTPUT,
    TEMP,
    AliasStep,
    BlasStep,
    ConcatStep,
    CopyStep,
    GemmStep,
    KernelStep,
    MapReduceStep,
    Plan,
    RowStep,
    WindowStep,
    arena_aliases,
    step_outputs,
)
from ..planning.product_layout import strided_view_fn
from ..runtime.buffers import aligned_empty, data_ptr
from ..runtime.cpu_count import thread_count
from ..runtime.cpu_kernel import compile_cpu
from ..runtime.gemm_runtime import is_outer_product
from ..runtime.kernel_memo import build_all
from ..runtime.prefault import MIN_BYTES, populate_in_background
from ..runtime.threads import native_workers, rest_workers
from .arguments import argument_shape_error, check_argument
from .output_buffers import OutputBuffers, returned_twice
from .step_runs import (
    alias_view,
    array_step,
    batch_sized,
    batched_matmul,
    direct_call,
    gemm_sized,
    row_run,
    view_fn,
)


def _compile_step(s):
    """The CPU kernel of a KernelStep, RowStep or MapReduceStep (each family's runtime loads
    with its first kernel: a warm process imports only what its plan runs)."""
    if isinstance(s, RowStep):
        from ..runtime.row_kernel import compile_rows

        return compile_rows(s.spec)
    if isinstance(s, MapReduceStep):
        from ..runtime.map_reduce_kernel import compile_map_reduce

        return compile_map_reduce(s.spec)
    return compile_cpu(s.spec)


def _conv_kernel_builds(plan) -> list:
    """window_steps.conv_kernel_builds, its module (and the window runtimes) loaded only for a
    plan with window steps."""
    if not any(isinstance(step, WindowStep) for step in plan.steps):
        return []
    from .window_steps import conv_kernel_builds

    return conv_kernel_builds(plan)


def _conv_scratch(plan) -> list:
    """window_steps.conv_scratch, loaded only for a plan with window steps."""
    if not any(isinstance(step, WindowStep) for step in plan.steps):
        return []
    from .window_steps import conv_scratch

    return conv_scratch(plan)


class CpuProgram:
    """A plan compiled for the host CPU; call it with numpy arrays."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self._n = len(plan.slots)  # env[self._n + s]: the data pointer of env[s]
        made_with_arena = arena_aliases(plan)
        self._arena_aliases = [plan.steps[i] for i in sorted(made_with_arena)]
        self._arenas: list[list] = []
        self.prefault: threading.Event | None = None  # set once the first arena is faulted in
        # before the kernels load, where the process has a second CPU (whatever the kernels'
        # thread count, DLVM_EQ_NUM_THREADS: the helper runs no kernel): its affinity and quota
        if thread_count(environ={}) > 1:
            env, raw = self._arena()
            self._arenas.append(env)
            fresh = [a for a in [raw, *_conv_scratch(plan)] if a.nbytes >= MIN_BYTES]
            if fresh:
                self.prefault = populate_in_background(fresh)
        t0 = time.perf_counter()
        steps = [s for s in plan.steps if isinstance(s, (KernelStep, RowStep, MapReduceStep))]
        built = build_all(
            [lambda s=s: _compile_step(s) for s in steps] + _conv_kernel_builds(plan)
        )  # new kernels build in parallel (convolutions' too: runtime/conv_cpu.kernel_spec)
        self.kernels = {id(s): k for s, k in zip(steps, built)}  # epilogues: their GEMMs
        self.kernel_seconds = time.perf_counter() - t0
        self._params = [(s, plan.slots[s].shape, DTYPES[plan.slots[s].dtype]) for s in plan.params]
        copies, same = returned_twice(plan)  # a value returned twice: one buffer, no copy
        self._outputs = [
            (s.index, OutputBuffers(s.shape, DTYPES[s.dtype]))
            for s in plan.slots
            if s.role == OUTPUT and s.index not in same
        ]
        arena_views = {step.out for step in self._arena_aliases}
        # cleared after a call: nothing keeps a caller's array or a handed-out output alive
        self._clear = (
            [s for s in plan.params]
            + [i for i, _ in self._outputs]
            + [s.index for s in plan.slots if s.role == ALIAS and s.index not in arena_views]
        )
        self._indexed_runs = [
            (i, self._step(s))
            for i, s in enumerate(plan.steps)
            if i not in made_with_arena and i not in copies
        ]
        self._runs = [r for _, r in self._indexed_runs]
        self._results = [(same.get(r.slot, r.slot), view_fn(r.chain, np)) for r in plan.results]
        self._tuple = plan.tuple_result
        if settings().blas_pool and any(isinstance(s, (BlasStep, WindowStep)) for s in plan.steps):
            native_workers()  # starts the pool, which takes OpenBLAS's jobs (blas_threads.py)

    # -- build
    def _new_env(self) -> list:
        return self._arena()[0]

    def _arena(self) -> tuple[list, np.ndarray]:
        """A new arena (slot list) and the one buffer its temporaries live in."""
        plan, n = self.plan, self._n
        env: list = [None] * (2 * n)
        raw = aligned_empty((max(plan.arena_bytes, 64),), np.uint8)
        for s in plan.slots:
            if s.role == TEMP and s.index in plan.offsets:  # (a temporary fused away has none)
                off = plan.offsets[s.index]
                dt = DTYPES[s.dtype]
                size = int(np.prod(s.shape, dtype=np.int64)) * dt.itemsize
                env[s.index] = raw[off : off + size].view(dt).reshape(s.shape)
            elif s.role == CONST:
                env[s.index] = plan.constants[s.index]
        for step in self._arena_aliases:  # in plan order: an alias of an alias
            env[step.out] = alias_view(env[step.src], step)
        for s in range(n):
            if type(env[s]) is np.ndarray:
                env[n + s] = data_ptr(env[s])
        return env, raw

    def _step(self, step):
        n = self._n
        if isinstance(step, AliasStep):  # of an argument or an output: made per call
            src, out = step.src, step.out

            def run_alias(env):
                v = env[out] = alias_view(env[src], step)
                env[n + out] = data_ptr(v)

            return run_alias
        if isinstance(step, (KernelStep, RowStep, MapReduceStep)):
            k = self.kernels[id(step)]
            fast = k.one_call_head()
            if fast is not None:  # small kernels: one call on this thread, pointers ready
                slots = tuple(step_outputs(step)) + tuple(
                    step.inputs
                )  # the kernels' argument order
                return direct_call(k.fn, fast, [n + s for s in slots], k.dims_ptr)
        if isinstance(step, (RowStep, MapReduceStep)):
            return row_run(self.kernels[id(step)], step)
        if isinstance(step, KernelStep):
            k = self.kernels[id(step)]
            ins, outs = list(step.inputs), list(step.outputs)
            if isinstance(step.spec, KernelSpec):
                run_map = k.run_map
                return lambda env: run_map([env[s] for s in ins], [env[s] for s in outs])
            run_reduce, o = k.run_reduce, outs[0]
            return lambda env: run_reduce([env[s] for s in ins], env[o])
        if isinstance(step, GemmStep):
            return self._gemm_epilogue(step)
        if isinstance(step, BlasStep):
            a, b, o = step.a.slot, step.b.slot, step.out
            fa, fb = view_fn(step.a.chain, np), view_fn(step.b.chain, np)
            matmul = np.matmul
            if step.out_view is not None:  # written in its reader's layout (product_layout.py)
                return batched_matmul(a, b, o, fa, fb, strided_view_fn(step.out_view))
            if is_outer_product(step.a.shape, step.b.shape):
                fa, fb, multiply = fa or (lambda x: x), fb or (lambda x: x), np.multiply
                return lambda env: multiply(fa(env[a]), fb(env[b]), out=env[o])
            if batch_sized(self.plan.slots[o].shape, step):
                return batched_matmul(a, b, o, fa, fb)
            if not gemm_sized(self.plan.slots[o].shape, step):
                if fa is None and fb is None:
                    return lambda env: matmul(env[a], env[b], out=env[o])
                fa = fa or (lambda x: x)
                fb = fb or (lambda x: x)
                return lambda env: matmul(fa(env[a]), fb(env[b]), out=env[o])
            from ..runtime.gemm_runtime import matmul as gemm

            fa = fa or (lambda x: x)
            fb = fb or (lambda x: x)

            def run_matmul(env):  # our GEMM where the operands' layouts allow, else BLAS
                x, y, out = fa(env[a]), fb(env[b]), env[o]
                if not gemm(x, y, out):
                    matmul(x, y, out=out)

            return run_matmul
        if isinstance(step, (WindowStep, ConcatStep, CopyStep, AttentionStep)):
            return array_step(step, np)  # a convolution's plan loads no gather or scan module
        from .index_steps import native_index_run  # gathers, scatters, scans: on first use

        return native_index_run(step, self.plan.slots) or array_step(step, np)

    def _gemm_epilogue(self, step: GemmStep):
        """Our GEMM with the kernel as its epilogue; where the operands' layouts (known only
        at run time) do not suit it, the matmul and then the kernel (compiled then), unfused."""
        from ..runtime.gemm_runtime import CpuEpilogue, gemm_for

        a, b, o = step.blas.a.slot, step.blas.b.slot, step.blas.out
        fa = view_fn(step.blas.a.chain, np) or (lambda x: x)
        fb = view_fn(step.blas.b.chain, np) or (lambda x: x)
        epilogue: list = []  # compiled on first use, like the unfused pair
        slots = list(step.epilogue.outputs) + list(step.epilogue.inputs)
        unfused: list = []
        lock = threading.Lock()  # first uses from two threads: one builds, the other waits

        def run(env):
            x, y, out = fa(env[a]), fb(env[b]), env[o]
            g = gemm_for(x, y, out)
            if g is None:
                if not unfused:
                    with lock:
                        if not unfused:
                            self.kernels[id(step.epilogue)] = compile_cpu(step.epilogue.spec)
                            unfused.extend([self._step(step.blas), self._step(step.epilogue)])
                for r in unfused:
                    r(env)
                return
            if not epilogue:
                with lock:
                    if not epilogue:
                        epilogue.append(CpuEpilogue(step.epilogue.spec, step.c_input))
            g(x, y, out, epilogue=epilogue[0], extra=[data_ptr(env[s]) for s in slots])

        return run

    # -- call
    def __call__(self, *args):
        return self._call(args, self._runs)

    def take_arena(self) -> list:
        """An arena (slot list: arrays, then data pointers) for one call on this thread
        (execution/native_loop.py runs a loop in it); hand it back with give_arena."""
        try:
            return self._arenas.pop()  # atomic: each arena serves one call at a time
        except IndexError:
            return self._new_env()

    def give_arena(self, env: list) -> None:
        for s in self._clear:
            env[s] = None
        self._arenas.append(env)

    def timed_call(self, *args) -> tuple[object, list[float]]:
        """(the call's results, seconds of each plan step in this call): what `--measure`
        prints next to each step's predicted time."""
        seconds = [0.0] * len(self.plan.steps)  # an alias made with the arena: 0

        def timed(i, run):
            def run_timed(env):
                t0 = time.perf_counter()
                run(env)
                seconds[i] = time.perf_counter() - t0

            return run_timed

        return self._call(args, [timed(i, r) for i, r in self._indexed_runs]), seconds

    def _call(self, args, runs):
        n = self._n
        if len(args) != len(self._params):
            raise DlvmError(
                f"@{self.plan.name} takes {len(self._params)} arguments, got {len(args)}"
            )
        try:
            env = self._arenas.pop()  # list.pop is atomic: each arena serves one call at a time
        except IndexError:
            env = self._new_env()
        try:
            for i, ((slot, shape, dt), a) in enumerate(zip(self._params, args)):
                if (
                    type(a) is not np.ndarray
                    or a.dtype != dt
                    or a.shape != shape
                    or not a.flags.c_contiguous
                ):
                    a = self._coerce(i, a, shape, dt)
                env[slot] = a
                env[n + slot] = data_ptr(a)
            for slot, outs in self._outputs:
                outs.take(env, slot)
                env[n + slot] = data_ptr(env[slot])
            for run in runs:
                run(env)
            results = [env[s] if f is None else f(env[s]) for s, f in self._results]
        finally:
            for s in self._clear:
                env[s] = None
            self._arenas.append(env)
            rest_workers()
        return tuple(results) if self._tuple else results[0]

    def _coerce(self, i: int, a, shape, dt):
        arr = check_argument(
            self.plan.name, i, self.plan.slots[self._params[i][0]].name, a, shape, dt, self.cast
        )
        arr = np.asarray(arr)
        if arr.shape != shape:
            raise argument_shape_error(self.plan.name, i, arr, shape, dt)
        return np.ascontiguousarray(arr, dtype=dt)


__all__ = ["CpuProgram"]
