"""Expressions for `dlvm-eq query`: text -> a one-result IR Function, and extracted terms -> text.

Two input forms, told apart by the first character:

- infix, numpy-like (a Python expression): ``A @ B @ C``, ``sum(X * (U @ V.T))``,
  ``sum((X - U @ V.T) ** 2)``, ``exp(x) / sum(exp(x))``. Operators ``+ - * / ** @``, unary ``-``,
  ``x.T``; functions: every unary op of the op table (``exp``, ``tanh``, ``relu``, ...),
  ``sum``/``max``/``min``/``prod`` (all axes, or ``axis=k``), ``mean``, ``transpose``,
  ``dot``/``matmul``, ``minimum``/``maximum``.
- s-expressions over the schema's constructors, variables as bare names:
  ``(Dot (Dot A B) C)``, ``(Reduce (Exp x) "add" 0.0 1)``, ``(Transpose A (vec-of 1 0))``.

Variables take their shapes from ``shapes`` (``{"A": (30, 35)}``); numbers are scalars.

    >>> fn = parse_expression("A @ B", {"A": (2, 3), "B": (3, 4)})
    >>> str(fn.result_type)
    '<2 x 4 x f32>'
"""

from __future__ import annotations

import ast
import re

from ..errors import DlvmError, IRError
from ..ir import window_ops
from ..ir.module import Const, Function, FunctionBuilder
from ..ir.op_spec import MATMUL_COST, egg_attrs_from
from ..ir.ops import BINARY, OPS, UNARY_OPS, WINDOW
from ..ir.registry import EGRAPH_ONLY
from ..ir.types import DType, TensorType
from ..sexpr import SexprError, SList, Str, Sym, read, show
from .loader import REDUCE_IDENTITY
from .serialized import EGG_TO_OP, Graph


class ExpressionError(DlvmError):
    """An expression `dlvm-eq query` cannot read: what is wrong and where."""


def parse_expression(
    text: str, shapes: dict[str, tuple[int, ...]], dtype: str | DType = "f32", name: str = "query"
) -> Function:
    """The expression as a function of its variables (in order of first use)."""
    dtype = DType(str(dtype))
    builder = _Builder(shapes, dtype, name)
    text = text.strip()
    try:
        if _is_sexpr(text):
            return builder.finish(builder.sexpr(_read_one(text)))
        return builder.finish(builder.infix(text))
    except IRError as e:
        raise ExpressionError(f"{text}: {e}") from None


def _read_one(text: str):
    """The one s-expression of `text` (sexpr.read: Sym, Str, numbers, SList)."""
    try:
        forms = read(text)
    except SexprError as e:
        raise ExpressionError(f"{e.message} at line {e.line}, column {e.col}") from None
    if len(forms) != 1:
        extra = show(forms[1]) if len(forms) > 1 else "nothing"
        raise ExpressionError(f"expected one ( ) expression, found {extra} after it")
    return forms[0]


def _is_sexpr(text: str) -> bool:
    """`(Ctor ...)` with a schema constructor, or a capitalized head and no infix operator
    (so that `(A @ B) @ C` stays infix while `(Frob A)` is reported as an unknown constructor)."""
    head = re.match(r"\(\s*([A-Za-z][\w-]*)\s+[^\s)]", text)
    if not head:
        return False
    name = head.group(1)
    return (
        name in EGG_TO_OP
        or name in ("Var", "Const")
        or (name[0].isupper() and not re.search(r"[@*/+]| - ", text))
    )


# ---------------------------------------------------------------- building


class _Builder:
    def __init__(self, shapes, dtype: DType, name: str):
        self.shapes, self.dtype, self.name = shapes, dtype, name
        self.vars: dict[str, int] = {}
        self.steps: list = []  # recorded (op, operands, attrs), replayed once params are known
        self.counter = 0

    # values are recorded symbolically first: parameters are only known at the end
    def var(self, name: str):
        if name not in self.shapes:
            known = ", ".join(sorted(self.shapes)) or "none"
            raise ExpressionError(
                f"variable {name!r} has no shape; pass --shape {name}=2x3 (shapes given: {known})"
            )
        self.vars.setdefault(name, len(self.vars))
        return ("var", name)

    def emit(self, op: str, operands: list, **attrs):
        self.steps.append((op, operands, attrs))
        return ("step", len(self.steps) - 1)

    def finish(self, result) -> Function:
        names = list(self.vars)
        b = FunctionBuilder(
            self.name, [TensorType(tuple(self.shapes[n]), self.dtype) for n in names], names
        )
        params = dict(zip(names, b.params))
        done: list = []

        def value(x):
            if isinstance(x, (int, float)):
                return Const.of(x, self.dtype)
            kind, key = x
            return params[key] if kind == "var" else done[key]

        for op, operands, attrs in self.steps:
            done.append(b.emit(op, [value(o) for o in operands], **attrs))
        out = value(result)
        if isinstance(out, Const):  # a constant expression: return it as a literal
            out = b.emit("literal", [], value=out.value, type=out.type)
        return b.finish(out)

    # ------------------------------------------------------------ infix
    def infix(self, text: str):
        try:
            tree = ast.parse(text, mode="eval").body
        except SyntaxError as e:
            raise ExpressionError(
                f"{text}: not an expression ({e.msg} at column {e.offset})"
            ) from None
        return self.visit(tree)

    def visit(self, n):
        if isinstance(n, ast.Name):
            return self.var(n.id)
        if (
            isinstance(n, ast.Constant)
            and isinstance(n.value, (int, float))
            and not isinstance(n.value, bool)
        ):
            return n.value
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd)):
            x = self.visit(n.operand)
            if isinstance(x, (int, float)):
                return -x if isinstance(n.op, ast.USub) else x
            return self.emit("negate", [x]) if isinstance(n.op, ast.USub) else x
        if isinstance(n, ast.BinOp) and type(n.op) in _BINOPS:
            return self.emit(_BINOPS[type(n.op)], [self.visit(n.left), self.visit(n.right)])
        if isinstance(n, ast.Attribute) and n.attr == "T":
            return self.emit("transpose", [self.visit(n.value)])
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
            return self.call(
                n.func.id,
                [self.visit(a) for a in n.args],
                {k.arg: ast.literal_eval(k.value) for k in n.keywords},
            )
        raise ExpressionError(
            f"cannot read {ast.unparse(n)!r}: expected variables, numbers, "
            "+ - * / ** @, x.T or a function call"
        )

    def call(self, fn: str, args: list, kw: dict):
        if fn in UNARY_OPS and len(args) == 1:
            return self.emit(fn, args)
        if fn in ("sum", "max", "min", "prod", "mean") and len(args) == 1:
            x = args[0]
            rank = self.rank(x)
            axis = kw.get("axis")
            axes = (
                tuple(range(rank))
                if axis is None
                else tuple(axis)
                if isinstance(axis, (tuple, list))
                else (axis,)
            )
            comb = {"sum": "add", "mean": "add", "prod": "multiply"}.get(fn, fn)
            init = REDUCE_IDENTITY[comb]
            r = self.emit("reduce", [x], combinator=comb, init=init, axes=axes)
            if fn == "mean":
                n = 1
                for a in axes:
                    n *= self.shape(x)[a]
                r = self.emit("divide", [r, float(n)])
            return r
        if fn == "transpose" and len(args) == 1:
            return self.emit(
                "transpose", args, **({"perm": tuple(kw["axes"])} if "axes" in kw else {})
            )
        if fn in ("dot", "matmul") and len(args) == 2:
            return self.emit("dot", args)
        if fn in _BINARY_CALLS and len(args) == 2:  # the registry's DSL names: maximum(a, b)
            return self.emit(_BINARY_CALLS[fn], args)
        raise ExpressionError(f"unknown function {fn}() with {len(args)} argument(s)")

    def shape(self, x) -> tuple[int, ...]:
        """Shape of a recorded value (types are checked by the builder at the end)."""
        if isinstance(x, (int, float)):
            return ()
        kind, key = x
        if kind == "var":
            return tuple(self.shapes[key])
        return self._types()[key].shape

    def rank(self, x) -> int:
        return len(self.shape(x))

    def _types(self):
        fn = _Builder.finish(self, ("step", len(self.steps) - 1)) if self.steps else None
        return [inst.result.type for inst in fn.body] if fn else []

    # ------------------------------------------------------------ s-expressions
    def sexpr(self, node):
        if isinstance(node, Str):
            raise ExpressionError(f"a string {show(node)} where a term is expected")
        if isinstance(node, (int, float)):
            return float(node)
        if isinstance(node, Sym):
            return self.var(node)
        if not node or isinstance(node[0], SList):
            raise ExpressionError("an empty or headless ( ) group")
        head, args = show(node[0]), node[1:]
        if head == "Var":
            return self.var(_string(args[0]))
        if head == "Const":
            return float(args[0])
        op = EGG_TO_OP.get(head)
        if op is None:
            raise ExpressionError(f"unknown constructor {head}; expected one of rules/schema.egg's")
        spec = OPS[op]
        if op == "transpose":
            x = self.sexpr(args[0])
            return self.emit(op, [x], **({"perm": _vec(args[1])} if len(args) > 1 else {}))
        if spec.kind == WINDOW:  # operands, then the packed attributes (window_ops.pack)
            return self.emit(
                op, [self.sexpr(a) for a in args[:-1]], **window_ops.unpack(op, _vec(args[-1]))
            )
        # the operands, then the attributes as the registry lays them out (OpSpec.egg_attrs;
        # StridedSlice's entry in ir/registry/egraph_only.py)
        only = EGRAPH_ONLY.get(head)
        read = (lambda ps: only.attrs(tuple(ps))) if only and only.attrs else None
        count = only.prims if only and only.attrs else len(spec.egg_attrs)
        n = len(args) - count
        arity = 2 if op == "concatenate" else spec.arity  # binary in the e-graph
        if n < 1 or (arity is not None and n != arity):
            raise ExpressionError(
                f"({head} ...) takes {arity} operand(s) and {count} attribute(s), "
                f"got {len(args)} argument(s)"
            )
        try:
            prims = [_primitive(a) for a in args[n:]]
            attrs = read(prims) if read else egg_attrs_from(spec, prims)
        except (ValueError, TypeError) as e:
            raise ExpressionError(f"({head} ...): {e}") from None
        return self.emit(op, [self.sexpr(a) for a in args[:n]], **attrs)


# Python's binary operators -> the registry's ops that write them infix (OpSpec.infix)
_AST_OPERATORS = {"+": ast.Add, "-": ast.Sub, "*": ast.Mult, "/": ast.Div, "**": ast.Pow}
_AST_OPERATORS["@"] = ast.MatMult
_BINOPS = {_AST_OPERATORS[s.infix[0]]: name for name, s in OPS.items() if s.infix}
_BINARY_CALLS = {d: name for name, s in OPS.items() if s.kind == BINARY for d in s.dsl}


def _string(tok) -> str:
    if isinstance(tok, str):  # a Str, or a bare Sym
        return str(tok)
    raise ExpressionError(f"expected a string, got {show(tok)}")


def _primitive(tok):
    """An attribute argument of an s-expression: a (vec-of ...) as a tuple, else the token."""
    return _vec(tok) if isinstance(tok, SList) else tok


def _vec(tok) -> tuple[int, ...]:
    if isinstance(tok, SList) and tok and tok[0] in ("vec-of", "vec-empty"):
        return tuple(int(t) for t in tok[1:])
    raise ExpressionError(f"expected (vec-of ...), got {show(tok)}")


# ---------------------------------------------------------------- rendering


def _is_matmul(g: Graph, choice, cls) -> bool:
    return g.decode(choice[cls]).op in _MATMULS


# the infix ops by constructor (OpSpec.infix); the matmuls among them, Gemm's dot included
_INFIX = {s.egg: s.infix for s in OPS.values() if s.infix}
_MATMULS = {name for name, s in OPS.items() if s.cost == MATMUL_COST}


def _read(op: str | None, text: str) -> str:
    """x read through `op` with its default attributes: x.T for a transpose, else op(x)."""
    return f"{text}.T" if op == "transpose" else f"{op}({text})"


class _Elided(Exception):
    pass


def render(g: Graph, choice: dict[str, str], cls: str, types=None, limit: int | None = None) -> str:
    """The chosen term of e-class `cls` in the infix form (shared values written out). With
    `limit`, a term of more than `limit` nodes is cut short: its subterms below that size are
    written out and the rest is `...` (a gradient's DAG written as a tree can be huge)."""
    if limit is None:
        return _render(g, choice, cls, types or {})[0]
    budget = [limit]
    try:
        return _render(g, choice, cls, types or {}, budget)[0]
    except _Elided:
        return _render(g, choice, cls, types or {}, [limit], cut=True)[0]


def _render(g: Graph, choice, cls, types, budget=None, cut=False) -> tuple[str, int]:
    """(text, precedence): 0 lowest; atoms and calls 9. `budget`: nodes left to write; when it
    runs out, _Elided (or, with `cut`, `...` in place of the rest)."""
    if budget is not None:
        if budget[0] <= 0:
            if cut:
                return "...", 9
            raise _Elided
        budget[0] -= 1
    d = g.decode(choice[cls])
    kids = [g.eclass(c) for c in d.children]

    def sub(i, prec):
        text, p = _render(g, choice, kids[i], types, budget, cut)
        # numpy gives * / and @ one precedence; mixed, they read better with parentheses
        mixed = (
            p == 2
            and d.op is not None
            and (OPS[d.op].infix or ("", 0))[1] == 2
            and _is_matmul(g, choice, kids[i]) != (d.op in _MATMULS)
        )
        return f"({text})" if p < prec or mixed else text

    if d.egg == "Var":
        return d.attrs["name"], 9
    if d.egg == "Const":
        v = d.attrs["value"]
        return (repr(int(v)) if v == int(v) and abs(v) < 1e15 else repr(v)), (9 if v >= 0 else 3)
    if d.egg == "Lit":
        return d.attrs["key"], 9
    if d.egg == "Broadcast":  # implicit again, as in the IR
        return _render(g, choice, kids[0], types, budget, cut)
    only = EGRAPH_ONLY.get(d.egg)
    if only is not None and only.reads is not None and d.op and OPS[d.op].infix:
        # Gemm: its operands read through their transposes, written x.T
        sym, prec = OPS[d.op].infix
        reads = only.reads(d.attrs)
        a, b = (
            _read(only.through, sub(i, 9)) if r else sub(i, prec + i) for i, r in enumerate(reads)
        )
        return f"{a} {sym} {b}", prec
    if d.egg in _INFIX:
        sym, prec = _INFIX[d.egg]
        right = prec + 1 if sym != "**" else prec  # ** groups to the right
        left = prec if sym != "**" else prec + 1
        return f"{sub(0, left)} {sym} {sub(1, right)}", prec
    if d.egg == "Negate":
        return f"-{sub(0, 3)}", 3
    if d.egg == "Transpose" and tuple(d.attrs["perm"]) == (1, 0):
        return f"{sub(0, 9)}.T", 9
    if d.egg == "Reduce":
        comb = {"add": "sum", "multiply": "prod"}.get(d.attrs["combinator"], d.attrs["combinator"])
        inner = d
        axes = [d.attrs["axes"][0]]
        x = kids[0]
        # nested one-axis reductions of the same kind read as one call over several axes
        while True:
            di = g.decode(choice[x])
            if di.egg == "Reduce" and di.attrs["combinator"] == inner.attrs["combinator"]:
                axes.append(di.attrs["axes"][0])
                x = g.eclass(di.children[0])
            else:
                break
        text, _ = _render(g, choice, x, types, budget, cut)
        t = types.get(x)
        if t is not None and len(axes) == t.rank:
            call = f"{comb}({text})"
        else:
            call = f"{comb}({text}, axis={axes[0] if len(axes) == 1 else tuple(axes)})"
        init = d.attrs["init"]
        if init != REDUCE_IDENTITY.get(d.attrs["combinator"]):
            return f"{call} + {init!r}" if comb == "sum" else f"{comb}({call}, {init!r})", 1
        return call, 9
    name = d.op or d.egg
    args = [_render(g, choice, k, types, budget, cut)[0] for k in kids]
    attrs = [f"{k}={v}" for k, v in d.attrs.items()]
    return f"{name}({', '.join(args + attrs)})", 9
