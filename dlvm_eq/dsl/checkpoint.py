"""`dq.checkpoint(f)` (JAX's `jax.checkpoint`, alias `dq.remat`): under a gradient, `f`'s
intermediate values are recomputed in the backward pass instead of stored by the forward.

    step = dq.checkpoint(lambda h, x: dq.tanh(dq.tanh(h @ w1 + x) @ w2))
    h, _ = dq.scan(lambda h, x: (step(h, x), None), h0, xs)    # stores h per step, nothing else

`f` is traced as the body of a one-step `scan` with no carry that reads its arguments as
`with` operands (ir/control_flow.py). A scan's backward step recomputes whatever depends on
its `with` operands alone (ad/scan_residuals.py), so it stores nothing of f; and a scan whose
body holds another loop stores only its carries per step (ad/control_flow.py), so inside a
loop body a checkpointed call cuts the stacked residuals to the carries. Without a gradient
the one-step scan is inlined by the loop rules and runs as `f` does.
"""

from __future__ import annotations

import functools

from .context import current_trace
from .pytree import tree_map
from .tensor import Tensor


def checkpoint(fun=None, *, prevent_cse: bool = True, policy=None, static_argnums=()):
    """`fun` wrapped so that its gradient recomputes its intermediates (jax.checkpoint's
    signature; `prevent_cse` is accepted and always on; `static_argnums` is accepted: the
    arguments are read as they are, Python values included; `policy` must be None: every
    intermediate is recomputed). Usable as `@dq.checkpoint` or `dq.checkpoint(f)`."""
    if policy is not None:
        raise TypeError("checkpoint: policy is not supported (every intermediate is recomputed)")
    if fun is None:
        return functools.partial(
            checkpoint, prevent_cse=prevent_cse, policy=policy, static_argnums=static_argnums
        )

    @functools.wraps(fun)
    def remat(*args):
        if current_trace() is None:  # eager: no gradient is taken, nothing to store
            return fun(*args)
        from .control_flow import scan

        def body(carry, _):
            return carry, fun(*args)

        body.__name__ = f"{getattr(fun, '__name__', 'f')}_remat".replace("<lambda>", "lambda")
        _, ys = scan(body, (), None, length=1)
        return tree_map(lambda y: y.reshape(y.shape[1:]) if isinstance(y, Tensor) else y, ys)

    return remat


remat = checkpoint

__all__ = ["checkpoint", "remat"]
