"""Pooling kernels as plain data: `PoolSpec` says what one (n, c) plane of a pooling op
computes; the CPU builds it with `cpu/pool_ir.py` (planes split over threads, runtime/pool_kernel.py)
and the GPU with `gpu/pool_ptx.py`. Semantics are those of `ir/window_ops.py`: max pools pad
with -inf and pick each window's first maximum in row-major tap order (a NaN counts as the
maximum, the first one wins, as numpy's argmax), avg pools divide by the whole window
(count_include_pad).

    >>> s = pool_spec("maxPool2d", dict(kernel=(2, 2), stride=(2, 2), padding=(0, 0, 0, 0)), (28, 28), "f32")
    >>> s.out_hw, s.overlapping
    ((14, 14), False)

Operands per op (each an (N, C, ., .) C-contiguous array): maxPool2d (x) -> y,
maxPool2dGather (x, g) -> y, maxPool2dBackward (x, dy) -> dx, avgPool2d (x) -> y,
avgPool2dBackward (dy) -> dx; x, g, dx are (H, W) planes, y, dy (OH, OW) planes.
The plane count is not part of the spec: one kernel serves every batch size.
"""

from __future__ import annotations

from ...ir.window_ops import POOL_OPS, out_size
from ...records import dataclass
from .spec import KernelError

MAX_OW = 1 << 14  # output row length kept on the stack (a row of offsets and values)
MAX_PLANE = 1 << 30  # plane offsets are i32


@dataclass(frozen=True)
class PoolSpec:
    """A pooling kernel: op, dtype, input plane, window, stride and padding."""

    op: str
    dtype: str  # "f32" or "f64"
    hw: tuple[int, int]  # input plane (H, W)
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int, int, int]  # top, bottom, left, right

    @property
    def out_hw(self) -> tuple[int, int]:
        (h, w), (kh, kw), (sh, sw), (t, b, l, r) = self.hw, self.kernel, self.stride, self.padding
        return out_size(h, kh, sh, t, b), out_size(w, kw, sw, l, r)

    @property
    def overlapping(self) -> bool:
        """Whether an input position can lie in two windows (then backward ops accumulate)."""
        return self.stride[0] < self.kernel[0] or self.stride[1] < self.kernel[1]

    @property
    def columns_covered(self) -> bool:
        """Whether every input column lies in some window (else a backward row is zeroed first)."""
        return (
            self.stride[1] <= self.kernel[1]
            and self.out_hw[1] * self.stride[1] - self.padding[2] >= self.hw[1]
        )

    @property
    def reads_max(self) -> bool:
        return self.op.startswith("max")

    @property
    def writes_input_plane(self) -> bool:
        """Backward ops write (H, W) planes; forward ops and the gather (OH, OW) planes."""
        return self.op in ("maxPool2dBackward", "avgPool2dBackward")

    def plane_sizes(self) -> tuple[int, list[int]]:
        """(elements per output plane, elements per plane of each operand)."""
        hw, ohw = self.hw[0] * self.hw[1], self.out_hw[0] * self.out_hw[1]
        ins = {
            "maxPool2d": [hw],
            "avgPool2d": [hw],
            "maxPool2dGather": [hw, hw],
            "maxPool2dBackward": [hw, ohw],
            "avgPool2dBackward": [ohw],
        }[self.op]
        return (hw if self.writes_input_plane else ohw), ins


def pool_spec(op: str, attrs: dict, hw, dtype: str) -> PoolSpec:
    """The spec of pooling op `op` (window_ops attributes) over (H, W) input planes.
    KernelError where no kernel is built (the caller runs window_ops' array algorithm)."""
    if op not in POOL_OPS:
        raise KernelError(f"{op} is not a pooling op")
    if dtype not in ("f32", "f64"):
        raise KernelError(f"{op}: pooling kernels take f32 or f64, not {dtype}")
    spec = PoolSpec(
        op,
        dtype,
        tuple(int(v) for v in hw),
        tuple(attrs["kernel"]),
        tuple(attrs["stride"]),
        tuple(attrs["padding"]),
    )
    oh, ow = spec.out_hw
    if oh < 1 or ow < 1 or min(spec.hw) < 1:
        raise KernelError(f"{op}: empty planes (input {spec.hw}, output {(oh, ow)})")
    if ow > MAX_OW or spec.hw[0] * spec.hw[1] >= MAX_PLANE or oh * ow >= MAX_PLANE:
        raise KernelError(
            f"{op}: planes too large for the pooling kernel ({spec.hw} -> {(oh, ow)})"
        )
    return spec


__all__ = ["MAX_OW", "PoolSpec", "pool_spec"]
