"""`Tensor`: a symbolic value of the function being traced (an IR `Value` plus its trace).

Operators build IR through the DSL ops, so `x @ w + b` emits `dot` then `add`; `x[:, 2:6]`
emits `slice` (numpy's basic indexing, dsl/indexing.py):

    def f(x, w, b):          # traced with x: <4 x 3 x f32>, w: <3 x 2 x f32>, b: <2 x f32>
        return x @ w + b     # a Tensor of type <4 x 2 x f32>
"""

from __future__ import annotations

import numpy as np

from ..ir.module import Value
from .context import tracing_error


class Tensor:
    __slots__ = ("value", "trace")
    __array_ufunc__ = None  # numpy defers to our reflected operators: ndarray + Tensor -> Tensor

    def __init__(self, value: Value, trace):
        self.value, self.trace = value, trace

    # ------------------------------------------------------------ metadata
    @property
    def type(self):
        return self.value.type

    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.tensor_type.shape

    @property
    def dtype(self) -> np.dtype:
        return self.value.tensor_type.dtype.numpy

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return self.value.tensor_type.size

    def __len__(self) -> int:
        if not self.shape:
            raise tracing_error("len() of a scalar tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"Tensor({self.value!r})"

    __hash__ = object.__hash__  # __eq__ builds a comparison, so hashing is by identity

    # ------------------------------------------------------------ arithmetic
    def __add__(self, o):
        return _ops.add(self, o)

    def __radd__(self, o):
        return _ops.add(o, self)

    def __sub__(self, o):
        return _ops.subtract(self, o)

    def __rsub__(self, o):
        return _ops.subtract(o, self)

    def __mul__(self, o):
        return _ops.multiply(self, o)

    def __rmul__(self, o):
        return _ops.multiply(o, self)

    def __truediv__(self, o):
        return _ops.divide(self, o)

    def __rtruediv__(self, o):
        return _ops.divide(o, self)

    def __pow__(self, o):
        return _ops.power(self, o)

    def __rpow__(self, o):
        return _ops.power(o, self)

    def __matmul__(self, o):
        return _linalg.matmul(self, o)

    def __rmatmul__(self, o):
        return _linalg.matmul(o, self)

    def __neg__(self):
        return _ops.negative(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return _ops.abs(self)

    # ------------------------------------------------------------ comparisons -> bool tensors
    def __lt__(self, o):
        return _ops.less(self, o)

    def __le__(self, o):
        return _ops.less_equal(self, o)

    def __gt__(self, o):
        return _ops.greater(self, o)

    def __ge__(self, o):
        return _ops.greater_equal(self, o)

    def __eq__(self, o):
        return _ops.equal(self, o)

    def __ne__(self, o):
        return _ops.not_equal(self, o)

    def __and__(self, o):
        return _ops.logical_and(self, o)

    def __rand__(self, o):
        return _ops.logical_and(o, self)

    def __or__(self, o):
        return _ops.logical_or(self, o)

    def __ror__(self, o):
        return _ops.logical_or(o, self)

    def __invert__(self):
        return _ops.logical_not(self)

    # ------------------------------------------------------------ numpy-like methods
    @property
    def T(self) -> Tensor:
        return self if self.ndim < 2 else _ops.transpose(self)

    def transpose(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return _ops.transpose(self, axes or None)

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return _ops.reshape(self, shape)

    def astype(self, dtype) -> Tensor:
        return _ops.astype(self, dtype)

    def sum(self, axis=None, keepdims=False):
        return _ops.sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        return _ops.mean(self, axis, keepdims)

    def max(self, axis=None, keepdims=False):
        return _ops.max(self, axis, keepdims)

    def min(self, axis=None, keepdims=False):
        return _ops.min(self, axis, keepdims)

    # ------------------------------------------------------------ things a trace cannot know
    def _concrete(self, what: str):
        raise tracing_error(
            f"{what} needs the concrete value of traced {self.value!r}, which is unknown while "
            "tracing; use dq.where for data-dependent choices, and Python control flow only on "
            "shapes"
        )

    def __bool__(self):
        self._concrete("a Python truth test (if/while/and/or)")

    def __float__(self):
        self._concrete("float()")

    def __int__(self):
        self._concrete("int()")

    def __index__(self):
        self._concrete("use as an index")

    def __array__(self, *args, **kwargs):
        self._concrete("conversion to a numpy array")

    # ------------------------------------------------------------ indexing (dsl/indexing.py)
    def __getitem__(self, index):
        return _indexing.getitem(self, index)

    def __iter__(self):  # the rows, as numpy iterates: one slice op each (the loop unrolls)
        if not self.shape:
            raise tracing_error("iteration over a scalar tensor")
        return (self[i] for i in range(self.shape[0]))


from . import indexing as _indexing  # noqa: E402
from . import linalg as _linalg  # noqa: E402
from . import ops as _ops  # noqa: E402  (the operators are the DSL ops; imported last: cycle)
