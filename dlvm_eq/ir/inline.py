"""IR Function -> a straight list of tensor instructions: `apply` inlined (declared adjoints
must be resolved first: dlvm_eq.pipeline.resolve_adjoints), tuples and `extract` resolved,
instructions no result depends on dropped. What the e-graph loader and the code generator's
planner both start from.

    flat = flatten(module["f"], module)
    flat.body          # instructions, no apply/tuple/extract
    flat.results       # the returned Values (or IR Consts), flat.tuple_result
"""

from __future__ import annotations

from ..errors import IRError
from ..records import dataclass
from .declared import require_body
from .module import Const as IRConst
from .module import Function, Instruction, Module, Value
from .types import TensorType, TupleType

# A fused kernel computes at most this many scalar ops per output (distinct nodes of its
# expression): the planner writes a longer expression's value to a buffer
# (codegen/planning/planner.py), and fusion's cost model expands a kernel body that far and
# prices a split beyond (extract/fusion_cost.py), so the two agree on where kernels end.
KERNEL_EXPR_OPS = 320


@dataclass
class Flat:
    """A function flattened: parameters, a straight body of tensor ops, and its results."""

    params: list[Value]
    body: list[Instruction]
    results: list  # Values or IR Consts
    tuple_result: bool


def flatten(fn: Function, module: Module | None) -> Flat:
    """The function with `apply` inlined and tuples resolved: a straight list of tensor ops."""
    require_body(fn)
    for i, p in enumerate(fn.params):
        if not isinstance(p.type, TensorType):
            raise IRError(
                f"@{fn.name}: parameter {i} has tuple type {p.type}, which cannot be passed"
            )
    body: list[Instruction] = []
    env: dict[int, object] = {}
    _inline(fn, module, {id(p): p for p in fn.params}, body, env, "", 0)
    ret = _get(env, fn.ret)
    tuple_result = isinstance(fn.result_type, TupleType)
    results = list(ret) if isinstance(ret, tuple) else [ret]
    return Flat(list(fn.params), live_instructions(body, results), results, tuple_result)


def live_instructions(body: list[Instruction], results: list) -> list[Instruction]:
    """The instructions that a result depends on, in their order. Every op is pure, so the
    rest is dead: a gradient's function holds the whole forward pass, loss included, of which
    the adjoint reads only some values (dq.grad of a loss never needs the loss itself)."""
    needed = {id(r) for r in results if isinstance(r, Value)}
    live = []
    for inst in reversed(body):
        if id(inst.result) in needed:
            live.append(inst)
            needed.update(id(o) for o in inst.operands if isinstance(o, Value))
    live.reverse()
    return live


def _op_result(t) -> bool:
    """Whether t is the tuple result of an op (a loop's): its elements are read by `extract`."""
    return isinstance(t, Value) and isinstance(t.type, TupleType)


def _get(env, o):
    return o if isinstance(o, IRConst) else env.get(id(o), o)


def _inline(fn: Function, module, env0, body, env, prefix: str, depth: int):
    if depth > 64:
        raise IRError(f"@{fn.name}: apply nests too deeply (recursion?)")
    env.update(env0)
    for inst in fn.body:
        ops = [_get(env, o) for o in inst.operands]
        if inst.op == "tuple":
            env[id(inst.result)] = tuple(ops)
        elif inst.op == "extract" and not _op_result(ops[0]):
            t = ops[0]
            if not isinstance(t, tuple):
                raise IRError(f"@{fn.name}: extract from a value that is not a tuple")
            env[id(inst.result)] = t[inst.attrs["index"]]
        elif inst.op == "apply":
            if module is None:
                raise IRError(
                    f"@{fn.name}: apply needs the module to inline @{inst.attrs['callee']}"
                )
            callee = module[inst.attrs["callee"]]
            require_body(callee)
            sub: dict[int, object] = {}
            p = f"{prefix}{callee.name}.{len(body)}."
            _inline(
                callee,
                module,
                {id(q): a for q, a in zip(callee.params, ops)},
                body,
                sub,
                p,
                depth + 1,
            )
            env[id(inst.result)] = _get(sub, callee.ret)
        else:
            if any(isinstance(o, tuple) for o in ops):
                raise IRError(f"@{fn.name}: {inst.op} of a tuple value")
            key = id(inst.result)
            if prefix or any(o is not q for o, q in zip(ops, inst.operands)):
                result = (
                    Value(prefix + inst.result.name, inst.result.type) if prefix else inst.result
                )
                inst = Instruction(result, inst.op, ops, inst.attrs, inst.location)
            body.append(inst)
            env[key] = inst.result
