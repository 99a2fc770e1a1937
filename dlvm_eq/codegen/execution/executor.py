"""Run a kernel plan: `CpuProgram` on numpy arrays, `GpuProgram` on CuPy arrays.

    prog = CpuProgram(plan)
    out = prog(x, w)          # numpy arrays in, numpy arrays out (a tuple for tuple results)

Everything that does not depend on the arguments is done once, when the program is built:
kernels compiled, steps turned into small closures, temporaries placed.

Buffers (CPU). Temporaries live in an *arena*, one allocation laid out by the plan's liveness
analysis, reused by every call (fresh pages cost ~1.7 us per 4 KiB here). An arena is a slot
list twice the plan's slots long: env[s] is slot s's array, env[n + s] its data pointer, taken
once when the array is placed (per arena for temporaries, constants and the views of them that
alias steps make, which then never run; per call for arguments, outputs and their views), so
that a small kernel's call is its pointers picked from the list (data_ptr costs ~0.35 us, and
the LSTM's 102 steps took 265 of them per call). Outputs are handed
to the caller: each call takes an output buffer that the caller no longer references (checked
with its reference count, views included) or allocates one, so results of one call are never
overwritten by the next, and a loop that drops its results reuses the same memory. A call
from a second thread while one runs gets a second arena.

GPU: temporaries and outputs come from CuPy's memory pool (allocation there is cheap).

Shared state (threads: one CpuProgram may be called from many threads at once):
- arenas (`_arenas`): a call pops one (list.pop is atomic) or makes a new one, and gives it
  back when done, so an arena serves one call at a time;
- output buffers (`_Outputs`): "is this buffer dropped by the caller? then it is mine" runs
  under the result's lock, the buffer stored in the call's slots before it is released;
- the kernels, step closures and constants are built once and only read; a GEMM step's
  epilogue (or its unfused fallback) is built on first use under that step's lock;
- GpuProgram allocates every temporary and output per call.
"""

from __future__ import annotations

import operator
import sys
import threading
import time

import numpy as np

from ...config import settings
from ...errors import DlvmError
from ..kernels.kernel_spec import KernelSpec
from ..kernels.spec import DTYPES
from ..planning.attention import AttentionStep, attention_run
from ..planning.gather import IndexStep, SliceScatterStep
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
from ..planning.scan import ScanStep, scan_run
from ..planning.views import apply_chain
from ..runtime.buffers import aligned_empty, data_ptr
from ..runtime.cpu_kernel import compile_cpu
from ..runtime.gemm_runtime import is_outer_product
from ..runtime.kernel_memo import build_all
from ..runtime.map_reduce_kernel import compile_map_reduce
from ..runtime.row_kernel import compile_rows
from ..runtime.threads import native_workers, rest_workers
from .arguments import check_argument
from .gather_steps import index_run
from .index_range_check import IndexRangeCheck
from .window_steps import conv_kernel_builds, window_run

KEEP_OUTPUTS = 4  # output buffers remembered per result for reuse


def _gemm_sized(out_shape, step) -> bool:
    """Whether a 2-D matmul is one for our GEMM (gemm_runtime.worth_our_gemm)."""
    from ..runtime.gemm_runtime import worth_our_gemm

    return (
        len(out_shape) == 2
        and len(step.a.shape) == 2
        and worth_our_gemm(out_shape[0], step.a.shape[1], out_shape[1])
    )


def _batch_sized(out_shape, step) -> bool:
    """Whether a batched matmul is one for our GEMM's batch loop (batch_gemm.worth_batched)."""
    from ..runtime.batch_gemm import worth_batched

    return len(step.a.shape) >= 2 and worth_batched(tuple(out_shape), step.a.shape[-1])


def _batched_matmul(a: int, b: int, o: int, fa, fb, fo=None):
    """The step running a batched product through our GEMM, numpy where its layouts do not
    suit; `fo` views the out slot (a result written in its reader's layout)."""
    from ..runtime.batch_gemm import batch_matmul

    fa, fb, fo = (f or (lambda x: x) for f in (fa, fb, fo))

    def run_batched(env):
        x, y, out = fa(env[a]), fb(env[b]), fo(env[o])
        if not batch_matmul(x, y, out):
            np.matmul(x, y, out=out)

    return run_batched


def _view_fn(chain, xp):
    """A function applying a view chain to an array (identity for an empty chain)."""
    if not chain:
        return None
    if len(chain) == 1 and chain[0][0] == "transpose" and list(chain[0][1]) == [1, 0]:
        return lambda a: a.T
    if len(chain) == 1 and chain[0][0] == "reshape":
        shape = tuple(chain[0][1])
        return lambda a: a.reshape(shape)
    return lambda a: apply_chain(a, chain, xp)


def _alias_view(a, step: AliasStep):
    """The source's memory from `offset` on, flat (a view on numpy and CuPy alike; sources are
    C-contiguous)."""
    return a.reshape(-1)[step.offset :]


def _alias_run(step: AliasStep):
    """The step as a closure on the slot list (the GPU's; the CPU's keeps pointers too)."""
    src, out = step.src, step.out
    return lambda env: env.__setitem__(out, _alias_view(env[src], step))


def _compile_step(s):
    """The CPU kernel of a KernelStep, RowStep or MapReduceStep."""
    if isinstance(s, RowStep):
        return compile_rows(s.spec)
    if isinstance(s, MapReduceStep):
        return compile_map_reduce(s.spec)
    return compile_cpu(s.spec)


def _row_run(kernel, step):
    """A row kernel (CPU RowKernel or GpuRowKernel: the same `run`) or a map-reduce kernel
    (MapReduceKernel: outputs, then reductions) as a closure on the slot list."""
    run = kernel.run
    ins, outs, reds = list(step.inputs), list(step.outputs), list(step.reductions)
    return lambda env: run([env[s] for s in ins], [env[s] for s in outs], [env[s] for s in reds])


def _direct_call(fn, head: tuple, pointers: list[int], tail: int):
    """A kernel's call on this thread as a closure on the slot list: the leading integers,
    the data pointers at env[pointers], the dims array."""
    if len(pointers) == 1:
        p = pointers[0]
        return lambda env: fn(*head, env[p], tail)
    pick = operator.itemgetter(*pointers)
    return lambda env: fn(*head, *pick(env), tail)


def _argument_error(plan: Plan, i: int, a, shape, dtype) -> DlvmError:
    got = getattr(a, "shape", None)
    return DlvmError(f"@{plan.name}: argument {i} has shape {got}, expected {shape} ({dtype})")


# ------------------------------------------------------------------ output buffers (CPU)


def _owner(a: np.ndarray) -> np.ndarray:
    return a if a.base is None else a.base


def _refcounts(entry) -> tuple[int, int]:
    buf, owner = entry
    return sys.getrefcount(buf), sys.getrefcount(owner)


def _calibrate() -> tuple[int, int]:
    """Reference counts of an output buffer nobody outside the program holds, measured on the
    same code path (`_refcounts`) that checks real buffers."""
    buf = aligned_empty((4,), np.float32)
    entries = [(buf, _owner(buf))]
    del buf
    return _refcounts(entries[0])


_FREE = _calibrate()


class _Outputs:
    """Buffers for one result: reuse one the caller has dropped, else allocate. The lock makes
    "check the reference count, hand it out" one step: two threads calling the same program
    must never both see a dropped buffer as free and both write into it."""

    __slots__ = ("shape", "dtype", "entries", "lock")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype
        self.entries: list = []
        self.lock = threading.Lock()

    def take(self, env: list, slot: int) -> None:
        """env[slot] = a free buffer (stored under the lock: from then on it is referenced)."""
        with self.lock:
            for entry in self.entries:
                if _refcounts(entry) == _FREE:
                    env[slot] = entry[0]
                    return
            buf = aligned_empty(self.shape, self.dtype)
            self.entries.append((buf, _owner(buf)))
            if len(self.entries) > KEEP_OUTPUTS:
                del self.entries[0]
            env[slot] = buf


# ------------------------------------------------------------------ the CPU program


def array_step(step, xp):
    """The run(env) of a step that the array library `xp` (numpy, or CuPy on the GPU) does
    itself: gathers and scatters, scans (the GPU's; the CPU compiles those: index_steps.py),
    windows (im2col + GEMM, pools), concatenations and copies; the same code on both targets."""
    if isinstance(step, (IndexStep, SliceScatterStep)):
        return index_run(step, xp, _view_fn)
    if isinstance(step, ScanStep):
        return scan_run(step, xp, _view_fn)
    if isinstance(step, WindowStep):
        return window_run(step, xp, [_view_fn(v.chain, xp) for v in step.inputs])
    if isinstance(step, AttentionStep):  # issue 33
        return attention_run(step, xp, [_view_fn(v.chain, xp) for v in step.inputs])
    if isinstance(step, ConcatStep):
        parts = [(p.slot, _view_fn(p.chain, xp) or (lambda x: x)) for p in step.parts]
        axis, o = step.axis, step.out
        return lambda env: xp.concatenate([f(env[s]) for s, f in parts], axis=axis, out=env[o])
    assert isinstance(step, CopyStep), step
    s, f, o = step.src.slot, _view_fn(step.src.chain, xp) or (lambda x: x), step.out
    return lambda env: xp.copyto(env[o], f(env[s]))


class CpuProgram:
    """A plan compiled for the host CPU; call it with numpy arrays."""

    def __init__(self, plan: Plan):
        self.plan = plan
        t0 = time.perf_counter()
        steps = [s for s in plan.steps if isinstance(s, (KernelStep, RowStep, MapReduceStep))]
        built = build_all(
            [lambda s=s: _compile_step(s) for s in steps] + conv_kernel_builds(plan)
        )  # new kernels build in parallel (convolutions' too: runtime/conv_cpu.kernel_spec)
        self.kernels = {id(s): k for s, k in zip(steps, built)}  # epilogues: their GEMMs
        self.kernel_seconds = time.perf_counter() - t0
        self._params = [(s, plan.slots[s].shape, DTYPES[plan.slots[s].dtype]) for s in plan.params]
        self._outputs = [
            (s.index, _Outputs(s.shape, DTYPES[s.dtype])) for s in plan.slots if s.role == OUTPUT
        ]
        self._n = len(plan.slots)  # env[self._n + s]: the data pointer of env[s]
        made_with_arena = arena_aliases(plan)
        self._arena_aliases = [plan.steps[i] for i in sorted(made_with_arena)]
        arena_views = {step.out for step in self._arena_aliases}
        # cleared after a call: nothing keeps a caller's array or a handed-out output alive
        self._clear = (
            [s for s in plan.params]
            + [i for i, _ in self._outputs]
            + [s.index for s in plan.slots if s.role == ALIAS and s.index not in arena_views]
        )
        self._indexed_runs = [
            (i, self._step(s)) for i, s in enumerate(plan.steps) if i not in made_with_arena
        ]
        self._runs = [r for _, r in self._indexed_runs]
        self._results = [(r.slot, _view_fn(r.chain, np)) for r in plan.results]
        self._tuple = plan.tuple_result
        self._arenas: list[list] = []
        if settings().blas_pool and any(isinstance(s, (BlasStep, WindowStep)) for s in plan.steps):
            native_workers()  # starts the pool, which takes OpenBLAS's jobs (blas_threads.py)

    # -- build
    def _new_env(self) -> list:
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
            env[step.out] = _alias_view(env[step.src], step)
        for s in range(n):
            if type(env[s]) is np.ndarray:
                env[n + s] = data_ptr(env[s])
        return env

    def _step(self, step):
        n = self._n
        if isinstance(step, AliasStep):  # of an argument or an output: made per call
            src, out = step.src, step.out

            def run_alias(env):
                v = env[out] = _alias_view(env[src], step)
                env[n + out] = data_ptr(v)

            return run_alias
        if isinstance(step, (KernelStep, RowStep, MapReduceStep)):
            k = self.kernels[id(step)]
            fast = k.one_call_head()
            if fast is not None:  # small kernels: one call on this thread, pointers ready
                slots = tuple(step_outputs(step)) + tuple(
                    step.inputs
                )  # the kernels' argument order
                return _direct_call(k.fn, fast, [n + s for s in slots], k.dims_ptr)
        if isinstance(step, (RowStep, MapReduceStep)):
            return _row_run(self.kernels[id(step)], step)
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
            fa, fb = _view_fn(step.a.chain, np), _view_fn(step.b.chain, np)
            matmul = np.matmul
            if step.out_view is not None:  # written in its reader's layout (product_layout.py)
                return _batched_matmul(a, b, o, fa, fb, strided_view_fn(step.out_view))
            if is_outer_product(step.a.shape, step.b.shape):
                fa, fb, multiply = fa or (lambda x: x), fb or (lambda x: x), np.multiply
                return lambda env: multiply(fa(env[a]), fb(env[b]), out=env[o])
            if _batch_sized(self.plan.slots[o].shape, step):
                return _batched_matmul(a, b, o, fa, fb)
            if not _gemm_sized(self.plan.slots[o].shape, step):
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
        from .index_steps import native_index_run  # gathers, scatters, scans: on first use

        return native_index_run(step, self.plan.slots) or array_step(step, np)

    def _gemm_epilogue(self, step: GemmStep):
        """Our GEMM with the kernel as its epilogue; where the operands' layouts (known only
        at run time) do not suit it, the matmul and then the kernel (compiled then), unfused."""
        from ..runtime.gemm_runtime import CpuEpilogue, gemm_for

        a, b, o = step.blas.a.slot, step.blas.b.slot, step.blas.out
        fa = _view_fn(step.blas.a.chain, np) or (lambda x: x)
        fb = _view_fn(step.blas.b.chain, np) or (lambda x: x)
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
            raise _argument_error(self.plan, i, arr, shape, dt)
        return np.ascontiguousarray(arr, dtype=dt)


# ------------------------------------------------------------------ the GPU program


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
        self._index_check = IndexRangeCheck(plan.steps, cp, _view_fn)
        self._results = [(r.slot, _view_fn(r.chain, cp)) for r in plan.results]
        self._tuple = plan.tuple_result

    def _step(self, step):
        cp = self.cp
        if isinstance(step, AliasStep):
            return _alias_run(step)
        if isinstance(step, RowStep):
            return _row_run(self.kernels[id(step)], step)
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
        if isinstance(step, GemmStep):  # CPU plans only; here: the two steps in turn
            runs = [self._step(step.blas), self._step(step.epilogue)]
            return lambda env: [r(env) for r in runs]
        if isinstance(step, BlasStep):
            a, b, o = step.a.slot, step.b.slot, step.out
            fa = _view_fn(step.a.chain, cp) or (lambda x: x)
            fb = _view_fn(step.b.chain, cp) or (lambda x: x)
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

    def _call(self, args, runs):
        cp = self.cp
        if len(args) != len(self._params):
            raise DlvmError(
                f"@{self.plan.name} takes {len(self._params)} arguments, got {len(args)}"
            )
        env: list = [None] * len(self.plan.slots)
        for i, ((slot, shape, dt), a) in enumerate(zip(self._params, args)):
            a = cp.asarray(
                check_argument(
                    self.plan.name, i, self.plan.slots[slot].name, a, shape, dt, self.cast
                ),
                dtype=dt,
            )
            if a.shape != shape:
                raise _argument_error(self.plan, i, a, shape, dt)
            env[slot] = cp.ascontiguousarray(a)
        for slot, arr in self._consts.items():
            env[slot] = arr
        for slot, shape, dt in self._fresh:
            env[slot] = cp.empty(shape, dt)
        for run in runs:
            run(env)
        self._index_check(env)
        results = [env[s] if f is None else f(env[s]) for s, f in self._results]
        return tuple(results) if self._tuple else results[0]


def program(plan: Plan, target: str = "cpu", cast: bool = False):
    """The plan compiled for `target`; arguments of another dtype than declared are an error,
    or cast with `cast=True` (arguments.py)."""
    if target not in ("cpu", "gpu"):
        raise DlvmError(f"unknown code generation target {target!r} (expected cpu or gpu)")
    prog = CpuProgram(plan) if target == "cpu" else GpuProgram(plan)
    prog.cast = cast
    return prog


__all__ = ["CpuProgram", "GpuProgram", "program"]
