"""A kernel's description as data: its inputs (dtype, strides), its iteration shape and its
output expressions (KernelSpec), or a reduction (ReduceSpec). The expression DAG and its dtype
checking are spec.py; the code generators read these.

    KernelSpec("add", (4, 3), (KernelInput("f32"), KernelInput("f32")), (binary("add", Load(0), Load(1)),))
"""

from __future__ import annotations

import math

from ...records import dataclass
from .spec import (
    REDUCE_INIT,
    REDUCE_OPS,
    Expr,
    KernelError,
    as_expr,
    dtype_name,
    dtype_of,
    op_name,
    resolve,
)


def c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a C-contiguous array: c_strides((2, 3)) == (3, 1)."""
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return tuple(reversed(out))


@dataclass(frozen=True)
class KernelInput:
    """One input array: its dtype, and its element strides along each dim of the iteration shape
    (0 = broadcast along that dim). strides=None: the input is C-contiguous with the iteration
    shape (the fast path). The runtime passes C-contiguous numpy arrays; strides index them."""

    dtype: str
    strides: tuple[int, ...] | None = None

    def __post_init__(self):
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        if self.strides is not None:
            object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))

    @staticmethod
    def broadcast(dtype, in_shape, out_shape) -> KernelInput:
        """An input of shape `in_shape` broadcast (numpy rules) to `out_shape`.

        >>> KernelInput.broadcast("f32", (3,), (2, 3)).strides
        (0, 1)
        """
        in_shape, out_shape = tuple(in_shape), tuple(out_shape)
        if in_shape == out_shape:
            return KernelInput(dtype)
        if len(in_shape) > len(out_shape):
            raise KernelError(f"cannot broadcast shape {in_shape} to {out_shape}")
        padded = (1,) * (len(out_shape) - len(in_shape)) + in_shape
        strides = []
        for d_in, d_out, s in zip(padded, out_shape, c_strides(padded)):
            if d_in not in (1, d_out):
                raise KernelError(f"cannot broadcast shape {in_shape} to {out_shape}")
            strides.append(s if d_in == d_out and d_out != 1 else 0)
        return KernelInput(dtype, tuple(strides))

    def resolved_strides(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return c_strides(shape) if self.strides is None else self.strides

    def min_size(self, shape: tuple[int, ...]) -> int:
        """Elements the input array must hold for these strides (0 if the shape is empty)."""
        if any(d == 0 for d in shape):
            return 0
        return 1 + sum((d - 1) * abs(s) for d, s in zip(shape, self.resolved_strides(shape)))


def check_inputs(name: str, shape, inputs):
    """A kernel's shape and its inputs' strides (KernelSpec, ReduceSpec, map_reduce.MapReduceSpec)."""
    if any(d < 0 for d in shape):
        raise KernelError(f"{name}: negative dimension in shape {shape}")
    for i, inp in enumerate(inputs):
        if inp.strides is not None and len(inp.strides) != len(shape):
            raise KernelError(
                f"{name}: input {i} has {len(inp.strides)} strides for a "
                f"rank-{len(shape)} shape {shape}"
            )
        if inp.strides is not None and any(s < 0 for s in inp.strides):
            raise KernelError(f"{name}: input {i} has a negative stride {inp.strides}")


@dataclass(frozen=True)
class KernelSpec:
    """An elementwise kernel: outputs[j] (an Expr) evaluated at every element of `shape`;
    every output is a fresh C-contiguous array of that shape."""

    name: str
    shape: tuple[int, ...]
    inputs: tuple[KernelInput, ...]
    outputs: tuple[Expr, ...]

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        check_inputs(self.name, self.shape, self.inputs)
        if not self.outputs:
            raise KernelError(f"{self.name}: a kernel needs at least one output")
        memo: dict = {}
        outs = tuple(resolve(as_expr(o), self.input_dtypes, memo) for o in self.outputs)
        object.__setattr__(self, "outputs", outs)

    @property
    def input_dtypes(self) -> tuple[str, ...]:
        return tuple(i.dtype for i in self.inputs)

    @property
    def output_dtypes(self) -> tuple[str, ...]:
        return tuple(dtype_of(o, self.input_dtypes) for o in self.outputs)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ReduceSpec:
    """A reduction: `body` evaluated over the iteration `shape`, folded with `op` (add mul max
    min; DLVM's 'multiply' accepted) starting from `init` (default: the op's identity) along
    `axes`. The output is C-contiguous with the non-reduced axes, in order (`out_shape`)."""

    name: str
    shape: tuple[int, ...]
    inputs: tuple[KernelInput, ...]
    body: Expr
    op: str
    axes: tuple[int, ...]
    init: float | int | None = None

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "op", op_name(self.op))
        axes = tuple(sorted(int(a) + len(self.shape) if a < 0 else int(a) for a in self.axes))
        object.__setattr__(self, "axes", axes)
        check_inputs(self.name, self.shape, self.inputs)
        if self.op not in REDUCE_OPS:
            raise KernelError(
                f"{self.name}: unknown reduction {self.op!r}; expected one of "
                + ", ".join(REDUCE_OPS)
            )
        if len(set(axes)) != len(axes) or any(not 0 <= a < len(self.shape) for a in axes):
            raise KernelError(
                f"{self.name}: axes {self.axes} are not distinct axes of shape {self.shape}"
            )
        body = resolve(as_expr(self.body), self.input_dtypes)
        object.__setattr__(self, "body", body)
        dt = dtype_of(body, self.input_dtypes)
        if dt == "bool":
            raise KernelError(f"{self.name}: cannot reduce bool values; cast them first")
        object.__setattr__(
            self, "init", self._typed(REDUCE_INIT[self.op] if self.init is None else self.init)
        )

    def _typed(self, v):
        if self.dtype == "i32":
            return int({math.inf: 2**31 - 1, -math.inf: -(2**31)}.get(v, v))
        return float(v)

    @property
    def input_dtypes(self) -> tuple[str, ...]:
        return tuple(i.dtype for i in self.inputs)

    @property
    def dtype(self) -> str:
        return dtype_of(self.body, self.input_dtypes)

    @property
    def identity(self) -> float | int:
        """Where the generated code starts each fold; a different `init` is applied once
        afterwards, so that a reduction split into partial results stays exact."""
        return self._typed(REDUCE_INIT[self.op])

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(d for i, d in enumerate(self.shape) if i not in self.axes)


Spec = KernelSpec | ReduceSpec
