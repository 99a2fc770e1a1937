"""Reads one function's blocks (a lark tree) into a straight-line body of Instructions: names,
operand types, each op's own syntax (OP_SYNTAX), the fast path's pre-read lines
(fastlines.py). The module-level reader is parser.py; node positions and the type and
number readers are source_text.py.
"""

from __future__ import annotations

import heapq
from typing import TypeVar

import numpy as np
from lark import Token, Tree

from ..errors import IRError
from .cfg import Walker, has_conditional
from .control_flow_syntax import SYNTAX as CONTROL_FLOW_SYNTAX
from .fastlines import names as fast_names
from .module import Const, Function, Instruction, Module, Operand, Value
from .ops import OPS, REDUCE_COMBINATORS, WINDOW
from .source_text import (
    MAX_RANK,
    Source,
    position,
    read_array,
    read_dim,
    read_dtype,
    read_functype,
    read_int,
    read_int_list,
    read_scalar,
    read_type,
    suggest,
    token,
)
from .types import TensorType, TupleType, Type, size_problem
from .window_syntax import read_window_attrs

O = TypeVar("O", bound=Operand)  # define() gives back what it was given


class FunctionReader:
    """Reads one function's blocks into a straight-line body."""

    def __init__(self, src: Source, module: Module, fn: Function):
        self.src, self.module, self.fn = src, module, fn
        self.env: dict[str, Operand] = {}
        self.defined_at: dict[str, tuple[int, int]] = {}
        self.literal_values: dict[
            int, float | int | bool
        ] = {}  # id(Value) of scalar literals -> value
        self.body: list[Instruction] = []
        self.all_names: set[str] = set()  # every %name written in the function
        self.def_names: set[str] = set()  # the %names it defines
        self.synthesized = 0
        self.types: dict[int, tuple[Tree, Type]] = {}  # id(type tree) -> (the tree, its type)

    # -- structure
    def read(self, body: Tree) -> None:
        self.all_names = {
            str(t)[1:]
            for t in body.scan_values(lambda t: isinstance(t, Token) and t.type == "VALUE")
        }
        self.def_names = {
            str(t.children[0])[1:] for t in body.iter_subtrees() if t.data in ("inst", "param")
        }
        if self.src.fast:
            for line in self.src.fast_between(body.meta.line, body.meta.end_line + 1):
                result, reads = fast_names(self.src.fast[line])
                self.def_names.add(result)
                self.all_names.add(result)
                self.all_names.update(reads)
        blocks: dict[str, Tree] = {}
        for block in body.children:
            label = block.children[0]
            if label in blocks:
                raise self.src.at(label, f"block {label} is defined twice")
            blocks[str(label)] = block
        entry = body.children[0]
        params = self.block_params(entry)
        if [t for _, t in params] != self.fn.param_types:
            got = ", ".join(str(t) for _, t in params)
            want = ", ".join(str(t) for t in self.fn.param_types)
            raise self.src.at(
                entry,
                f"entry block {entry.children[0]} takes ({got}) but @{self.fn.name} "
                f"is declared with parameters ({want})",
            )
        self.fn.params = [self.define(tok, Value(str(tok)[1:], t)) for tok, t in params]
        if has_conditional(blocks):  # loops and if/else become structured ops (cfg.py)
            Walker(self, blocks, str(entry.children[0])).run(str(entry.children[0]))
            self.fn.body = self.body
            return

        visited, block = set(), entry
        while True:
            visited.add(str(block.children[0]))
            *insts, term = block.children[1:]
            for inst in self.with_fast_lines(block, insts, term):
                if isinstance(inst, Tree) and inst.data == "inst":
                    self.instruction(inst)
            block = self.terminator(term, blocks, visited)
            if block is None:
                break
        for label, b in blocks.items():
            if label not in visited:
                raise self.src.at(
                    b,
                    f"block {label} is never branched to; only a straight chain of "
                    "blocks is supported",
                )
        self.fn.body = self.body

    def with_fast_lines(self, block: Tree, insts: list, term: Tree) -> list:
        """The block's instructions in line order: lark's and the fast path's."""
        if not self.src.fast:
            return insts
        lines = self.src.fast_between(block.meta.line, position(term)[0])
        if not lines:
            return insts
        self.src.fast_used += len(lines)
        fast = [(line, self.src.fast[line]) for line in lines]
        slow = [(position(i)[0], i) for i in insts]
        return [t for _, t in heapq.merge(fast, slow, key=lambda p: p[0])]

    def block_params(self, block: Tree) -> list[tuple[Token, Type]]:
        node = block.children[1] if len(block.children) > 1 else None
        if not isinstance(node, Tree) or node.data != "block_params":
            return []
        out: list[tuple[Token, Type]] = []
        for param in node.children:
            tok, t = param.children
            t_ = read_type(self.src, t)
            if isinstance(t_, TupleType):
                raise self.src.at(t, f"a block parameter cannot have tuple type {t_}")
            out.append((token(tok), t_))
        return out

    def terminator(self, term: Tree, blocks: dict[str, Tree], visited: set[str]) -> Tree | None:
        if term.data == "ret":
            ret = self.operand(term.children[0])
            if ret.type != self.fn.result_type:
                raise self.src.at(
                    term.children[0],
                    f"@{self.fn.name} returns {ret.type} but is declared "
                    f"to return {self.fn.result_type}",
                )
            self.fn.ret = ret
            return None
        if term.data == "conditional":
            raise self.src.at(
                term,
                "control flow is not supported: `conditional` branches cannot be "
                "merged into straight-line code (write both sides and use select)",
            )
        label, *rest = term.children
        args = [self.operand(o) for o in rest[0].children] if rest else []
        target = blocks.get(str(label))
        if target is None:
            raise self.src.at(
                label, f"no block {label} in @{self.fn.name}" + suggest(label, blocks)
            )
        if str(label) in visited:
            raise self.src.at(
                label,
                f"control flow is not supported: branching back to {label} "
                "makes a loop (the staged DSL unrolls Python loops)",
            )
        params = self.block_params(target)
        if [a.type for a in args] != [t for _, t in params]:
            got = ", ".join(str(a.type) for a in args)
            want = ", ".join(str(t) for _, t in params)
            raise self.src.at(label, f"branch passes ({got}) but block {label} takes ({want})")
        for (tok, _), arg in zip(params, args):
            self.define(tok, arg)
        return target

    def define(self, tok: Token, value: O) -> O:
        name = str(tok)[1:]
        if name in self.env:
            line, col = self.defined_at[name]
            raise self.src.at(tok, f"%{name} is already defined (at line {line}, column {col})")
        self.env[name] = value
        self.defined_at[name] = position(tok)
        return value

    # -- instructions
    def instruction(self, inst: Tree) -> None:
        result, op_tree = inst.children
        op, operands, attrs = OP_SYNTAX[op_tree.data](self, op_tree)
        result_tok = token(result) if result is not None else None
        self.emit(op, operands, attrs, result_tok, op_tree, self.src.location(inst))

    def emit(
        self, op: str, operands: list[Operand], attrs: dict, result: Token | None, at, location
    ) -> Value:
        spec = OPS[op]
        if spec.arity is not None and len(operands) != spec.arity:
            raise self.src.at(
                at, f"{op} takes {spec.arity} operand{'s' * (spec.arity != 1)}, got {len(operands)}"
            )
        try:
            rtype = spec.result_type([o.type for o in operands], attrs)
        except IRError as e:
            raise self.src.at(at, str(e)) from None
        value = Value(str(result)[1:] if result is not None else self.fresh(), rtype)
        if result is not None:
            self.define(result, value)
        self.body.append(Instruction(value, op, operands, attrs, location))
        if op == "literal" and isinstance(rtype, TensorType) and rtype.is_scalar:
            self.literal_values[id(value)] = attrs["value"]
        return value

    def fresh(self) -> str:
        while True:
            name = f"lit{self.synthesized}"
            self.synthesized += 1
            if name not in self.all_names:
                return name

    def operand(self, tree: Tree) -> Operand:
        first, type_tree = tree.children
        seen = self.types.get(id(type_tree))  # the fast path shares one tree per type text
        if seen is not None and seen[0] is type_tree:
            t = seen[1]
        else:
            t = read_type(self.src, type_tree)
            self.types[id(type_tree)] = (type_tree, t)
        if tree.data == "value_operand":
            name = str(first)[1:]
            value = self.env.get(name)
            if value is None:
                if name in self.def_names:
                    raise self.src.at(first, f"%{name} is used before it is defined")
                raise self.src.at(first, f"%{name} is not defined" + suggest(name, self.env))
            if value.type != t:
                raise self.src.at(type_tree, f"%{name} has type {value.type} but is written as {t}")
            return value
        if isinstance(t, TupleType):
            raise self.src.at(type_tree, f"a literal operand cannot have tuple type {t}")
        if t.is_scalar:
            return Const(read_scalar(self.src, first, t.dtype), t)
        # DLVM's `1: <2 x f32>`: a scalar broadcast to a tensor, as a literal instruction
        value = read_scalar(self.src, first, t.dtype)
        return self.emit(
            "literal", [], {"value": value, "type": t}, None, tree, self.src.location(tree)
        )

    def operands(self, tree: Tree) -> list[Operand]:
        return [self.operand(o) for o in tree.children]

    # -- per-op syntax (the printer's format_instruction, in reverse)
    def generic(self, tree: Tree):
        name, operands, *attr_trees = tree.children
        spec = OPS.get(str(name))
        if spec is None:
            raise self.src.at(name, f"unknown op '{name}'" + suggest(name, OPS))
        if spec.kind == WINDOW:
            attrs = read_window_attrs(self.src, str(name), name, attr_trees, read_int)
            return str(name), self.operands(operands), attrs
        if attr_trees:
            raise self.src.at(attr_trees[0], f"{name} takes no attributes")
        if spec.attrs:
            raise self.src.at(
                name,
                f"{name} is written with its attributes "
                f"({', '.join(spec.attrs)}); this generic form has none",
            )
        return str(name), self.operands(operands), {}

    def reduce(self, tree: Tree):
        x_tree, combinator, init_tree, *axes = tree.children
        x = self.operand(x_tree)
        if combinator not in REDUCE_COMBINATORS:
            raise self.src.at(
                combinator,
                f"unknown reduction '{combinator}'; expected one of "
                + ", ".join(REDUCE_COMBINATORS),
            )
        if not isinstance(x.type, TensorType):
            raise self.src.at(x_tree, f"reduce expects a tensor operand, got tuple {x.type}")
        init = self.operand(init_tree)
        dtype = x.type.dtype
        if isinstance(init, Const):
            value = init.value
        elif id(init) in self.literal_values:
            value = self.literal_values[id(init)]
        else:
            raise self.src.at(init_tree, "the init of reduce must be a scalar literal like 0: f32")
        if init.type != TensorType((), dtype):
            raise self.src.at(
                init_tree,
                f"init has type {init.type} but the reduced operand's elements are {dtype}",
            )
        axis_list = read_int_list(self.src, axes[0], "an axis") if axes else ()
        return "reduce", [x], {"combinator": str(combinator), "init": value, "axes": axis_list}

    def _shape(self, tree: Tree) -> tuple[int, ...]:
        if token(tree.children[0]).type == "SCALAR_KW":
            return ()
        if len(tree.children) > MAX_RANK:
            raise self.src.at(tree, f"shapes of rank {len(tree.children)} are not supported")
        shape = tuple(read_dim(self.src, d) for d in tree.children)
        problem = size_problem(shape, 1)
        if problem:
            raise self.src.at(tree, f"shape {' x '.join(map(str, shape))}: {problem}")
        return shape

    def shape_cast(self, tree: Tree):
        x, shape = tree.children
        return "shapeCast", [self.operand(x)], {"shape": self._shape(shape)}

    def broadcast(self, tree: Tree):
        x, shape = tree.children
        return "broadcast", [self.operand(x)], {"shape": self._shape(shape)}

    def pad_shape(self, tree: Tree):
        x, at = tree.children
        return "padShape", [self.operand(x)], {"at": read_int(self.src, at, "an axis")}

    def squeeze_shape(self, tree: Tree):
        x, at = tree.children
        return "squeezeShape", [self.operand(x)], {"at": read_int(self.src, at, "an axis")}

    def dtype_cast(self, tree: Tree):
        x, dtype = tree.children
        return "dataTypeCast", [self.operand(x)], {"dtype": read_dtype(self.src, dtype)}

    def transpose(self, tree: Tree):
        x, *perm = tree.children
        x = self.operand(x)
        attrs = {}
        if perm:
            attrs["perm"] = read_int_list(self.src, perm[0], "an axis")
            if isinstance(x.type, TensorType) and attrs["perm"] == tuple(
                reversed(range(x.type.rank))
            ):
                attrs = {}  # the default order; printed without `along`
        return "transpose", [x], attrs

    def concatenate(self, tree: Tree):
        operands, axis = tree.children
        return "concatenate", self.operands(operands), {"axis": read_int(self.src, axis, "an axis")}

    def slice(self, tree: Tree):
        x_tree, axis, lo, hi, *by = tree.children
        x = self.operand(x_tree)
        k = read_int(self.src, axis, "an axis")
        lo_, hi_ = read_int(self.src, lo, "a bound"), read_int(self.src, hi, "a bound")
        if isinstance(x.type, TensorType):  # point at the bound that is wrong
            if k >= x.type.rank:
                raise self.src.at(axis, f"axis {k} out of range for {x.type}")
            n = x.type.shape[k]
            if lo_ >= n:
                raise self.src.at(
                    lo, f"slice start {lo_} is outside axis {k} of {x.type} (0 to {n})"
                )
            if hi_ > n:
                raise self.src.at(hi, f"slice end {hi_} is outside axis {k} of {x.type} (0 to {n})")
            if hi_ <= lo_:
                raise self.src.at(hi, f"empty slice: the end {hi_} is not after the start {lo_}")
        attrs = {"axis": k, "lo": lo_, "hi": hi_}
        if by:
            step = read_int(self.src, by[0], "a step")
            if step < 1:
                raise self.src.at(by[0], "a slice step must be positive")
            if step > 1:  # step 1 is the plain slice: no attribute, printed without `by`
                attrs["step"] = step
        return "slice", [x], attrs

    def slice_scatter(self, tree: Tree):
        g_tree, axis, lo, step, size = tree.children
        g = self.operand(g_tree)
        k = self._indexed_axis(g, axis)
        lo_, n = read_int(self.src, lo, "a start"), read_int(self.src, size, "a size")
        s = read_int(self.src, step, "a step")
        if s < 1:
            raise self.src.at(step, "a slice step must be positive")
        if isinstance(g.type, TensorType) and lo_ + (g.type.shape[k] - 1) * s >= n:
            raise self.src.at(
                size, f"{g.type.shape[k]} entries from {lo_} by {s} do not fit in size {n}"
            )
        return "sliceScatter", [g], {"axis": k, "lo": lo_, "step": s, "size": n}

    def cumsum(self, tree: Tree):
        x_tree, axis, *rev = tree.children
        x = self.operand(x_tree)
        return "cumsum", [x], {"axis": self._indexed_axis(x, axis), "reverse": bool(rev)}

    def attention(self, tree: Tree):
        operands, scale, *causal = tree.children
        return (
            "attention",
            self.operands(operands),
            {"scale": float(token(scale)), "causal": int(bool(causal))},
        )

    def attention_backward(self, tree: Tree):
        operands, scale, *causal, wrt = tree.children
        return (
            "attentionBackward",
            self.operands(operands),
            {"scale": float(token(scale)), "causal": int(bool(causal)), "wrt": int(token(wrt))},
        )

    def take(self, tree: Tree):
        x_tree, ids_tree, axis = tree.children
        x, ids = self.operand(x_tree), self.operand(ids_tree)
        return "take", [x, ids], {"axis": self._indexed_axis(x, axis)}

    def scatter_add(self, tree: Tree):
        g_tree, ids_tree, axis, size = tree.children
        g, ids = self.operand(g_tree), self.operand(ids_tree)
        n = read_int(self.src, size, "a size")
        if n < 1:
            raise self.src.at(size, "the size of scatterAdd's result axis must be positive")
        return "scatterAdd", [g, ids], {"axis": self._indexed_axis(g, axis), "size": n}

    def _indexed_axis(self, x: Operand, axis: Token | Tree) -> int:
        k = read_int(self.src, axis, "an axis")
        if isinstance(x.type, TensorType) and k >= x.type.rank:  # point at the axis
            raise self.src.at(axis, f"axis {k} out of range for {x.type}")
        return k

    def extract(self, tree: Tree):
        index, x = tree.children
        return "extract", [self.operand(x)], {"index": read_int(self.src, index, "an index")}

    def select(self, tree: Tree):
        return "select", [self.operand(o) for o in tree.children], {}

    def literal(self, tree: Tree):
        value_tree, type_tree = tree.children
        t = read_type(self.src, type_tree)
        if isinstance(t, TupleType):
            raise self.src.at(
                type_tree,
                f"a literal value cannot have tuple type {t}; a tuple "
                "literal is written literal (%a: T, %b: T): (T, T)",
            )
        inner = value_tree.children[0]
        if inner.data == "scalar":
            return "literal", [], {"value": read_scalar(self.src, inner, t.dtype), "type": t}
        values, shape = read_array(self.src, inner, t.dtype)
        if shape != t.shape:
            raise self.src.at(
                value_tree,
                f"array literal has shape {'x'.join(map(str, shape))} but its type is {t}",
            )
        return "literal", [], {"value": np.array(values, dtype=t.dtype.numpy), "type": t}

    def tuple_literal(self, tree: Tree):
        operands, type_tree = tree.children
        ops = self.operands(operands)
        t = read_type(self.src, type_tree)
        types = tuple(o.type for o in ops)
        if not isinstance(t, TupleType) or t.elements != types:
            got = "(" + ", ".join(str(e) for e in types) + ")"  # as TupleType prints
            raise self.src.at(type_tree, f"the tuple's elements are {got} but it is written as {t}")
        return "tuple", ops, {}

    def apply(self, tree: Tree):
        callee_tok, *rest = tree.children
        operands = self.operands(rest[0]) if rest and rest[0].data == "operands" else []
        name = str(callee_tok)[1:]
        callee = self.module.functions.get(name)
        if callee is None:
            raise self.src.at(
                callee_tok,
                f"apply of unknown function @{name}" + suggest(name, self.module.functions),
            )
        got = [o.type for o in operands]
        if got != callee.param_types:
            raise self.src.at(
                callee_tok,
                f"@{name} takes ({', '.join(map(str, callee.param_types))}) "
                f"but is applied to ({', '.join(map(str, got))})",
            )
        if rest and rest[-1].data == "functype":
            params, result = read_functype(self.src, rest[-1])
            if params != callee.param_types or result != callee.result_type:
                raise self.src.at(
                    rest[-1],
                    f"@{name} has type ({', '.join(map(str, callee.param_types))})"
                    f" -> {callee.result_type}, not the one written here",
                )
        return "apply", operands, {"callee": name, "type": callee.result_type}


OP_SYNTAX = {
    "generic": FunctionReader.generic,
    "reduce": FunctionReader.reduce,
    "shape_cast": FunctionReader.shape_cast,
    "broadcast": FunctionReader.broadcast,
    "pad_shape": FunctionReader.pad_shape,
    "squeeze_shape": FunctionReader.squeeze_shape,
    "dtype_cast": FunctionReader.dtype_cast,
    "transpose": FunctionReader.transpose,
    "concatenate": FunctionReader.concatenate,
    "slice": FunctionReader.slice,
    "extract": FunctionReader.extract,
    "take": FunctionReader.take,
    "scatter_add": FunctionReader.scatter_add,
    "slice_scatter": FunctionReader.slice_scatter,
    "cumsum": FunctionReader.cumsum,
    "attention": FunctionReader.attention,
    "attention_backward": FunctionReader.attention_backward,
    "select": FunctionReader.select,
    "literal": FunctionReader.literal,
    "tuple_literal": FunctionReader.tuple_literal,
    "apply": FunctionReader.apply,
    **CONTROL_FLOW_SYNTAX,
}
