"""The loader: an IR function becomes egglog terms, as data (lets.py).

Each distinct term becomes one interned `Let` named `$vN_` (see let_name), so shared values
stay shared; the session binds each let as a row of one marker function, not as an egglog
global (values.py: globals make egglog quadratic in the program's length). Implicit broadcasts
become explicit `Broadcast` terms; multi-axis reductions become chains of one-axis `Reduce`s
(highest axis first, the identity as init of all but the outermost) so that the shape analysis
is a single `vec-remove`; `padShape`/`squeezeShape` become `ShapeCast`; `apply` is inlined;
tuple results become several roots.

    prog = load_function(fn, module)
    prog.lets    # Lets in load order; prog.text: the same as egglog commands
    prog.roots   # let names of the results, in order
"""

from __future__ import annotations

from dataclasses import field

import numpy as np

from ..errors import DlvmError
from ..ir import window_ops
from ..ir.inline import Flat, flatten
from ..ir.module import Const, Function, Module, Value
from ..ir.op_spec import egg_args_of
from ..ir.ops import ELEMENTWISE_KINDS, OPS, WINDOW, transpose_perm
from ..ir.registry.elementwise import COMPARE_ROWS
from ..ir.registry.reduction import COMBINATORS
from ..ir.types import TensorType
from ..records import dataclass
from .lets import CAUSAL_KEEP_KEY, CAUSAL_KEY, Let, LetTable, commands

REDUCE_IDENTITY = {name: c.identity for name, c in COMBINATORS.items()}  # the registry's


@dataclass
class Lifted:
    """A value a loop body reads that is computed before the loop: `before` (a function of
    the loop's outer leaves) gives it, the body reads it as its parameter `name`; `step`: a
    per-step input (row t at step t), else the same value at every step."""

    step: bool
    name: str
    before: Function


@dataclass
class LoadedProgram:
    """A function as Lets (egglog terms as data), plus what lives beside the e-graph."""

    name: str
    lets: list[Let] = field(default_factory=list)  # in load order
    roots: list[str] = field(default_factory=list)  # let names of the results
    var_types: dict[str, TensorType] = field(default_factory=dict)  # parameter name -> type
    literals: dict[str, np.ndarray] = field(default_factory=dict)  # Lit key -> value
    result_is_tuple: bool = False
    params: list[Value] = field(default_factory=list)
    # a loop body's: its loop's outer leaves (rules/loops.egg's `.out` and `.all` Vars), and
    # what the last unload lifted out of it (egraph/unload.py)
    outer_vars: dict[str, TensorType] = field(default_factory=dict)
    lifted: list[Lifted] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The lets as egglog commands (globals), with their leaves' shapes and dtypes."""
        return "\n".join(commands(self.lets)) + "\n"

    def named(self) -> dict[str, Let]:
        """Let name -> Let."""
        return {let.name: let for let in self.lets}


class _Loader:
    def __init__(self, prog: LoadedProgram, prefix: str):
        self.prog = prog
        self.prefix = prefix
        self.table = LetTable(prefix)  # interned: the same term twice is one let
        prog.lets = self.table.lets

    def let(self, ctor: str, args: tuple, t: TensorType) -> Let:
        return self.table.let(ctor, args, t)

    def const(self, value, t: TensorType) -> Let:
        """A scalar constant, broadcast to t's shape when t is not a scalar."""
        scalar = TensorType((), t.dtype)
        c = self.let("Const", (float(value), str(t.dtype)), scalar)
        return self.broadcast(c, scalar, t.shape)

    def broadcast(self, term: Let, t: TensorType, shape) -> Let:
        shape = tuple(int(d) for d in shape)
        if t.shape == shape:
            return term
        return self.let("Broadcast", (term, shape), t.with_shape(shape))

    def literal(self, value: np.ndarray, t: TensorType) -> Let:
        value = np.asarray(value, dtype=t.dtype.numpy)
        if value.size == 0 or value.ndim == 0 or np.all(value == value.flat[0]):
            # one value everywhere (an empty array: any value, say 0)
            return self.const(value.flat[0].item() if value.size else 0, t)
        kind = (
            CAUSAL_KEEP_KEY
            if causal_keep_value(value)
            else CAUSAL_KEY
            if causal_mask_value(value)
            else "lit"
        )
        key = f"{self.prefix}{kind}{len(self.prog.literals)}"
        self.prog.literals[key] = np.broadcast_to(value, t.shape).copy()
        return self.let("Lit", (key,), t)


# an additive mask value at or below this hides a key as -inf does: exp(s - 1e9 - max) is 0 in
# f32 and f64 while the visible scores stay below 1e8 in magnitude
HIDDEN = -1e9


def causal_mask_value(value: np.ndarray) -> bool:
    """Is value the additive causal mask over its last two axes: 0 where key j <= query i, at
    most HIDDEN (-inf included) where j > i, the same for every leading index?"""
    above = _above_diagonal(value)
    if above is None or value.dtype.kind != "f":
        return False
    flat = value.reshape(-1, *above.shape)
    return bool(np.all(flat[:, ~above] == 0) and np.all(flat[:, above] <= HIDDEN))


def _above_diagonal(value: np.ndarray) -> np.ndarray | None:
    """(m, n) True where key j > query i, or None where value has no two axes to mask."""
    if value.ndim < 2 or value.shape[-1] < 2:
        return None
    m, n = value.shape[-2:]
    return np.arange(n)[None, :] > np.arange(m)[:, None]


def causal_keep_value(value: np.ndarray) -> bool:
    """Is value the bool causal keep mask over its last two axes (`np.tril(ones, bool)`: True
    where key j <= query i), the same for every leading index?"""
    above = _above_diagonal(value)
    if above is None or value.dtype != np.bool_:
        return False
    flat = value.reshape(-1, *above.shape)
    return bool(np.all(flat == ~above))


def _operand(loader: _Loader, env: dict, o):
    if isinstance(o, Const):
        return loader.const(o.value, o.type), o.type
    return env[id(o)], o.type


# issue 33: a comparison of literals (reshaped) is loaded as the literal it computes, so that
# `arange(T)[:, None] >= arange(T)[None, :]` is the causal keep mask rules/attention.egg reads
FOLDED = ("shapeCast", "padShape", "squeezeShape", "broadcast", *COMPARE_ROWS)
FOLD_SIZE = 1 << 24  # elements: a mask of seq 4096


def _load_body(loader: _Loader, flat: Flat, args: list) -> list[str]:
    """Load the flattened body with its parameters bound to `args` (Lets); the results' names."""
    env: dict[int, Let] = {id(p): a for p, a in zip(flat.params, args)}
    known: dict[int, np.ndarray] = {}  # values computed from literals alone (FOLDED)
    for inst in flat.body:
        if inst.op == "literal":
            env[id(inst.result)] = loader.literal(inst.attrs["value"], inst.result.type)
            known[id(inst.result)] = inst.attrs["value"]
            continue
        if (
            inst.op in FOLDED
            and inst.result.type.size <= FOLD_SIZE
            and all(isinstance(o, Const) or id(o) in known for o in inst.operands)
        ):
            ins = [o.value if isinstance(o, Const) else known[id(o)] for o in inst.operands]
            known[id(inst.result)] = value = OPS[inst.op].evaluate(ins, inst.attrs)
            if inst.op in COMPARE_ROWS:
                env[id(inst.result)] = loader.literal(value, inst.result.type)
                continue
        env[id(inst.result)] = _load_instruction(
            loader, inst, [_operand(loader, env, o) for o in inst.operands]
        )
    return [_operand(loader, env, r)[0].name for r in flat.results]


def _load_instruction(loader: _Loader, inst, ops: list[tuple[Let, TensorType]]) -> Let:
    """The Let of one instruction's result, given its operands' (Let, type)."""
    spec, rt, a = OPS[inst.op], inst.result.type, inst.attrs
    if spec.kind in ELEMENTWISE_KINDS:
        return loader.let(
            spec.egg, tuple(loader.broadcast(term, t, rt.shape) for term, t in ops), rt
        )
    if inst.op == "reduce":
        return _load_reduce(loader, ops[0], a, rt)
    x = ops[0][0]
    if inst.op in ("shapeCast", "padShape", "squeezeShape"):
        return loader.let("ShapeCast", (x, rt.shape), rt)
    if inst.op == "broadcast":
        return loader.let("Broadcast", (x, rt.shape), rt)
    if inst.op == "transpose":
        return loader.let("Transpose", (x, tuple(transpose_perm(ops[0][1].rank, a))), rt)
    if inst.op == "concatenate":
        axis = int(a["axis"])
        term, t = ops[0]
        for other, ot in ops[1:]:
            t = t.with_shape(
                t.shape[:axis] + (t.shape[axis] + ot.shape[axis],) + t.shape[axis + 1 :]
            )
            term = loader.let("Concatenate", (term, other, axis), t)
        return term
    if inst.op == "slice" and a.get("step", 1) != 1:
        return loader.let(
            "StridedSlice", (x, int(a["axis"]), int(a["lo"]), int(a["hi"]), int(a["step"])), rt
        )
    terms = tuple(term for term, _ in ops)
    if spec.kind == WINDOW:  # tensor operands, then the attributes packed in one IVec
        return loader.let(spec.egg, (*terms, tuple(window_ops.pack(inst.op, a))), rt)
    # dataTypeCast, slice, sliceScatter, cumsum, take, scatterAdd, dot, batchMatmul, attention
    # (its bias unbroadcast: the kernel broadcasts it), ...: the operands, then the attributes
    # as the registry lays them out (OpSpec.egg_attrs)
    return loader.let(spec.egg, (*terms, *egg_args_of(spec, a)), rt)


def _load_reduce(loader: _Loader, operand: tuple[Let, TensorType], a: dict, rt: TensorType) -> Let:
    """A reduction as one-axis Reduces, highest axis first (the identity as init of all but
    the outermost); over no axis, init combined with every element."""
    term, t = operand
    axes = sorted(a["axes"], reverse=True)
    if not axes:
        # over no axis: the combinator is the binary op of its name (add, multiply, max, min)
        return loader.let(OPS[a["combinator"]].egg, (term, loader.const(a["init"], t)), rt)
    shape = list(t.shape)
    for i, ax in enumerate(axes):
        init = a["init"] if i == len(axes) - 1 else REDUCE_IDENTITY[a["combinator"]]
        shape.pop(ax)
        term = loader.let(
            "Reduce", (term, a["combinator"], float(init), int(ax)), rt.with_shape(shape)
        )
    return term


def load_function(fn: Function, module: Module | None = None, prefix: str = "v") -> LoadedProgram:
    """The Lets that build fn's result terms (its parameters' shapes and dtypes as facts)."""
    if fn.is_declaration:
        raise DlvmError(f"@{fn.name} has no body to load")
    prog = LoadedProgram(fn.name, params=list(fn.params))
    loader = _Loader(prog, prefix)
    args = []
    for p in fn.params:
        if not isinstance(p.type, TensorType):
            raise DlvmError(f"@{fn.name}: parameter %{p.name} has tuple type {p.type}")
        args.append(loader.let("Var", (p.name,), p.type))
        prog.var_types[p.name] = p.type
    flat = flatten(fn, module)
    prog.roots = _load_body(loader, flat, args)
    prog.result_is_tuple = flat.tuple_result
    return prog
