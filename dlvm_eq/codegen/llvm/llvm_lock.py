"""The one lock around llvmlite.binding's global LLVM context.

Parsing IR, running pass pipelines and emitting code all use LLVM's process-wide context,
which is not thread-safe: the CPU back end (llvm_cpu), the NVPTX back end (llvm_ptx) and the
JIT engine's set-up (runtime/jit.py) take this lock, so that two Python threads compiling at
once (a CPU kernel and a GPU kernel, say) never enter LLVM together.

    >>> with LLVM_LOCK:
    ...     mod = llvm.parse_assembly(text)

Module state: LLVM_LOCK, created at import, never replaced.
"""

from __future__ import annotations

import threading

LLVM_LOCK = threading.RLock()  # re-entrant: target_machine() is called with it held
