"""The loader: an IR function becomes egglog terms.

Each instruction becomes `(let $vN_ <term>)` (see let_name), so shared values stay shared; the
session binds each such let as a row of one marker function, not as an egglog global
(values.py: globals make egglog quadratic in the program's length). Implicit broadcasts
become explicit `Broadcast` terms; multi-axis reductions become chains of one-axis `Reduce`s
(highest axis first, the identity as init of all but the outermost) so that the shape analysis
is a single `vec-remove`; `padShape`/`squeezeShape` become `ShapeCast`; `apply` is inlined;
tuple results become several roots.

    prog = load_function(fn, module)
    prog.text    # egglog commands
    prog.roots   # let names of the results, in order
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import DlvmError
from ..ir.inline import Flat, flatten
from ..ir.module import Const, Function, Module, Value
from ..ir import window_ops
from ..ir.ops import ELEMENTWISE_KINDS, OPS, WINDOW, transpose_perm
from ..ir.types import TensorType

REDUCE_IDENTITY = {"add": 0.0, "multiply": 1.0, "max": -math.inf, "min": math.inf}


def let_name(prefix: str, n: int) -> str:
    """The name of the n-th global a loader binds: `$<prefix><n>_`. The trailing `_` is there
    because egglog 13.2 can confuse globals whose names are one another plus digits: with
    `$p0_1` and `$p0_11` both bound and given a shape, `(let $p0_32 (Multiply $p0_11 $p0_1))`
    built w * w instead of a10 * w (a wrong `dlvm-eq query` answer; tests/test_let_names.py).
    A name that ends in `_` is never another name followed by digits. (Sessions now bind our
    lets as marker rows, values.py; the names still reach egglog as globals where a caller runs
    them with run_text, e.g. fusion's Scalar result loads.)"""
    return f"${prefix}{n}_"


def egg_float(v: float) -> str:
    """An f64 literal egglog parses back to the same double."""
    v = float(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    text = repr(v)
    return text if any(c in text for c in ".en") else text + ".0"


def egg_vec(xs) -> str:
    return "(vec-of " + " ".join(str(int(x)) for x in xs) + ")" if len(xs) else "(vec-empty)"


def egg_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass
class LoadedProgram:
    """A function as egglog commands, plus what lives beside the e-graph."""

    name: str
    lines: list[str] = field(default_factory=list)
    roots: list[str] = field(default_factory=list)            # let names of the results
    var_types: dict[str, TensorType] = field(default_factory=dict)   # parameter name -> type
    literals: dict[str, np.ndarray] = field(default_factory=dict)    # Lit key -> value
    term_types: dict[str, TensorType] = field(default_factory=dict)  # let name -> type
    result_is_tuple: bool = False
    params: list[Value] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


class _Loader:
    def __init__(self, prog: LoadedProgram, prefix: str):
        self.prog = prog
        self.prefix = prefix
        self.counter = 0
        self.memo: dict[str, str] = {}   # term text -> let name (hash-consing keeps output small)

    def let(self, term: str, t: TensorType) -> str:
        if term in self.memo:
            return self.memo[term]
        name = let_name(self.prefix, self.counter)
        self.counter += 1
        self.prog.lines.append(f"(let {name} {term})")
        self.prog.term_types[name] = t
        self.memo[term] = name
        return name

    def const(self, value, t: TensorType) -> str:
        """A scalar constant, broadcast to t's shape when t is not a scalar."""
        c = self.let(f"(Const {egg_float(value)} {egg_string(str(t.dtype))})", TensorType((), t.dtype))
        return self.broadcast(c, TensorType((), t.dtype), t.shape)

    def broadcast(self, term: str, t: TensorType, shape) -> str:
        shape = tuple(shape)
        if t.shape == shape:
            return term
        return self.let(f"(Broadcast {term} {egg_vec(shape)})", t.with_shape(shape))

    def literal(self, value: np.ndarray, t: TensorType) -> str:
        value = np.asarray(value, dtype=t.dtype.numpy)
        if value.ndim == 0 or np.all(value == value.flat[0]) and value.size:
            return self.const(value.flat[0].item() if value.size else 0, t)
        key = f"{self.prefix}lit{len(self.prog.literals)}"
        self.prog.literals[key] = np.broadcast_to(value, t.shape).copy()
        name = self.let(f"(Lit {egg_string(key)})", t)
        self.prog.lines.append(f"(set (shape {name}) {egg_vec(t.shape)})")
        self.prog.lines.append(f"(set (dtype {name}) {egg_string(str(t.dtype))})")
        return name


def _operand(loader: _Loader, env: dict, o):
    if isinstance(o, Const):
        return loader.const(o.value, o.type), o.type
    return env[id(o)], o.type


def _load_body(loader: _Loader, flat: Flat, args: list) -> list[str]:
    """Emit the flattened body with its parameters bound to `args` (term names); the results."""
    env: dict[int, object] = {id(p): a for p, a in zip(flat.params, args)}
    for inst in flat.body:
        spec = OPS[inst.op]
        rt = inst.result.type
        if inst.op == "literal":
            env[id(inst.result)] = loader.literal(inst.attrs["value"], rt)
            continue
        ops = [_operand(loader, env, o) for o in inst.operands]
        a = inst.attrs
        if spec.kind in ELEMENTWISE_KINDS:
            terms = [loader.broadcast(term, t, rt.shape) for term, t in ops]
            text = f"({spec.egg} {' '.join(terms)})"
        elif inst.op == "reduce":
            term, t = ops[0]
            axes = sorted(a["axes"], reverse=True)
            if not axes:   # a reduce over no axis combines init with every element
                init = loader.const(a["init"], t)
                env[id(inst.result)] = loader.let(f"({_COMBINE[a['combinator']]} {term} {init})", rt)
                continue
            shape = list(t.shape)
            for i, ax in enumerate(axes):
                init = a["init"] if i == len(axes) - 1 else REDUCE_IDENTITY[a["combinator"]]
                shape.pop(ax)
                term = loader.let(f"(Reduce {term} {egg_string(a['combinator'])} {egg_float(init)} {ax})",
                                  rt.with_shape(shape))
            env[id(inst.result)] = term
            continue
        elif inst.op in ("shapeCast", "padShape", "squeezeShape"):
            text = f"(ShapeCast {ops[0][0]} {egg_vec(rt.shape)})"
        elif inst.op == "broadcast":
            text = f"(Broadcast {ops[0][0]} {egg_vec(rt.shape)})"
        elif inst.op == "transpose":
            perm = transpose_perm(ops[0][1].rank, a)
            text = f"(Transpose {ops[0][0]} {egg_vec(perm)})"
        elif inst.op == "dataTypeCast":
            text = f"(DataTypeCast {ops[0][0]} {egg_string(str(a['dtype']))})"
        elif inst.op == "concatenate":
            term, t = ops[0]
            for other, ot in ops[1:]:
                t = t.with_shape(t.shape[:a["axis"]] + (t.shape[a["axis"]] + ot.shape[a["axis"]],)
                                 + t.shape[a["axis"] + 1:])
                term = loader.let(f"(Concatenate {term} {other} {a['axis']})", t)
            env[id(inst.result)] = term
            continue
        elif inst.op == "slice":
            text = f"(Slice {ops[0][0]} {a['axis']} {a['lo']} {a['hi']})"
        elif inst.op == "dot":
            text = f"(Dot {ops[0][0]} {ops[1][0]})"
        elif spec.kind == WINDOW:   # tensor operands, then the attributes packed in one IVec
            text = f"({spec.egg} {' '.join(term for term, _ in ops)} {egg_vec(window_ops.pack(inst.op, a))})"
        else:  # pragma: no cover - every op kind is handled above
            raise DlvmError(f"the e-graph loader has no case for op {inst.op}")
        env[id(inst.result)] = loader.let(text, rt)
    return [_operand(loader, env, r)[0] for r in flat.results]



_COMBINE = {"add": "Add", "multiply": "Multiply", "max": "Max", "min": "Min"}


def load_function(fn: Function, module: Module | None = None, prefix: str = "v") -> LoadedProgram:
    """The egglog commands that build fn's result terms, with shapes of its parameters set."""
    if fn.is_declaration:
        raise DlvmError(f"@{fn.name} has no body to load")
    prog = LoadedProgram(fn.name, params=list(fn.params))
    loader = _Loader(prog, prefix)
    args = []
    for p in fn.params:
        if not isinstance(p.type, TensorType):
            raise DlvmError(f"@{fn.name}: parameter %{p.name} has tuple type {p.type}")
        name = loader.let(f"(Var {egg_string(p.name)})", p.type)
        prog.lines.append(f"(set (shape {name}) {egg_vec(p.type.shape)})")
        prog.lines.append(f"(set (dtype {name}) {egg_string(str(p.type.dtype))})")
        prog.var_types[p.name] = p.type
        args.append(name)
    flat = flatten(fn, module)
    prog.roots = _load_body(loader, flat, args)
    prog.result_is_tuple = flat.tuple_result
    return prog
