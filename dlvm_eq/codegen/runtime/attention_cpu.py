"""The fused attention kernel on the CPU: FlashAttention's forward, tiled over key blocks with
the online softmax, threads over (batch index, query block) tasks; the block products are
numpy's BLAS calls and the softmax work runs on a block that stays in the core's cache. Only
one block of scores per thread exists at a time: memory grows linearly in the sequence.

    attention_forward(q, k, v, bias, scale, causal, out)   # out[...] = softmax(q kᵀ s + bias) v

bias: an array broadcastable to the scores' shape, or a float added everywhere (0: none).
"""

from __future__ import annotations

import ctypes
import threading
from contextlib import contextmanager

import numpy as np

from ...ir.attention_op import KEY_BLOCK, QUERY_BLOCK
from .blas_threads import loaded_openblas
from .cpu_count import usable_cpus
from .threads import run_python

_GET = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads")
_GET += ("openblas_get_num_threads64_", "openblas_get_num_threads")
_SET = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads")
_SET += ("openblas_set_num_threads64_", "openblas_set_num_threads")
_LIBS: list | None = None  # (get, set) of every loaded OpenBLAS, found once
_LIBS_LOCK = threading.Lock()


def _symbol(lib, names):
    for name in names:
        if hasattr(lib, name):
            return getattr(lib, name)
    return None


def _openblas() -> list:
    global _LIBS
    with _LIBS_LOCK:
        if _LIBS is None:
            _LIBS = []
            for path in loaded_openblas():
                try:
                    lib = ctypes.CDLL(path)
                except OSError:
                    continue
                get, put = _symbol(lib, _GET), _symbol(lib, _SET)
                if get is not None and put is not None:
                    get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
                    _LIBS.append((get, put))
        return _LIBS


def blas_thread_controls() -> list:
    """(get, set) of the thread count of each OpenBLAS in the process (runtime/loop_driver.py
    sets it for loops too)."""
    return _openblas()


@contextmanager
def one_blas_thread():
    """OpenBLAS on one thread while the kernel's own threads call it: its workers busy-wait
    between calls, and with our threads on the same cores a block product took 40x longer
    (measured: 4.5 s against 0.11 s for seq 1024 on a loaded 2-core host)."""
    libs = _openblas()
    before = [get() for get, _ in libs]
    for _, put in libs:
        put(1)
    try:
        yield
    finally:
        for (_, put), n in zip(libs, before):
            put(n)


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
) -> None:
    """blocks: (queries, keys) per tile; the cost model prices the defaults."""
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

    with one_blas_thread():
        run_python(task, tasks, threads or usable_cpus())
