"""Convolution and pooling steps of a kernel plan, as data: `WindowStep` names the op, its packed
attributes, the operand views and the output slot. execution/window_steps.py runs them (im2col
into GEMM, the CPU's generated convolution kernels, compiled pooling kernels).

    step = WindowStep("conv2d", pack("conv2d", attrs), (x_view, w_view), out_slot)
"""

from __future__ import annotations

from ...ir import window_ops
from ...records import dataclass


@dataclass
class WindowStep:
    """out = op(inputs) for a convolution or pooling op; `packed` is window_ops.pack(op, attrs)."""

    op: str
    packed: tuple[int, ...]
    inputs: tuple  # plan.View per operand
    out: int
    value: str = ""
    order: int = 0

    def text(self, slots) -> str:
        ins = ", ".join(v.text(slots) for v in self.inputs)
        attrs = window_ops.unpack(self.op, self.packed)
        detail = " ".join(f"{k}={list(v) if isinstance(v, tuple) else v}" for k, v in attrs.items())
        return f"{self.op}({ins}) {detail} -> {slots[self.out].label()}    [%{self.value}]"
