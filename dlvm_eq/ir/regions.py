"""A function with control flow cut into pieces: straight-line runs of tensor ops, and the
control-flow instructions between them. What executes loops (pipeline/loops.py) and what
differentiates them (ad/control_flow.py) both start here.

    params, nodes, results = normalize(fn, module)    # apply inlined, tuples resolved
    for piece in split(params, nodes, results):
        piece.inputs, piece.outputs                    # Values read from / given to the rest
        piece.function                                 # a straight piece as a Function
        piece.inst                                     # a control-flow piece's instruction

A control-flow instruction's tuple result is replaced by one Value per element (`outputs`),
so that every value a piece passes on is a tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import IRError
from .control_flow import CONTROL_FLOW_OPS, elements
from .declared import require_body
from .module import Const, Function, Instruction, Module, Value
from .types import TupleType


@dataclass
class Region:
    """A control-flow instruction and the tensors of its result."""

    inst: Instruction
    outputs: list[Value]


@dataclass
class Piece:
    inputs: list[Value]
    outputs: list[Value]
    insts: list[Instruction] = field(default_factory=list)  # a straight piece's
    region: Region | None = None
    function: Function | None = None  # a straight piece: inputs -> outputs

    @property
    def inst(self) -> Instruction | None:
        return self.region.inst if self.region else None


class _Names:
    def __init__(self, fn: Function):
        self.used = {p.name for p in fn.params} | {i.result.name for i in fn.body}

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}.{k}"
        self.used.add(name)
        return name


def normalize(fn: Function, module: Module | None):
    """(params, nodes, results): `fn`'s body with `apply` inlined and tuples resolved; nodes
    are Instructions of tensor ops or Regions; results the returned tensors (Values/Consts)."""
    require_body(fn)
    names = _Names(fn)
    nodes: list = []
    env: dict[int, object] = {id(p): p for p in fn.params}
    _walk(fn, module, env, nodes, names, "", 0)
    ret = _get(env, fn.ret)
    results = list(ret) if isinstance(ret, tuple) else [ret]
    return list(fn.params), nodes, results


def _get(env, o):
    return o if isinstance(o, Const) else env[id(o)]


def _walk(fn, module, env, nodes, names: _Names, prefix: str, depth: int) -> None:
    if depth > 64:
        raise IRError(f"@{fn.name}: apply nests too deeply (recursion?)")
    for inst in fn.body:
        ops = [_get(env, o) for o in inst.operands]
        key = id(inst.result)
        if inst.op == "tuple":
            env[key] = tuple(ops)
        elif inst.op == "extract":
            if not isinstance(ops[0], tuple):
                raise IRError(f"@{fn.name}: extract from a value that is not a tuple")
            env[key] = ops[0][inst.attrs["index"]]
        elif inst.op == "apply":
            if module is None:
                raise IRError(f"@{fn.name}: apply needs the module to inline it")
            callee = module[inst.attrs["callee"]]
            require_body(callee)
            sub = {id(q): a for q, a in zip(callee.params, ops)}
            _walk(callee, module, sub, nodes, names, f"{prefix}{callee.name}.", depth + 1)
            env[key] = _get(sub, callee.ret)
        else:
            if any(isinstance(o, tuple) for o in ops):
                raise IRError(f"@{fn.name}: {inst.op} of a tuple value")
            name = names.fresh(prefix + inst.result.name) if prefix else inst.result.name
            result = Value(name, inst.result.type)
            new = Instruction(result, inst.op, ops, inst.attrs, inst.location)
            if inst.op in CONTROL_FLOW_OPS:
                if isinstance(result.type, TupleType):
                    outs = [
                        Value(names.fresh(f"{name}.{k}"), t)
                        for k, t in enumerate(elements(result.type))
                    ]
                else:
                    outs = [result]
                nodes.append(Region(new, outs))
                env[key] = tuple(outs) if isinstance(result.type, TupleType) else outs[0]
            else:
                nodes.append(new)
                env[key] = result


def _reads(node) -> list:
    inst = node.inst if isinstance(node, Region) else node
    return [o for o in inst.operands if isinstance(o, Value)]


def _defines(node) -> list[Value]:
    return node.outputs if isinstance(node, Region) else [node.result]


def live_nodes(nodes: list, results: list) -> list:
    """The nodes some result depends on (every op is pure)."""
    needed = {id(r) for r in results if isinstance(r, Value)}
    live = []
    for node in reversed(nodes):
        if any(id(v) in needed for v in _defines(node)):
            live.append(node)
            needed.update(id(o) for o in _reads(node))
    live.reverse()
    return live


def split(params: list[Value], nodes: list, results: list, name: str = "piece") -> list[Piece]:
    """The live nodes cut into pieces: each run of tensor instructions is one straight piece
    (a Function of what it reads, returning what later pieces or the results read), each
    Region one piece of its own."""
    nodes = live_nodes(nodes, results)
    pieces: list[Piece] = []
    run: list[Instruction] = []
    for node in nodes + [None]:
        if isinstance(node, Instruction):
            run.append(node)
            continue
        if run:
            pieces.append(Piece([], [], insts=run))
            run = []
        if node is not None:
            pieces.append(Piece(_unique(_reads(node)), list(node.outputs), region=node))
    # what each piece reads and passes on
    later: set[int] = {id(r) for r in results if isinstance(r, Value)}
    for piece in reversed(pieces):
        if piece.region is None:
            defined = {id(i.result) for i in piece.insts}
            reads = _unique(o for i in piece.insts for o in _reads(i) if id(o) not in defined)
            piece.inputs = reads
            piece.outputs = [i.result for i in piece.insts if id(i.result) in later]
        later.update(id(v) for v in piece.inputs)
    for k, piece in enumerate(pieces):
        if piece.region is None:
            piece.function = _function(f"{name}.{k}", piece)
    return pieces


def _unique(values) -> list[Value]:
    seen, out = set(), []
    for v in values:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def _function(name: str, piece: Piece) -> Function:
    outs = piece.outputs
    if len(outs) == 1:
        return Function(name, list(piece.inputs), outs[0].type, list(piece.insts), outs[0])
    used = {v.name for v in piece.inputs} | {i.result.name for i in piece.insts}
    tname, k = "results", 0
    while tname in used:
        k += 1
        tname = f"results{k}"
    t = TupleType(tuple(v.tensor_type for v in outs))
    tup = Instruction(Value(tname, t), "tuple", list(outs))
    return Function(name, list(piece.inputs), t, [*piece.insts, tup], tup.result)
