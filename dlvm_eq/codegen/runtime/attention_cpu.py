"""The fused attention kernel on the CPU: FlashAttention's forward, tiled over key blocks with
the online softmax, threads over (batch index, query block) tasks. Only one block of scores per
thread exists at a time: memory grows linearly in the sequence.

float32 runs the native task (cpu/attention_ir.py: the key loop, Q Kᵀ through our GEMM on each
head's K packed once (`own_qk`; OpenBLAS's sgemm where it does not apply), P V through
OpenBLAS's cblas_sgemm on one thread (ours measured slower there: 193 against 169 us a
block), the softmax in vectorized passes); other dtypes, a
process without a cblas OpenBLAS, and a non-finite scalar bias run the same algorithm with
numpy's calls per block (`_numpy_task`).

    attention_forward(q, k, v, bias, scale, causal, out)   # out[...] = softmax(q kᵀ s + bias) v

bias: an array broadcastable to the scores' shape, or a float added everywhere (0: none).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from contextlib import contextmanager

import numpy as np

from ...ir.attention_op import KEY_BLOCK, QUERY_BLOCK
from .blas_threads import loaded_openblas
from .cpu_count import usable_cpus
from .jit import JIT
from .threads import run_python

_GET = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads")
_GET += ("openblas_get_num_threads64_", "openblas_get_num_threads")
_SET = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads")
_SET += ("openblas_set_num_threads64_", "openblas_set_num_threads")
_SGEMM = (("scipy_cblas_sgemm64_", True), ("scipy_cblas_sgemm", False))
_SGEMM += (("cblas_sgemm64_", True), ("cblas_sgemm", False))
_LIBS: list | None = None  # (get, set) of every loaded OpenBLAS, found once
_GEMM: list = []  # (address, 64-bit integers) of the first loaded cblas_sgemm, found once
_LIBS_LOCK = threading.Lock()
LN2 = 0.6931471805599453
_SCRATCH = threading.local()  # each thread's task scratch (qs, s, run_max, run_sum)


def _symbol(lib, names):
    for name in names:
        if hasattr(lib, name):
            return getattr(lib, name)
    return None


def openblas_libraries() -> list:
    global _LIBS
    with _LIBS_LOCK:
        if _LIBS is None:
            _LIBS = []
            for path in loaded_openblas():
                try:
                    lib = ctypes.CDLL(path)
                except OSError:
                    continue
                for name, wide in _SGEMM:
                    if not _GEMM and hasattr(lib, name):
                        _GEMM.append((ctypes.cast(getattr(lib, name), ctypes.c_void_p).value, wide))
                get, put = _symbol(lib, _GET), _symbol(lib, _SET)
                if get is not None and put is not None:
                    get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
                    _LIBS.append((get, put))
        return _LIBS


_HOLDERS = [0, []]  # calls inside one_blas_thread now, and the thread counts they restore


@contextmanager
def one_blas_thread():
    """OpenBLAS on one thread while the kernel's own threads call it: its workers busy-wait
    between calls, and with our threads on the same cores a block product took 40x longer
    (measured: 4.5 s against 0.11 s for seq 1024 on a loaded 2-core host). Counted: with
    calls from several threads at once, the first saves the thread counts and the last
    restores them (a second call saving the first's 1 left OpenBLAS on one thread for good)."""
    libs = openblas_libraries()
    with _LIBS_LOCK:
        if _HOLDERS[0] == 0:
            _HOLDERS[1] = [get() for get, _ in libs]
            for _, put in libs:
                put(1)
        _HOLDERS[0] += 1
    try:
        yield
    finally:
        with _LIBS_LOCK:
            _HOLDERS[0] -= 1
            if _HOLDERS[0] == 0:
                for (_, put), n in zip(libs, _HOLDERS[1]):
                    put(n)


@functools.cache
def _native(blas_int64: bool, bias: bool, causal: bool, own_qk: bool = False, nr: int = 32):
    """The compiled task for these flags (JIT's memory and disk caches: built once; the memo
    spares each call the cache key, ~50 us). A race builds the same function twice."""
    from ..cpu.attention_ir import AttentionSpec, attention_ir  # the IR builder: a cache miss

    spec = AttentionSpec(bias=bias, causal=causal, blas_int64=blas_int64, own_qk=own_qk, nr=nr)
    code = JIT.kernel("attention", spec, lambda: attention_ir(spec))
    args = [ctypes.c_void_p] * 10 + [ctypes.c_int64] * 11 + [ctypes.c_float]
    args += [ctypes.c_void_p] * 3 + [ctypes.c_int32]
    return ctypes.CFUNCTYPE(None, *args)(code.address)


def _scratch(shape_key: tuple[int, int, int], pack_a: int = 0):
    """Addresses of this thread's (qs, s, run_max, run_sum, pack_a) for (rows, d, key block),
    kept across calls; pack_a: floats of our GEMM's packed-A scratch (0: none)."""
    got = getattr(_SCRATCH, "bufs", None)
    key = shape_key + (pack_a,)
    if got is None or got[0] != key:
        rows, d, kb = shape_key
        sizes = (rows * d, rows * kb, rows, rows, max(1, pack_a))
        bufs = [np.empty(n, np.float32) for n in sizes]
        got = (key, *bufs, *(b.ctypes.data for b in bufs))
        _SCRATCH.bufs = got
    return got[6:]


def own_qk_gemm(key_block: int, d: int):
    """Our GEMM (the shared wide CpuGemm) for the forward's Q Kᵀ, or None: DLVM_EQ_GEMM=0
    ("never ours"), or a key block that is not whole panels (packed K is read from k0 / NR)."""
    from .gemm_runtime import prepacking_enabled, shared_gemm

    if not prepacking_enabled() or d == 0:
        return None
    gemm = shared_gemm(False)
    return gemm if key_block % gemm.spec.nr == 0 else None


def packed_keys(k, batch: tuple, nr: int) -> np.ndarray:
    """Each head's Kᵀ as B_PACKED panels (gemm_runtime.pack_b_panels), packed once per call:
    batch + (panels, d, nr)."""
    from .gemm_runtime import pack_b_panels

    n, d = k.shape[-2], k.shape[-1]
    out = np.empty(batch + (-(-n // nr), d, nr), np.float32)
    for idx in np.ndindex(batch):
        pack_b_panels(k[idx].T, nr, out[idx])
    return out


def packed_row_blocks(x, batch: tuple, nr: int, block: int) -> np.ndarray:
    """Each head's x (rows x cols) as B_PACKED operands of `block` rows each (the depth of a
    product summing over those rows, e.g. the backward's dK += dSᵀ q): batch + (rows * w,),
    w = cols rounded up to nr, block r0 at r0 * w as (w / nr, its rows, nr) panels."""
    from .gemm_runtime import pack_b_panels

    rows, cols = x.shape[-2], x.shape[-1]
    w = -(-cols // nr) * nr
    out = np.empty(batch + (rows * w,), np.float32)
    for idx in np.ndindex(batch):
        for r0 in range(0, rows, block):
            r1 = min(rows, r0 + block)
            pack_b_panels(x[idx][r0:r1], nr, out[idx][r0 * w : r1 * w].reshape(w // nr, -1, nr))
    return out


def sgemm_pointer():
    """(address, 64-bit integers) of the loaded OpenBLAS's cblas_sgemm, or None."""
    with _LIBS_LOCK:
        gemm = _GEMM[0] if _GEMM else None
    if gemm is None:
        openblas_libraries()
        gemm = _GEMM[0] if _GEMM else None
    return gemm


def row_view(a) -> np.ndarray:
    """a with a contiguous last axis and row strides in whole elements (a copy otherwise)."""
    ok = a.strides[-1] == a.itemsize and all(st % a.itemsize == 0 for st in a.strides)
    return a if ok else np.ascontiguousarray(a)


def native_forward(q, k, v, bias, scale, causal, out, threads, blocks, lse=None) -> bool:
    """The float32 kernel; False where it does not apply (the caller runs numpy's). lse: None,
    or a float32 array of the scores' rows (batch + (m,)) that receives each row's log-sum-exp:
    the task's running maximum and sum are kept there (base 2) instead of in its scratch."""
    if q.dtype != np.float32 or not all(a.dtype == np.float32 for a in (k, v, out)):
        return False
    gemm = sgemm_pointer()
    if gemm is None:
        return False
    dense = isinstance(bias, np.ndarray) and bias.ndim > 0
    cb = 0.0 if dense else float(bias)
    if not np.isfinite(cb):
        return False  # softmax(s + c) = softmax(s) for a finite c only
    m, d, n, e = q.shape[-1 - 1], q.shape[-1], k.shape[-2], v.shape[-1]
    batch = q.shape[:-2]
    q, k, v = row_view(q), row_view(k), row_view(v)
    target = out if out.strides[-1] == 4 and all(st % 4 == 0 for st in out.strides) else None
    o = target if target is not None else np.empty(out.shape, np.float32)
    if dense:
        bias = np.broadcast_to(np.asarray(bias, np.float32), batch + (m, n))
        if bias.strides[-1] != 4:  # keys broadcast: the kernel reads them contiguous
            bias = np.ascontiguousarray(bias)
    query_block, key_block = blocks
    own = own_qk_gemm(key_block, d) if n else None
    fn = _native(gemm[1], dense, causal, own is not None, own.spec.nr if own else 32)
    scale = float(scale)
    pack_a = 0
    if own is not None:
        packs = packed_keys(k, batch, own.spec.nr)
        pk_base, pk_lead = packs.ctypes.data, packs.strides[:-3]
        pack_a = own.spec.scratch(key_block)[0]
        from ..cpu.gemm_ir import B_PACKED  # llvmlite: imported on this path only

        flags = own.layout_flags("rows", d, False) | B_PACKED

    arrays = (q, k, v, o) + ((bias,) if dense else ())
    base = [a.ctypes.data for a in arrays]  # addresses by arithmetic: .ctypes costs ~2 us each
    lead = [a.strides[:-2] for a in arrays]
    ld = [a.strides[-2] // 4 for a in arrays]
    brs = ld[4] if dense else 0
    stats = None
    if lse is not None:  # per row: the running maximum and sum, kept for the log-sum-exp
        stats = np.empty((2,) + batch + (m,), np.float32)
        st_base, st_lead = stats.ctypes.data, stats.strides[1:-1]

    def task(idx, q0):
        at = [b + sum(i * st for i, st in zip(idx, sts)) for b, sts in zip(base, lead)]
        bptr = at[4] + q0 * brs * 4 if dense else 0
        qs, s, run_max, run_sum, pa = _scratch((query_block, d, key_block), pack_a)
        own_args = (0, 0, 0, 0)
        if own is not None:
            pk = pk_base + sum(i * st for i, st in zip(idx, pk_lead))
            own_args = (pk, pa, own.address, flags)
        if stats is not None:
            run_max = st_base + sum(i * st for i, st in zip(idx, st_lead)) + q0 * 4
            run_sum = run_max + stats.strides[0]
        fn(
            at[0] + q0 * ld[0] * 4, at[1], at[2], at[3] + q0 * ld[3] * 4, bptr,
            qs, s, run_max, run_sum, gemm[0],
            min(m, q0 + query_block) - q0, n, d, e, ld[0], ld[1], ld[2], ld[3], brs, q0,
            key_block, scale, *own_args,
        )  # fmt: skip

    tasks = [(idx, q0) for idx in np.ndindex(batch) for q0 in range(0, m, query_block)]
    if causal:  # a later query block sees more keys: the longest first, so none is left last
        tasks.sort(key=lambda t: -t[1])
    if n == 0 or d == 0:
        return False
    with one_blas_thread():
        run_python(task, tasks, threads or usable_cpus())
    if target is None:
        out[...] = o
    if stats is not None:  # base 2: lse = (max + log2 sum) ln 2; a row with every key hidden: -inf
        with np.errstate(divide="ignore", invalid="ignore"):  # the kernel leaves a scalar bias out
            lse[...] = (stats[0] + np.log2(stats[1])) * np.float32(LN2) + np.float32(cb)
    return True


def attention_forward(
    q,
    k,
    v,
    bias,
    scale: float,
    causal: bool,
    out,
    threads: int = 0,
    blocks: tuple[int, int] = (QUERY_BLOCK, KEY_BLOCK),
    lse=None,
) -> None:
    """blocks: (queries, keys) per tile; the cost model prices the defaults. lse: None, or an
    array of shape batch + (m,) that receives each score row's log-sum-exp (natural log), which
    the fused backward (attention_backward.py) reads instead of recomputing it."""
    if native_forward(q, k, v, bias, scale, causal, out, threads, blocks, lse):
        return
    query_block, key_block = blocks
    m, n = q.shape[-2], k.shape[-2]
    batch = q.shape[:-2]
    dense = isinstance(bias, np.ndarray) and bias.ndim > 0
    bias = np.broadcast_to(bias, batch + (m, n)) if dense else float(bias)
    tasks = [(idx, q0) for idx in np.ndindex(batch) for q0 in range(0, m, query_block)]

    def task(idx, q0):
        q1 = min(m, q0 + query_block)
        qb = q[idx][q0:q1] * q.dtype.type(scale)  # scaled once per block: d, not n, products
        kb_all, vb_all = k[idx], v[idx]
        rows = q1 - q0
        run_max = np.full((rows, 1), -np.inf, q.dtype)
        run_sum = np.zeros((rows, 1), q.dtype)
        acc = np.zeros((rows, v.shape[-1]), q.dtype)
        end = min(n, q1) if causal else n  # keys past the block's last query are all hidden
        for k0 in range(0, end, key_block):
            k1 = min(end, k0 + key_block)
            s = qb @ kb_all[k0:k1].T
            if dense:
                s += bias[idx][q0:q1, k0:k1]
            elif bias:
                s += q.dtype.type(bias)
            if causal and k1 - 1 > q0:  # the block reaches above the diagonal
                hidden = np.arange(k0, k1)[None, :] > np.arange(q0, q1)[:, None]
                s[hidden] = -np.inf
            new_max = np.maximum(run_max, s.max(axis=1, keepdims=True))
            # rows that saw only hidden keys so far keep a finite shift (their weights are 0)
            shift = np.where(np.isfinite(new_max), new_max, 0).astype(q.dtype)
            s -= shift
            np.exp(s, out=s)
            rescale = np.exp(run_max - shift)  # exp(old max - new max); 0 before any key
            run_sum *= rescale
            run_sum += s.sum(axis=1, keepdims=True)
            acc *= rescale
            acc += s @ vb_all[k0:k1]
            run_max = new_max
        with np.errstate(invalid="ignore", divide="ignore"):  # a fully hidden row: NaN, as naive
            np.divide(acc, run_sum, out=out[idx][q0:q1])
            if lse is not None:
                lse[idx][q0:q1] = (run_max + np.log(run_sum))[:, 0]

    with one_blas_thread():
        run_python(task, tasks, threads or usable_cpus())
