"""A sympy step under a hard time limit: computed in a forked child that is killed at the limit.

`identity.time_limit` interrupts a step with SIGALRM between Python bytecodes, which stops
almost every step in time. sympy's heuristic gcd (in `cancel`, which `simplify` calls) does not
stop: on polynomials in many symbols it multiplies integers that grow without bound, and one such
multiplication is a single C call that no signal interrupts (a CI worker sat 20 minutes in one,
verifying the attention op's adjoint). identity.ZeroProver runs its gcd-based steps here when
the expression has many symbols.

    >>> decided_in_child(sp.expand, x * (y + 1) - x * y - x, seconds=4.0)   # True, False or None
"""

from __future__ import annotations

import os
import select
import signal

# more free symbols than this: the gcd-based steps run in a child (below it the heuristic gcd's
# integers stay small, and the in-process time limit holds)
MANY_SYMBOLS = 8


def can_fork() -> bool:
    return hasattr(os, "fork")


def decided_in_child(step, expr, seconds: float) -> bool | None:
    """Whether step(expr) == 0, computed in a forked child: True or False (False also where the
    step raised), or None where the child ran past `seconds` and was killed."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one byte back, then leave without the parent's exit handlers
        code = b"e"
        try:
            os.close(r)
            code = b"1" if step(expr) == 0 else b"0"
        except BaseException:
            pass
        finally:
            os.write(w, code)
            os._exit(0)
    os.close(w)
    got = b""
    try:
        ready, _, _ = select.select([r], [], [], max(seconds, 0.0))
        if ready:
            got = os.read(r, 1)
    finally:
        os.close(r)
        if not got:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return None if not got else got == b"1"
