"""Parse, optimize and emit one kernel module in a thread's own LLVM context, calling
libllvmlite's C functions directly, without llvmlite's process-wide lock.

    >>> context, tm = llvm.create_context(), <a target machine of this thread's own>
    >>> obj = emit_object(context, tm, ir_text, speed=3, vectorize=True)   # ELF bytes

Why: llvmlite 0.50 wraps every binding call in one RLock (`llvmlite.binding.ffi`), so two
threads compiling kernels in distinct contexts still took turns: on the transformer step's 23
kernels two threads took as long as one. LLVM itself compiles modules concurrently when each
thread has its own LLVMContext and TargetMachine (as ORC's concurrent compile threads do), and
ctypes releases the GIL for each call. The calls and their order are llvm_cpu's locked path's
(parse, verify, the per-module default pipeline at `speed`, emit), so the object code is the
same bytes (tests/test_unlocked_llvm.py).

Only the objects created here, the caller's context and its target machine are touched: the
global context, the MCJIT engine and the NVPTX back end stay behind llvmlite's lock.
"""

from __future__ import annotations

import ctypes
import threading
from importlib import resources

from llvmlite.binding import ffi

_P = ctypes.c_void_p
_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()

# name -> (argtypes, restype): the signatures llvmlite declares for these functions
_SIGNATURES = {
    "LLVMPY_ParseAssembly": ([_P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)], _P),
    "LLVMPY_VerifyModule": ([_P, ctypes.POINTER(ctypes.c_char_p)], ctypes.c_bool),
    "LLVMPY_DisposeModule": ([_P], None),
    "LLVMPY_DisposeString": ([ctypes.c_char_p], None),
    "LLVMPY_CreatePipelineTuningOptions": ([], _P),
    "LLVMPY_PTOSetLoopVectorization": ([_P, ctypes.c_bool], None),
    "LLVMPY_PTOSetSLPVectorization": ([_P, ctypes.c_bool], None),
    "LLVMPY_DisposePipelineTuningOptions": ([_P], None),
    "LLVMPY_CreatePassBuilder": ([_P, _P], _P),
    "LLVMPY_DisposePassBuilder": ([_P], None),
    "LLVMPY_buildPerModuleDefaultPipeline": ([_P, ctypes.c_int], _P),
    "LLVMPY_RunNewModulePassManager": ([_P, _P, _P], None),
    "LLVMPY_DisposeNewModulePassManger": ([_P], None),  # sic: llvmlite's spelling
    "LLVMPY_TargetMachineEmitToMemory": (
        [_P, _P, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
        _P,
    ),
    "LLVMPY_GetBufferStart": ([_P], _P),
    "LLVMPY_GetBufferSize": ([_P], ctypes.c_size_t),
    "LLVMPY_DisposeMemoryBuffer": ([_P], None),
}


def library() -> ctypes.CDLL:
    """libllvmlite opened again through its own path: the loader returns the library llvmlite
    loaded (same handle, same LLVM), with function objects of our own and no lock around them."""
    global _lib
    with _lib_lock:
        if _lib is None:
            path = resources.files("llvmlite.binding") / ffi.get_library_name()
            lib = ctypes.CDLL(str(path))
            for name, (args, res) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = args, res
            _lib = lib
        return _lib


def _message(lib: ctypes.CDLL, out: ctypes.c_char_p) -> str:
    text = (out.value or b"").decode("utf-8", "replace")
    if out.value is not None:
        lib.LLVMPY_DisposeString(out)
    return text


def emit_object(context, tm, ir_text: str, speed: int, vectorize: bool) -> bytes:
    """IR text -> object code: parsed into `context`, verified, LLVM's per-module default
    pipeline at `speed` (1-3) with the loop and SLP vectorizers `vectorize`, emitted by `tm`.
    `context` and `tm` (llvmlite refs) must be this thread's alone."""
    if not 1 <= speed <= 3:
        raise ValueError(f"speed level {speed}: the unlocked path runs LLVM's O1-O3 pipelines")
    lib = library()
    err = ctypes.c_char_p(None)
    mod = lib.LLVMPY_ParseAssembly(context, ir_text.encode(), ctypes.byref(err))
    if not mod:
        raise RuntimeError("LLVM IR parsing error\n" + _message(lib, err))
    try:
        if lib.LLVMPY_VerifyModule(mod, ctypes.byref(err)):
            raise RuntimeError(_message(lib, err))
        _message(lib, err)
        pto = lib.LLVMPY_CreatePipelineTuningOptions()
        try:
            lib.LLVMPY_PTOSetLoopVectorization(pto, vectorize)
            lib.LLVMPY_PTOSetSLPVectorization(pto, vectorize)
            pb = lib.LLVMPY_CreatePassBuilder(tm, pto)
            try:
                mpm = lib.LLVMPY_buildPerModuleDefaultPipeline(pb, speed)
                try:
                    lib.LLVMPY_RunNewModulePassManager(mpm, mod, pb)
                finally:
                    lib.LLVMPY_DisposeNewModulePassManger(mpm)
            finally:
                lib.LLVMPY_DisposePassBuilder(pb)
        finally:
            lib.LLVMPY_DisposePipelineTuningOptions(pto)
        buf = lib.LLVMPY_TargetMachineEmitToMemory(tm, mod, 1, ctypes.byref(err))
        if not buf:
            raise RuntimeError(_message(lib, err))
        try:
            return ctypes.string_at(lib.LLVMPY_GetBufferStart(buf), lib.LLVMPY_GetBufferSize(buf))
        finally:
            lib.LLVMPY_DisposeMemoryBuffer(buf)
    finally:
        lib.LLVMPY_DisposeModule(mod)
