"""Convolution kernel specs as plain data: the window geometry of one conv2d, and the im2col
and col2im kernels built from it (cpu/im2col_ir.py, gpu/im2col_ptx.py; run by
runtime/conv_kernel.py).

    >>> g = geometry("f32", (128, 32, 14, 14), (3, 3), dict(stride=(1, 1), padding=(1, 1, 1, 1),
    ...              dilation=(1, 1), groups=1))
    >>> g.rows, g.cols                    # the column matrix of one image: (C*KH*KW, OH*OW)
    (288, 196)
    >>> Im2colSpec(g)                      # writes cols[n, r, p] at n*image_stride + r*row_stride + p

Column matrix: row r = (c, ki, kj) in C order (so a group's rows are contiguous), column
p = (oh, ow); element (n, r, p) = x[n, c, oh*sh - top + ki*dh, ow*sw - left + kj*dw], 0 outside
the input (padding is never materialized). The two strides of where the column matrix lies
are run-time arguments (the kernel's `dims`), so one kernel serves every layout and chunk:
(rows*cols, cols) is one (R, P) matrix per image, (cols, n_images*cols) one (R, n*P) matrix.
Everything here is immutable and hashable (a cache key, through spec_text).
"""

from __future__ import annotations

from ...ir.window_ops import out_size
from ...records import dataclass
from .spec import DTYPES, KernelError


@dataclass(frozen=True)
class ConvGeometry:
    """A convolution's input, kernel window, stride, padding, dilation and output size."""

    dtype: str  # "f32" or "f64"
    channels: int  # C (all groups)
    height: int
    width: int
    kernel: tuple[int, int]  # KH, KW
    stride: tuple[int, int]
    padding: tuple[int, int, int, int]  # top, bottom, left, right
    dilation: tuple[int, int]
    out_hw: tuple[int, int]  # OH, OW

    def __post_init__(self):
        if self.dtype not in ("f32", "f64"):
            raise KernelError(f"convolution kernels take f32 or f64, got {self.dtype}")
        if min(self.out_hw) < 1 or min(self.channels, self.height, self.width) < 1:
            raise KernelError(f"empty convolution geometry {self}")

    @property
    def taps(self) -> int:
        return self.kernel[0] * self.kernel[1]

    @property
    def rows(self) -> int:
        """Rows of one image's column matrix: C*KH*KW."""
        return self.channels * self.taps

    @property
    def cols(self) -> int:
        """Columns of one image's column matrix: OH*OW."""
        return self.out_hw[0] * self.out_hw[1]

    @property
    def plane(self) -> int:
        return self.height * self.width

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype].itemsize


@dataclass(frozen=True)
class Im2colSpec:
    """x (n, C, H, W) -> column matrix; a call covers items [lo, hi), item r*n_images + n."""

    geometry: ConvGeometry
    name: str = "im2col"


@dataclass(frozen=True)
class Col2imSpec:
    """Column matrix -> dx (n, C, H, W), summing every window element onto its input position;
    a call covers whole planes [lo, hi), item c*n_images + n, so threads never write the same element."""

    geometry: ConvGeometry
    name: str = "col2im"


def out_hw(hw, kernel, stride, padding, dilation) -> tuple[int, int]:
    return (
        out_size(hw[0], kernel[0], stride[0], padding[0], padding[1], dilation[0]),
        out_size(hw[1], kernel[1], stride[1], padding[2], padding[3], dilation[1]),
    )


def geometry(dtype: str, x_shape, kernel, attrs: dict) -> ConvGeometry:
    """The geometry of a convolution of an (N, C, H, W) input by KH x KW windows."""
    _, c, h, w = x_shape
    stride, padding, dilation = (
        tuple(attrs["stride"]),
        tuple(attrs["padding"]),
        tuple(attrs["dilation"]),
    )
    return ConvGeometry(
        dtype,
        int(c),
        int(h),
        int(w),
        tuple(kernel),
        stride,
        padding,
        dilation,
        out_hw((h, w), kernel, stride, padding, dilation),
    )
