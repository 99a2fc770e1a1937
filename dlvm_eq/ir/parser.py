"""Parses DLVM textual IR (grammar.lark) into a Module; accepts exactly what the printer prints,
plus DLVM's own spellings (`[gradient ...]`, `apply @g(...): (T) -> T`, typed array elements,
`literal 1: <2 x f32>` operands, `init %c: f32`, branch-linked block chains; control-flow
graphs with `conditional`, structured into while/cond by cfg.py).

    m = parse('''
    module "demo"
    stage raw
    func @f: (<2 x f32>) -> <2 x f32> {
    'entry(%x: <2 x f32>):
        %0 = exp %x: <2 x f32>
        return %0: <2 x f32>
    }''')
    print(m)                     # prints the same module back

Every error is a SourceError naming file:line:col, the line with a caret, and what was expected.
"""

from __future__ import annotations

import bisect
import difflib
import gc
import heapq
import math
import re
from copy import copy
from pathlib import Path

import numpy as np
from lark import Lark, Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from ..errors import DlvmError, IRError, SourceError
from .cfg import Walker, has_conditional
from .control_flow import CONTROL_FLOW_OPS, bodies
from .control_flow_syntax import SYNTAX as CONTROL_FLOW_SYNTAX
from .fastlines import names as fast_names
from .fastlines import scan
from .module import AdjointDecl, Const, Function, Instruction, Module, Operand, Value
from .ops import OPS, REDUCE_COMBINATORS, WINDOW
from .parser_tables import lark_parser
from .types import DType, TensorType, TupleType, Type, size_problem
from .window_syntax import read_window_attrs

MAX_RANK = 32  # numpy's limit is 64; no real program comes near either
MAX_DIM = 2**31 - 1
_DTYPES = {d.value: d for d in DType}
_INT = re.compile(r"[+-]?\d+$")

_lark: Lark | None = None


def _parser() -> Lark:
    global _lark
    if _lark is None:
        grammar = Path(__file__).with_name("grammar.lark").read_text()
        # tables as JSON data in the compile cache (never lark's own pickle cache)
        _lark = lark_parser(
            grammar, parser="lalr", propagate_positions=True, maybe_placeholders=False
        )
    return _lark


def parse(text: str, filename: str = "<string>") -> Module:
    """Parse DLVM textual IR into a Module; raises SourceError (a DlvmError) on any mistake.

    Whole lines of the generic instruction form are read without lark (fastlines.py); on any
    error the file is read again by lark alone, which reports it."""
    if text.startswith("\ufeff"):  # a UTF-8 byte order mark, as some editors write
        text = text[1:]
    collecting = gc.isenabled()
    gc.disable()  # a parse allocates millions of objects: the collector's passes went quadratic
    try:
        lark_text, fast = scan(text)
        if fast:
            try:
                return _parse(text, filename, lark_text, fast)
            except (DlvmError, _Unplaced):
                pass
        return _parse(text, filename, text, {})
    finally:
        if collecting:
            gc.enable()


class _Unplaced(Exception):
    """A fast-path line outside every block: lark alone says what is wrong there."""


def _parse(text: str, filename: str, lark_text: str, fast: dict) -> Module:
    src = _Source(text, filename, fast)
    try:
        tree = _parser().parse(lark_text)
    except UnexpectedInput as e:
        raise _syntax_error(e, src) from None
    except LarkError as e:  # pragma: no cover - any other lark failure is still the user's input
        raise src.error(f"cannot parse: {e}", 1, 1) from None
    try:
        module = _ModuleReader(src).read(tree)
    except RecursionError:
        raise src.error("the program is nested too deeply", 1, 1) from None
    if src.fast_used != len(fast):
        raise _Unplaced()
    return module


def load(path) -> Module:
    """Read and parse a .dl file."""
    return parse(read_source(path), str(path))


def read_source(path) -> str:
    """A .dl file's text, or a DlvmError saying why it cannot be read."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DlvmError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DlvmError(f"{path}: is a directory, not a .dl file") from None
    except UnicodeDecodeError as e:
        raise DlvmError(
            f"{path}: not a text file (UTF-8 decoding failed at byte {e.start})"
        ) from None
    except OSError as e:
        raise DlvmError(f"{path}: cannot read: {e.strerror or e}") from None
    return text


# ---------------------------------------------------------------- positions and errors


class _Source:
    def __init__(self, text: str, filename: str, fast: dict | None = None):
        self.text, self.filename = text, filename
        self.lines = text.split("\n")  # lines as lark counts them
        self.fast = fast or {}  # line -> inst tree read by fastlines.scan
        self.fast_lines = sorted(self.fast)
        self.fast_used = 0

    def fast_between(self, first: int, last: int) -> list[int]:
        """The fast-path lines strictly between lines `first` and `last`."""
        keys = self.fast_lines
        return keys[bisect.bisect_right(keys, first) : bisect.bisect_left(keys, last)]

    def error(self, message: str, line: int, column: int) -> SourceError:
        line = max(1, min(line, len(self.lines)))
        # tabs shown as one space each keep the caret under the column
        source_line = self.lines[line - 1].rstrip("\r").replace("\t", " ")
        return SourceError(message, self.filename, line, column, source_line)

    def at(self, node, message: str) -> SourceError:
        return self.error(message, *_pos(node))

    def location(self, node) -> tuple[str, int, int]:
        return (self.filename, *_pos(node))

    def end(self) -> tuple[int, int]:
        return len(self.lines), len(self.lines[-1]) + 1


def _pos(node) -> tuple[int, int]:
    if isinstance(node, Token):
        return node.line or 1, node.column or 1
    if isinstance(node, Tree):
        if not node.meta.empty:
            return node.meta.line, node.meta.column
        for child in node.children:
            return _pos(child)
    return 1, 1


# What a user reads for each terminal; keywords and punctuation read as themselves.
_TERMINAL_WORDS = {
    "VALUE": "a value like %x",
    "GLOBAL": "a function name like @f",
    "LABEL": "a block label like 'entry",
    "NAME": "a name",
    "NUMBER": "a number",
    "STRING": 'a quoted string like "name"',
    "ADJOINT_KW": "'adjoint'",
    "INF": "'inf'",
    "$END": "the end of the file",
}


def _words(names, terminals) -> list[str]:
    ops = {n for n in names if n in terminals and terminals[n].pattern.value in OPS}
    words = set()
    if ops:  # after `%v =`: every op keyword and NAME (generic ops) are expected
        names = set(names) - ops - {"NAME"}
        words.add("an op name like add, exp, dot or reduce")
    for n in names:
        if n in _TERMINAL_WORDS:
            words.add(_TERMINAL_WORDS[n])
        elif n in terminals:
            words.add(f"'{terminals[n].pattern.value}'")
    return sorted(words)


def _accepts(state) -> set[str]:
    """Terminals that the LALR parser in `state` can take next (as lark's InteractiveParser)."""
    conf = copy(state.parse_conf)
    conf.callbacks = {}
    out = set()
    for t in conf.states[state.position]:
        if not t.isupper():
            continue
        s = state.copy(deepcopy_values=False)
        s.parse_conf = conf
        try:
            s.feed_token(Token(t, ""), is_end=(t == "$END"))
        except (UnexpectedToken, AssertionError):
            continue
        out.add(t)
    return out


def _syntax_error(e: UnexpectedInput, src: _Source) -> SourceError:
    terminals = {t.name: t for t in _parser().terminals}
    if isinstance(e, UnexpectedToken):
        expected = e.accepts or e.expected
        if e.token.type == "$END":
            line, col = src.end()
            found = "end of file"
        else:
            line, col = e.line, e.column
            found = f"'{_shorten(e.token.value)}'"
    elif isinstance(e, UnexpectedCharacters):
        expected = _accepts(e.state) if e.state is not None else e.allowed
        line, col = e.line, e.column
        found = f"character {src.text[e.pos_in_stream]!r}"
    else:  # pragma: no cover - UnexpectedEOF is not raised by the LALR parser
        line, col = src.end()
        expected, found = set(), "end of file"
    words = _words(expected or (), terminals)
    message = f"unexpected {found}"
    if words:
        message += "; expected " + (words[0] if len(words) == 1 else "one of: " + ", ".join(words))
    return src.error(message, line, col)


def _shorten(s: str, n: int = 24) -> str:
    return s if len(s) <= n else s[:n] + "..."


def _suggest(name: str, choices) -> str:
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=3)
    if not close:
        return ""
    return "; did you mean " + " or ".join(f"'{c}'" for c in close) + "?"


# ---------------------------------------------------------------- module


class _ModuleReader:
    def __init__(self, src: _Source):
        self.src = src

    def read(self, tree: Tree) -> Module:
        module = Module()
        funcs: list[tuple[Tree, Tree | None, Function]] = []
        for node in tree.children:
            if node.data == "module_decl":
                module.name = node.children[0][1:-1]
            elif node.data == "stage_decl":
                stage = node.children[0]
                if stage not in ("raw", "optimizable"):
                    raise self.src.at(
                        stage, f"unknown stage '{stage}'; expected raw or optimizable"
                    )
                module.stage = str(stage)
            else:
                adjoint = node.children[0] if len(node.children) == 2 else None
                funcdef = node.children[-1]
                fn = self.signature(funcdef, adjoint)
                if fn.name in module.functions:
                    first = module.functions[fn.name].location
                    raise self.src.at(
                        funcdef.children[0],
                        f"function @{fn.name} is already defined at line {first[1]}",
                    )
                module.functions[fn.name] = fn
                funcs.append((funcdef, adjoint, fn))
        for funcdef, adjoint, fn in funcs:
            if adjoint is not None:
                self.check_adjoint(adjoint, fn, module)
            body = funcdef.children[2] if len(funcdef.children) == 3 else None
            if body is not None:
                _FunctionReader(self.src, module, fn).read(body)
            elif adjoint is None:
                raise self.src.at(
                    funcdef,
                    f"function @{fn.name} has no body; only a function declared "
                    "with [adjoint @g ...] may omit it",
                )
        self.check_recursion(module)
        return module

    def signature(self, funcdef: Tree, adjoint: Tree | None) -> Function:
        name_tok, functype = funcdef.children[0], funcdef.children[1]
        params, result = self.functype(functype)
        names = [f"arg{i}" for i in range(len(params))]
        if len(funcdef.children) == 3:  # the entry block's names, for messages read before it
            entry = funcdef.children[2].children[0].children
            if len(entry) > 1 and isinstance(entry[1], Tree) and entry[1].data == "block_params":
                written = [str(p.children[0])[1:] for p in entry[1].children]
                names = written if len(written) == len(names) else names
        fn = Function(
            name_tok[1:],
            [Value(n, t) for n, t in zip(names, params)],
            result,
            location=self.src.location(funcdef),
        )
        if adjoint is not None:
            fn.adjoint = self.adjoint(adjoint)
        return fn

    def functype(self, tree: Tree) -> tuple[list[Type], Type]:
        *params, result = [read_type(self.src, t) for t in tree.children]
        for node, t in zip(tree.children, params):
            if isinstance(t, TupleType):
                raise self.src.at(node, f"a parameter cannot have tuple type {t}")
        return params, result

    def adjoint(self, tree: Tree) -> AdjointDecl:
        decl = AdjointDecl(of=tree.children[1][1:])
        for part in tree.children[2:]:
            if part.data == "adj_from":
                decl.from_index = read_int(self.src, part.children[0], "an output index")
            elif part.data == "adj_wrt":
                decl.wrt = read_int_list(self.src, part.children[0], "a parameter index")
            elif part.data == "adj_keeping":
                decl.keeping = read_int_list(self.src, part.children[0], "an output index")
            else:
                decl.seedable = True
        return decl

    def check_adjoint(self, tree: Tree, fn: Function, module: Module) -> None:
        decl = fn.adjoint
        if decl.of not in module.functions:
            raise self.src.at(
                tree.children[1],
                f"[adjoint] of unknown function @{decl.of}" + _suggest(decl.of, module.functions),
            )
        if decl.of == fn.name:
            raise self.src.at(tree.children[1], f"@{fn.name} cannot be the adjoint of itself")
        of = module.functions[decl.of]
        n_out = len(of.result_type.elements) if isinstance(of.result_type, TupleType) else 1
        limits = {
            "adj_from": (n_out, "output"),
            "adj_wrt": (len(of.params), "parameter"),
            "adj_keeping": (n_out, "output"),
        }
        for part in tree.children[2:]:
            if part.data not in limits:
                continue
            limit, what = limits[part.data]
            for tok in part.children[0].children if part.data != "adj_from" else part.children:
                if int(tok) >= limit:
                    raise self.src.at(
                        tok,
                        f"@{of.name} has {limit} {what}{'s' * (limit != 1)}; "
                        f"{what} index {int(tok)} is out of range",
                    )

    def check_recursion(self, module: Module) -> None:
        calls = {
            name: [i for i in fn.body if i.op == "apply" or i.op in CONTROL_FLOW_OPS]
            for name, fn in module.functions.items()
        }
        done: set[str] = set()

        def visit(name: str, stack: list[str]):
            if name in done:
                return
            stack = stack + [name]
            for inst in calls[name]:
                for callee in _callees(inst):
                    if callee in stack:
                        cycle = " -> ".join(
                            "@" + n for n in stack[stack.index(callee) :] + [callee]
                        )
                        raise self.src.error(
                            f"recursive {inst.op} is not supported ({cycle})", *inst.location[1:]
                        )
                    visit(callee, stack)
            done.add(name)

        for name in module.functions:
            visit(name, [])


def _callees(inst) -> list[str]:
    """The functions an instruction runs: apply's callee, a control-flow op's bodies."""
    if inst.op == "apply":
        return [inst.attrs["callee"]]
    return [b.name for b in bodies(inst.attrs)]


# ---------------------------------------------------------------- types, numbers, literals


def read_type(src: _Source, tree: Tree) -> Type:
    if tree.data == "scalar_type":
        return TensorType((), read_dtype(src, tree.children[0]))
    if tree.data == "tensor_type":
        *dims, dtype = tree.children
        if len(dims) > MAX_RANK:
            raise src.at(
                tree, f"tensors of rank {len(dims)} are not supported (at most {MAX_RANK})"
            )
        t = TensorType(tuple(read_dim(src, d) for d in dims), read_dtype(src, dtype))
        problem = size_problem(t.shape, t.dtype.itemsize)
        if problem:
            raise src.at(tree, f"{t}: {problem}")
        return t
    elements = [read_type(src, t) for t in tree.children]
    for node, t in zip(tree.children, elements):
        if isinstance(t, TupleType):
            raise src.at(node, "tuples cannot be nested")
    return TupleType(tuple(elements))


def read_dtype(src: _Source, tok: Token) -> DType:
    try:
        return _DTYPES[str(tok)]
    except KeyError:
        raise src.at(tok, f"unknown data type '{tok}'; expected f32, f64, i32 or bool") from None


def read_int(src: _Source, tok: Token, what: str) -> int:
    if not re.fullmatch(r"\d+", tok):
        raise src.at(tok, f"expected {what} (a non-negative integer), got '{_shorten(tok)}'")
    value = int(tok)
    if value > MAX_DIM:
        raise src.at(tok, f"{what} {_shorten(tok)} is too large")
    return value


def read_dim(src: _Source, tok: Token) -> int:
    return read_int(src, tok, "a dimension")


def read_int_list(src: _Source, tree: Tree, what: str) -> tuple[int, ...]:
    values = tuple(read_int(src, t, what) for t in tree.children)
    for i, v in enumerate(values):
        if v in values[:i]:
            raise src.at(tree.children[i], f"{what} {v} is listed twice")
    return values


def read_scalar(src: _Source, tree: Tree, dtype: DType):
    """The value of a scalar literal token as a Python value of `dtype` (f32 values rounded)."""
    tok: Token = tree.children[0]
    text = str(tok)
    if dtype is DType.bool:
        if tok.type not in ("TRUE", "FALSE"):
            raise src.at(tok, f"expected true or false for a bool literal, got '{_shorten(text)}'")
        return tok.type == "TRUE"
    if tok.type in ("TRUE", "FALSE"):
        raise src.at(tok, f"'{text}' is a bool literal, but the type is {dtype}")
    if dtype is DType.i32:
        if not _INT.match(text):
            raise src.at(tok, f"expected an integer for an i32 literal, got '{_shorten(text)}'")
        value = int(text)
        if not -(2**31) <= value < 2**31:
            raise src.at(tok, f"{_shorten(text)} is out of range for i32")
        return value
    value = {"NAN": math.nan, "INF": math.inf, "NEG_INF": -math.inf}.get(tok.type)
    if value is None:
        value = float(text)
        with np.errstate(over="ignore"):
            overflow = math.isinf(np.asarray(value, dtype=dtype.numpy))
        if overflow:
            raise src.at(tok, f"{_shorten(text)} is out of range for {dtype}")
    return Const.of(value, dtype).value


def read_array(src: _Source, tree: Tree, dtype: DType) -> tuple[list, tuple[int, ...]]:
    """A `<...>` array literal: nested lists of values and the shape, checked rectangular."""
    values, shapes = [], []
    for elem in tree.children:
        inner, *annotation = elem.children
        if inner.data == "array":
            value, shape = read_array(src, inner, dtype)
        else:
            value, shape = read_scalar(src, inner, dtype), ()
        if annotation:
            t = read_type(src, annotation[0])
            if t != TensorType(shape, dtype):
                raise src.at(
                    annotation[0],
                    f"this element is a {TensorType(shape, dtype)} but is written as {t}",
                )
        if shapes and shape != shapes[0]:
            raise src.at(
                elem,
                f"array literal is ragged: element of shape {shape} after elements "
                f"of shape {shapes[0]}",
            )
        values.append(value)
        shapes.append(shape)
    shape = (len(values),) + shapes[0]
    if len(shape) > MAX_RANK:
        raise src.at(
            tree, f"array literal of rank {len(shape)} is not supported (at most {MAX_RANK})"
        )
    return values, shape


# ---------------------------------------------------------------- function bodies


class _FunctionReader:
    """Reads one function's blocks into a straight-line body."""

    def __init__(self, src: _Source, module: Module, fn: Function):
        self.src, self.module, self.fn = src, module, fn
        self.env: dict[str, Operand] = {}
        self.defined_at: dict[str, tuple[int, int]] = {}
        self.literal_values: dict[int, object] = {}  # id(Value) of scalar literals -> value
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
        lines = self.src.fast_between(block.meta.line, _pos(term)[0])
        if not lines:
            return insts
        self.src.fast_used += len(lines)
        fast = [(line, self.src.fast[line]) for line in lines]
        slow = [(_pos(i)[0], i) for i in insts]
        return [t for _, t in heapq.merge(fast, slow, key=lambda p: p[0])]

    def block_params(self, block: Tree) -> list[tuple[Token, Type]]:
        node = block.children[1] if len(block.children) > 1 else None
        if not isinstance(node, Tree) or node.data != "block_params":
            return []
        out = []
        for param in node.children:
            tok, t = param.children
            t_ = read_type(self.src, t)
            if isinstance(t_, TupleType):
                raise self.src.at(t, f"a block parameter cannot have tuple type {t_}")
            out.append((tok, t_))
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
                label, f"no block {label} in @{self.fn.name}" + _suggest(label, blocks)
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

    def define(self, tok: Token, value: Operand) -> Operand:
        name = str(tok)[1:]
        if name in self.env:
            line, col = self.defined_at[name]
            raise self.src.at(tok, f"%{name} is already defined (at line {line}, column {col})")
        self.env[name] = value
        self.defined_at[name] = _pos(tok)
        return value

    # -- instructions
    def instruction(self, inst: Tree) -> None:
        result, op_tree = inst.children
        op, operands, attrs = _OP_SYNTAX[op_tree.data](self, op_tree)
        self.emit(op, operands, attrs, result, op_tree, self.src.location(inst))

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
                raise self.src.at(first, f"%{name} is not defined" + _suggest(name, self.env))
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
            raise self.src.at(name, f"unknown op '{name}'" + _suggest(name, OPS))
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
        axes = read_int_list(self.src, axes[0], "an axis") if axes else ()
        return "reduce", [x], {"combinator": str(combinator), "init": value, "axes": axes}

    def _shape(self, tree: Tree) -> tuple[int, ...]:
        if tree.children[0].type == "SCALAR_KW":
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

    def _indexed_axis(self, x: Operand, axis: Token) -> int:
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
        got = TupleType(tuple(o.type for o in ops))
        if t != got:
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
                f"apply of unknown function @{name}" + _suggest(name, self.module.functions),
            )
        got = [o.type for o in operands]
        if got != callee.param_types:
            raise self.src.at(
                callee_tok,
                f"@{name} takes ({', '.join(map(str, callee.param_types))}) "
                f"but is applied to ({', '.join(map(str, got))})",
            )
        if rest and rest[-1].data == "functype":
            params, result = _ModuleReader(self.src).functype(rest[-1])
            if params != callee.param_types or result != callee.result_type:
                raise self.src.at(
                    rest[-1],
                    f"@{name} has type ({', '.join(map(str, callee.param_types))})"
                    f" -> {callee.result_type}, not the one written here",
                )
        return "apply", operands, {"callee": name, "type": callee.result_type}


_OP_SYNTAX = {
    "generic": _FunctionReader.generic,
    "reduce": _FunctionReader.reduce,
    "shape_cast": _FunctionReader.shape_cast,
    "broadcast": _FunctionReader.broadcast,
    "pad_shape": _FunctionReader.pad_shape,
    "squeeze_shape": _FunctionReader.squeeze_shape,
    "dtype_cast": _FunctionReader.dtype_cast,
    "transpose": _FunctionReader.transpose,
    "concatenate": _FunctionReader.concatenate,
    "slice": _FunctionReader.slice,
    "extract": _FunctionReader.extract,
    "take": _FunctionReader.take,
    "scatter_add": _FunctionReader.scatter_add,
    "slice_scatter": _FunctionReader.slice_scatter,
    "cumsum": _FunctionReader.cumsum,
    "select": _FunctionReader.select,
    "literal": _FunctionReader.literal,
    "tuple_literal": _FunctionReader.tuple_literal,
    "apply": _FunctionReader.apply,
    **CONTROL_FLOW_SYNTAX,
}
