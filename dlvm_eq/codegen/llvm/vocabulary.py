"""The lowering's op vocabulary against the op table (ir/ops.py, the one table of the op set):
every elementwise op of the table has a lowering for every dtype the kernels accept, and no
lowering names an op the table lacks. The lowerings are the registry's kernel formulas
(`OpSpec.scalar`); which dtypes a binary one handles is found by lowering it.

    >>> lowering_gaps()          # what is missing or extra; tests/test_lowering_vocabulary.py
    []
"""

from __future__ import annotations

from ...ir.ops import BINARY, COMPARE, LOGIC, OPS, UNARY
from ..kernels.spec import BINARY_OPS, FLOATS, UNARY_OPS, op_name
from .lower_expr import UNARY_LOWER, binary_lowered
from .polymath import MATH


def _table_ops() -> tuple[set[str], set[str]]:
    """(unary, binary) kernel names of the table's elementwise ops (select is a node of its own)."""
    unary, binary = set(), set()
    for name, spec in OPS.items():
        if spec.kind in (UNARY, BINARY, COMPARE, LOGIC):
            (unary if spec.arity == 1 else binary).add(op_name(name))
    return unary, binary


def _lowered_for(dtype: str) -> frozenset:
    return binary_lowered()["float" if dtype in FLOATS else dtype]


def lowering_gaps() -> list[str]:
    """Disagreements between the op table, the kernel op sets (kernels/spec.py) and the
    lowering (llvm/lower_expr.py), one line each; empty when they agree."""
    unary, binary = _table_ops()
    lowered_binary = set().union(*binary_lowered().values())
    gaps = [
        f"unary op {n!r} of the op table has no lowering" for n in sorted(unary - set(UNARY_LOWER))
    ]
    gaps += [
        f"binary op {n!r} of the op table has no lowering" for n in sorted(binary - lowered_binary)
    ]
    gaps += [
        f"the lowering names unary op {n!r}, which the op table lacks"
        for n in sorted(set(UNARY_LOWER) - unary)
    ]
    gaps += [
        f"the lowering names binary op {n!r}, which the op table lacks"
        for n in sorted(lowered_binary - binary)
    ]
    gaps += [
        f"the kernels accept op {n!r}, which the op table lacks"
        for n in sorted((set(UNARY_OPS) - unary) | (set(BINARY_OPS) - binary))
    ]
    gaps += [
        f"op {n!r} of the op table is not a kernel op"
        for n in sorted((unary - set(UNARY_OPS)) | (binary - set(BINARY_OPS)))
    ]
    gaps += [
        f"unary op {n!r} is accepted on i32 but lowered for floats only"
        for n, dtypes in sorted(UNARY_OPS.items())
        if "i32" in dtypes and n in MATH
    ]
    for n, (dtypes, _) in sorted(BINARY_OPS.items()):
        gaps += [
            f"binary op {n!r} is accepted on {dt} but not lowered for it"
            for dt in dtypes
            if n not in _lowered_for(dt)
        ]
    return gaps


__all__ = ["lowering_gaps"]
