"""vmap as an IR -> IR transform: each instruction is rewritten by its op's batching rule (the
registry's `batch`, ir/registry/), so a batched program is one program of batched ops, never a
loop over examples. Values carry the batch on axis 0 or not at all; an instruction none of
whose operands is batched is copied as it is.

    g = batch_function(f, batched=[True, False], size=8)
    # f: (<3 x f32>, <3 x 4 x f32>) -> <4 x f32>   =>   g: (<8 x 3 x f32>, <3 x 4 x f32>) -> <8 x 4 x f32>
"""

from __future__ import annotations

import numpy as np

from ..errors import IRError
from .control_flow import elements
from .inline import flatten
from .module import Const, Function, FunctionBuilder, Module, Value
from .ops import OPS
from .types import DType, TensorType, TupleType


class BatchError(IRError):
    """A program vmap cannot batch: an op without a batching rule for its batched operands."""


class Batcher:
    """What a batching rule emits with (see ir/registry/batch_rules.py)."""

    def __init__(self, builder: FunctionBuilder, size: int, location=None, module=None):
        self.builder, self.size, self.location, self.module = builder, size, location, module

    def emit(self, op: str, args, **attrs) -> Value:
        return self.builder.emit(op, list(args), location=self.location, **attrs)

    def align(self, x: Value, rank: int) -> Value:
        """A batched x (B, *s) as (B, 1, ..., 1, *s) of rank + 1 (numpy's broadcasting aligns
        the other operands' axes to the right, after the batch axis)."""
        shape = x.tensor_type.shape
        if len(shape) - 1 >= rank:
            return x
        pad = (1,) * (rank - len(shape) + 1)
        return self.emit("shapeCast", [x], shape=shape[:1] + pad + shape[1:])

    def full(self, x) -> Value:
        """An unbatched x broadcast to (B, *x.shape)."""
        return self.emit("broadcast", [x], shape=(self.size, *x.type.shape))

    def literal(self, array: np.ndarray) -> Value:
        t = TensorType(array.shape, DType.from_numpy(array.dtype))
        return self.emit("literal", [], value=array, type=t)

    def batch_body(self, body: Function, batched: list[bool]) -> Function:
        """A region op's body (a Function its attributes hold) batched as its operands are,
        every output batched (a loop's carries keep one form across iterations)."""
        flags = "".join("b" if b else "u" for b in batched)
        out, _ = batch_function(body, batched, self.size, self.module, f"{body.name}_vmap_{flags}")
        return out

    def error(self, op: str, what: str) -> BatchError:
        return BatchError(f"vmap: {op} with {what} has no batching rule")


def batch_function(
    fn: Function,
    batched: list[bool],
    size: int,
    module: Module | None = None,
    name: str | None = None,
    broadcast_outputs: bool = True,
) -> tuple[Function, list[bool]]:
    """(fn batched along a new axis 0 of the parameters marked in `batched`, which outputs are
    batched). `broadcast_outputs`: outputs that do not depend on a batched parameter are
    broadcast to the batch too (vmap's out_axes=0)."""
    if len(batched) != len(fn.params):
        raise BatchError(f"@{fn.name}: {len(fn.params)} parameters, {len(batched)} batch flags")
    flat = flatten(fn, module)
    types = [
        TensorType((size, *p.tensor_type.shape), p.tensor_type.dtype) if b else p.type
        for p, b in zip(fn.params, batched)
    ]
    builder = FunctionBuilder(name or f"{fn.name}_batched", types, [p.name for p in fn.params])
    env: dict[int, tuple[Value, bool]] = {
        id(p): (q, b) for p, q, b in zip(fn.params, builder.params, batched)
    }

    def get(o):
        return (o, False) if isinstance(o, Const) else env[id(o)]

    parts: dict[int, list] = {}  # a loop's batched tuple result: its elements, batched
    for inst in flat.body:
        if inst.op == "extract" and id(inst.operands[0]) in parts:
            env[id(inst.result)] = (parts[id(inst.operands[0])][inst.attrs["index"]], True)
            continue
        args, flags = zip(*(get(o) for o in inst.operands)) if inst.operands else ((), ())
        if not any(flags):
            out = builder.emit(inst.op, list(args), location=inst.location, **inst.attrs)
            env[id(inst.result)] = (out, False)
            continue
        spec = OPS[inst.op]
        if spec.batch is None:
            raise BatchError(f"vmap: op {inst.op} has no batching rule (ir/registry/)")
        bt = Batcher(builder, size, inst.location, module)
        out = spec.batch(bt, inst.op, list(args), tuple(flags), dict(inst.attrs))
        outs = out if isinstance(out, list) else [out]  # control flow: one per element
        for o, t in zip(outs, elements(inst.result.type)):
            want = (size, *t.shape)
            if o.tensor_type.shape != want or o.tensor_type.dtype != t.dtype:
                raise BatchError(
                    f"vmap: the batching rule of {inst.op} gave {o.type}, expected "
                    f"{TensorType(want, t.dtype)}"
                )
        if isinstance(inst.result.type, TupleType):
            parts[id(inst.result)] = outs
        else:
            env[id(inst.result)] = (outs[0], True)
    results, out_batched = [], []
    pairs = []
    for r in flat.results:  # a loop's tuple returned whole: its elements
        pairs += [(v, True) for v in parts[id(r)]] if id(r) in parts else [get(r)]
    for v, b in pairs:
        if not b and broadcast_outputs:
            v, b = Batcher(builder, size).full(v), True
        results.append(v)
        out_batched.append(b)
    batched_fn = builder.finish(results if flat.tuple_result else results[0])
    batched_fn.location = fn.location
    return batched_fn, out_batched
