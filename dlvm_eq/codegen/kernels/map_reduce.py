"""Map-plus-reduction specs: one pass over an iteration space that writes a map's outputs and
folds one or more reductions, each over its own axes (any axes: leading ones too), as plain data.

A conv's bias gradient with the ReLU-adjoint select that produces it, in one pass:

    >>> g, x = Load(0), Load(1)
    >>> dz = Select(binary("greaterThan", x, 0.0), g, Const(0.0))
    >>> spec = MapReduceSpec("relu_bias", (8, 4, 5, 5), [KernelInput("f32")] * 2,
    ...                      [dz], [(dz, "add", (0, 2, 3))])
    >>> spec.out_shape(0)
    (4,)

Batch norm's two moments over (N, H, W) are a spec with no map output and two reductions.
Reductions start from their op's identity (an `init` of another value stays a reduction of its
own). The CPU builds it with `cpu/map_reduce_ir.py` and runs it with
`runtime/map_reduce_kernel.py`; `evaluate_map_reduce` is its numpy oracle.
"""

from __future__ import annotations

import math

import numpy as np

from ...records import dataclass
from .kernel_spec import KernelInput, KernelSpec, c_strides, check_inputs
from .layout import LoopLayout, elementwise_layout
from .spec import REDUCE_OPS, Expr, KernelError, as_expr, dtype_of, op_name, resolve


@dataclass(frozen=True)
class MapReduceSpec:
    """A kernel that computes map outputs and reductions over one iteration space in one pass."""

    name: str
    shape: tuple[int, ...]
    inputs: tuple[KernelInput, ...]
    outputs: tuple[Expr, ...]  # map outputs: C-contiguous arrays of `shape`
    reductions: tuple[tuple, ...]  # (body, op, axes), each folded from the op's identity

    def __post_init__(self):
        shape = tuple(int(d) for d in self.shape)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "inputs", tuple(self.inputs))
        check_inputs(self.name, shape, self.inputs)
        if not self.reductions:
            raise KernelError(f"{self.name}: a map-reduce kernel needs at least one reduction")
        memo: dict = {}
        dts = self.input_dtypes
        outs = tuple(resolve(as_expr(o), dts, memo) for o in self.outputs)
        object.__setattr__(self, "outputs", outs)
        reds = []
        for body, op, given in self.reductions:
            axes = tuple(sorted(int(a) + len(shape) if a < 0 else int(a) for a in given))
            if len(set(axes)) != len(axes) or any(not 0 <= a < len(shape) for a in axes):
                raise KernelError(f"{self.name}: axes {given} are not distinct axes of {shape}")
            op = op_name(op)
            if op not in REDUCE_OPS:
                raise KernelError(f"{self.name}: unknown reduction {op!r}")
            body = resolve(as_expr(body), dts, memo)
            if dtype_of(body, dts) == "bool":
                raise KernelError(f"{self.name}: cannot reduce bool values; cast them first")
            reds.append((body, op, axes))
        object.__setattr__(self, "reductions", tuple(reds))

    @property
    def input_dtypes(self) -> tuple[str, ...]:
        return tuple(i.dtype for i in self.inputs)

    @property
    def output_dtypes(self) -> tuple[str, ...]:
        return tuple(dtype_of(o, self.input_dtypes) for o in self.outputs)

    @property
    def reduction_dtypes(self) -> tuple[str, ...]:
        return tuple(dtype_of(b, self.input_dtypes) for b, _, _ in self.reductions)

    def out_shape(self, j: int) -> tuple[int, ...]:
        """Reduction j's shape: its kept axes, in order."""
        axes = self.reductions[j][2]
        return tuple(d for i, d in enumerate(self.shape) if i not in axes)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def reduction_strides(self, j: int) -> tuple[int, ...]:
        """Element strides of reduction j's output along the iteration shape (0 on its reduced
        axes): the loops read and update it as one more input stream."""
        axes = self.reductions[j][2]
        kept = iter(c_strides(self.out_shape(j)))
        return tuple(0 if i in axes else next(kept) for i in range(len(self.shape)))


def evaluate_map_reduce(spec: MapReduceSpec, arrays, compute: str | None = None) -> list:
    """The spec's map outputs, then its reductions, by numpy (reference.evaluate for the
    expressions, numpy's reduce for the folds); float ops in `compute` if given."""
    from .reference import REDUCE_NP, evaluate
    from .rows import reduce_identity

    roots = list(spec.outputs) + [b for b, _, _ in spec.reductions]
    vals = evaluate(KernelSpec(spec.name, spec.shape, spec.inputs, roots), arrays, compute)
    outs = vals[: len(spec.outputs)]
    with np.errstate(all="ignore"):
        for v, (_, op, axes), dt in zip(
            vals[len(spec.outputs) :], spec.reductions, spec.reduction_dtypes
        ):
            folded = REDUCE_NP[op].reduce(v, axis=axes, initial=reduce_identity(op, dt))
            kept = tuple(d for i, d in enumerate(spec.shape) if i not in axes)
            outs.append(np.asarray(folded, v.dtype).reshape(kept))
    return outs


def map_reduce_layout(spec: MapReduceSpec) -> LoopLayout:
    """The loop layout: the inputs' streams, then one index stream per reduction."""
    streams = [i.strides for i in spec.inputs]
    streams += [spec.reduction_strides(j) for j in range(len(spec.reductions))]
    return elementwise_layout(spec.shape, streams)


def map_reduce_dims(spec: MapReduceSpec):
    """The kernel's run-time dims array (the layout's, then each reduction's size)."""
    lay = map_reduce_layout(spec)
    sizes = [max(1, math.prod(spec.out_shape(j))) for j in range(len(spec.reductions))]
    return np.concatenate([lay.dims_array(), sizes]).astype(np.int64)


__all__ = ["MapReduceSpec", "evaluate_map_reduce", "map_reduce_dims", "map_reduce_layout"]
