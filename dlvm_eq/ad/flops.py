"""Flops of an IR program, as the adjoint benchmark and tests count them (extraction itself
uses the target cost model of dlvm_eq.extract).

A matmul costs 2·m·k·n, an elementwise op (or cast) one flop per output element, a reduction
one per input element, layout ops (reshape, broadcast, transpose, concatenate, slice) nothing.

    >>> program_flops(fn)          # {"flops": 1.3e6, "ops": 12, "dot": 3, ...}
"""

from __future__ import annotations

from collections import Counter

from ..ir.module import Function
from ..ir.ops import DOT, ELEMENTWISE_KINDS, LAYOUT, LITERAL, OPS, REDUCE, TUPLE
from ..ir.types import TensorType

# layout ops move data but compute nothing (a transpose read by a matmul is a BLAS flag); so
# do slices, literals and tuples
_FREE = {n for n, s in OPS.items() if s.kind in (LAYOUT, LITERAL, TUPLE)} | {"slice"}


def op_flops(op: str, result: TensorType, operands: list[TensorType]) -> float:
    """Flops of one op from its result and operand types."""
    spec = OPS[op]
    if spec.kind == DOT:  # dot, batchMatmul
        a, b = operands
        k = a.shape[-1]
        return 2.0 * k * max(result.size, 1)
    if spec.kind == REDUCE:
        return float(operands[0].size)
    if op in _FREE:
        return 0.0
    if spec.kind in ELEMENTWISE_KINDS or op == "dataTypeCast":
        return float(result.size)
    return 0.0


def program_flops(fn: Function) -> dict:
    """Flops and op counts of an IR function: {"flops", "ops", "<op>": count, ...}."""
    counts: Counter = Counter()
    flops = 0.0
    for inst in fn.body:
        if inst.op in ("literal", "tuple", "extract"):
            continue
        counts[inst.op] += 1
        if isinstance(inst.result.type, TensorType):
            flops += op_flops(inst.op, inst.result.type, [o.type for o in inst.operands])
    return {"flops": flops, "ops": sum(counts.values()), **dict(sorted(counts.items()))}
