"""`take`, `scatterAdd` and `sliceScatter` as plan steps, as data; they run on compiled
kernels on the CPU (execution/index_steps.py) and as CuPy calls on the GPU
(execution/gather_steps.py).

    take:        out = x[..., ids, ...]                       (along `axis`)
    scatterAdd:  out = zeros; out[..., ids[j], ...] += g[..., j, ...]   (repeated ids accumulate)
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan import View


@dataclass
class IndexStep:
    """out = take(src, ids) or scatterAdd(src, ids) along `axis`."""

    op: str  # "take" or "scatterAdd"
    src: View  # x (take) or g (scatterAdd)
    ids: View  # the i32 index vector
    axis: int
    size: int  # the indexed axis' length: x's (take) or the result's (scatterAdd)
    out: int
    value: str = ""
    order: int = 0

    def text(self, slots) -> str:
        return (
            f"{self.op}: {self.src.text(slots)} at {self.ids.text(slots)} along {self.axis} "
            f"-> {slots[self.out].label()}    [%{self.value}]"
        )


@dataclass
class SliceScatterStep:
    """out = zeros; out[..., lo::step, ...] = src along `axis` (a strided slice's adjoint)."""

    src: View
    axis: int
    lo: int
    step: int
    out: int
    value: str = ""
    order: int = 0

    def text(self, slots) -> str:
        return (
            f"sliceScatter: {self.src.text(slots)} at {self.lo}::{self.step} along {self.axis} "
            f"-> {slots[self.out].label()}    [%{self.value}]"
        )
