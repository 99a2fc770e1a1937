"""The op registry: every op of the IR, declared once, in the module of its family.

    elementwise.py  unary math, binary arithmetic, comparisons, logic, select, dataTypeCast
    bits.py         xor, shiftLeft, shiftRightLogical on i32 words (random numbers)
    products.py     dot, batchMatmul            layout.py     transpose, views, concatenate, slices
    reduction.py    reduce, cumsum              gather.py     take, scatterAdd
    window.py       convolution and pooling     structure.py  literal, tuple, extract, apply
    control.py      scan, while, cond, switch   stop_gradient.py
    attention.py    attention (issue 33)
    egraph_only.py  the rule files' constructors that are no IR op (Gemm, StridedSlice, helpers)

An op's `OpSpec` (ir/op_spec.py) holds its type rule, interpreter, DSL names, kernel formula,
sympy meaning, cost class and batching rule; the parser, printer, verifier, interpreter, DSL,
codegen, verify and the cost model read it here. Its rewrites and adjoints stay declarative, in
rules/schema.egg and rules/adjoint.egg; tests/test_registry.py checks the three agree. How to
add an op: README.md, "How to add an op".

    >>> REGISTRY["exp"].kernel, REGISTRY["exp"].cost
    ('exp', 'transcendental')
"""

from __future__ import annotations

from ..op_spec import OpSpec
from ..types import Type
from . import (
    attention,
    bits,
    control,
    elementwise,
    gather,
    layout,
    products,
    reduction,
    stop_gradient,
    structure,
    window,
)
from .egraph_only import EGRAPH_ONLY, READ_AS, STANDS_FOR, EggOnlySpec


def _ordered() -> list[OpSpec]:
    # the order of rules/fusion.egg's generated rows and of the kinds' op tuples: the one the
    # op table had before the registry split it into families
    literal, tuple_, extract = structure.literal_specs()
    return [
        *elementwise.specs(),
        *bits.specs(),
        products.dot_spec(),
        layout.transpose_spec(),
        reduction.reduce_spec(),
        *layout.view_specs(),
        elementwise.cast_spec(),
        layout.concatenate_spec(),
        layout.slice_spec(),
        literal,
        tuple_,
        extract,
        *window.specs(),
        structure.apply_spec(),
        products.batch_matmul_spec(),
        gather.take_spec(),
        gather.scatter_add_spec(),
        reduction.cumsum_spec(),
        layout.slice_scatter_spec(),
        *control.specs(),
        stop_gradient.spec(),
        attention.spec(),  # issue 33
        attention.backward_spec(),
    ]


def _build() -> dict[str, OpSpec]:
    table: dict[str, OpSpec] = {}
    for spec in _ordered():
        if spec.name in table:
            raise ValueError(f"op {spec.name!r} is registered twice")
        table[spec.name] = spec
    return table


REGISTRY: dict[str, OpSpec] = _build()


def stands_for(egg: str) -> OpSpec | None:
    """The op an e-graph-only constructor stands for (Gemm -> dot), None for the others."""
    op = STANDS_FOR.get(egg)
    return REGISTRY[op] if op else None


def read_types(spec: EggOnlySpec, attrs: dict, types: list[Type]) -> list[Type]:
    """The operand types a READ_AS constructor's op sees: each operand's type after the op it
    is read through (Gemm with flags (1, 0): a's transpose, b)."""
    if spec.role != READ_AS or spec.reads is None or spec.through is None:
        return list(types)
    through = REGISTRY[spec.through]
    return [through.result_type([t], {}) if r else t for t, r in zip(types, spec.reads(attrs))]


__all__ = ["EGRAPH_ONLY", "REGISTRY", "EggOnlySpec", "OpSpec", "read_types", "stands_for"]
