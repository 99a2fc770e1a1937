"""`cumsum` as a plan step: a compiled kernel on the CPU (execution/index_steps.py), CuPy's
cumsum on the GPU (here); `reverse` runs it over the flipped axis into a flipped view of the
output (no copies).

    out[..., i, ...] = sum of x[..., j, ...] for j <= i   (j >= i with reverse)
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan import View


@dataclass
class ScanStep:
    """out = cumsum(src) along `axis`, reversed or not."""

    src: View
    axis: int
    reverse: bool
    out: int
    value: str = ""
    order: int = 0

    def text(self, slots) -> str:
        how = " reverse" if self.reverse else ""
        return f"cumsum{how}: {self.src.text(slots)} along {self.axis} -> {slots[self.out].label()}    [%{self.value}]"


def scan_run(step: ScanStep, xp, view_fn):
    """env -> None running the step with array module xp; view_fn(chain, xp) as the executor's."""
    f = view_fn(step.src.chain, xp) or (lambda a: a)
    s, o, k = step.src.slot, step.out, step.axis
    if not step.reverse:
        return lambda env: xp.cumsum(f(env[s]), axis=k, dtype=env[o].dtype, out=env[o])
    return lambda env: xp.cumsum(
        xp.flip(f(env[s]), k), axis=k, dtype=env[o].dtype, out=xp.flip(env[o], k)
    )
