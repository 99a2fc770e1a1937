"""IR types: scalars `f32 f64 i32 bool`, tensors `<2 x 3 x f32>`, tuples `(T, T)` for results.

A scalar is a TensorType with shape (); `<2 x 3 x f32>` is TensorType((2, 3), F32).
"""

from __future__ import annotations

import builtins
import math
from enum import Enum

import numpy as np

from ..records import dataclass


class DType(Enum):
    f32 = "f32"
    f64 = "f64"
    i32 = "i32"
    bool = "bool"

    @property
    def numpy(self) -> np.dtype:
        return _NUMPY[self]

    @property
    def is_float(self) -> builtins.bool:  # `bool` in this class is DType.bool
        return self in (DType.f32, DType.f64)

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    @staticmethod
    def from_numpy(dt) -> DType:
        dt = np.dtype(dt)
        for k, v in _NUMPY.items():
            if v == dt:
                return k
        if dt.kind == "i" or dt.kind == "u":
            return DType.i32
        if dt.kind == "f":
            return DType.f64 if dt.itemsize > 4 else DType.f32
        raise ValueError(f"no IR dtype for numpy dtype {dt}")

    def __str__(self) -> str:
        return self.value


_NUMPY: dict[DType, np.dtype] = {
    DType.f32: np.dtype(np.float32),
    DType.f64: np.dtype(np.float64),
    DType.i32: np.dtype(np.int32),
    DType.bool: np.dtype(np.bool_),
}

F32, F64, I32, BOOL = DType.f32, DType.f64, DType.i32, DType.bool


@dataclass(frozen=True)
class TensorType:
    """A tensor's type: its shape and element dtype, printed `<4 x 5 x f32>`."""

    shape: tuple[int, ...]
    dtype: DType

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)  # exact (np.prod in int64 wraps around silently)

    @property
    def is_scalar(self) -> bool:
        return self.shape == ()

    def with_shape(self, shape) -> TensorType:
        return TensorType(tuple(shape), self.dtype)

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(self.shape, dtype)

    def __str__(self) -> str:
        if not self.shape:
            return str(self.dtype)
        return "<" + " x ".join(str(d) for d in self.shape) + f" x {self.dtype}>"


@dataclass(frozen=True)
class TupleType:
    """A tuple's type: the tensor types of its elements, printed `(<4 x f32>, <f32>)`."""

    elements: tuple[TensorType, ...]

    def __str__(self) -> str:
        return "(" + ", ".join(str(e) for e in self.elements) + ")"


Type = TensorType | TupleType

# No array comes near this; past it, byte offsets overflow int64 in numpy and in the kernels.
MAX_BYTES = 2**62


def size_problem(shape, itemsize: int) -> str | None:
    """Why an array of `shape` and `itemsize` cannot exist (too many bytes), or None.

    >>> size_problem((2147483647, 2147483647, 2147483647), 4)
    '9903520300447984150353281023 elements of 4 bytes: more than 2^62 bytes'
    """
    n = math.prod(shape)
    if n * itemsize > MAX_BYTES:
        return (
            f"{n} elements{f' of {itemsize} bytes' if itemsize > 1 else ''}: more than 2^62 bytes"
        )
    return None


def scalar(dtype: DType) -> TensorType:
    return TensorType((), dtype)


def tensor(*shape_and_dtype) -> TensorType:
    """tensor(2, 3, F32) -> <2 x 3 x f32>."""
    *shape, dtype = shape_and_dtype
    return TensorType(tuple(int(d) for d in shape), dtype)


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """numpy's broadcasting rule; None when the shapes do not broadcast."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(rank):
        dims = {s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0}
        dims.discard(1)
        if len(dims) > 1:
            return None
        out.append(dims.pop() if dims else 1)
    return tuple(out)
