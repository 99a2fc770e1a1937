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

import gc
import re
from copy import copy
from pathlib import Path

from lark import Lark, Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from ..errors import DlvmError, SourceError
from .control_flow import CONTROL_FLOW_OPS, bodies
from .fastlines import scan
from .function_reader import FunctionReader
from .module import AdjointDecl, Function, Module, Value
from .ops import OPS
from .parser_tables import lark_parser
from .source_text import (
    Source,
    read_functype,
    read_int,
    read_int_list,
    shorten,
    suggest,
    token,
)
from .types import DType, TupleType, Type

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
    src = Source(text, filename, fast)
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


def _syntax_error(e: UnexpectedInput, src: Source) -> SourceError:
    terminals = {t.name: t for t in _parser().terminals}
    if isinstance(e, UnexpectedToken):
        expected = e.accepts or e.expected
        if e.token.type == "$END":
            line, col = src.end()
            found = "end of file"
        else:
            line, col = e.line, e.column
            found = f"'{shorten(e.token.value)}'"
    elif isinstance(e, UnexpectedCharacters):
        expected = _accepts(e.state) if e.state is not None else e.allowed
        line, col = e.line, e.column
        assert e.pos_in_stream is not None  # lark sets it on UnexpectedCharacters
        found = f"character {src.text[e.pos_in_stream]!r}"
    else:  # pragma: no cover - UnexpectedEOF is not raised by the LALR parser
        line, col = src.end()
        expected, found = set(), "end of file"
    words = _words(expected or (), terminals)
    message = f"unexpected {found}"
    if words:
        message += "; expected " + (words[0] if len(words) == 1 else "one of: " + ", ".join(words))
    return src.error(message, line, col)


# ---------------------------------------------------------------- module


class _ModuleReader:
    def __init__(self, src: Source):
        self.src = src

    def read(self, tree: Tree) -> Module:
        module = Module()
        funcs: list[tuple[Tree, Tree | None, Function]] = []
        for node in tree.children:
            if node.data == "module_decl":
                module.name = str(node.children[0])[1:-1]
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
                    assert first is not None  # every function read here has its location
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
                FunctionReader(self.src, module, fn).read(body)
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
            str(name_tok)[1:],
            [Value(n, t) for n, t in zip(names, params)],
            result,
            location=self.src.location(funcdef),
        )
        if adjoint is not None:
            fn.adjoint = self.adjoint(adjoint)
        return fn

    def functype(self, tree: Tree) -> tuple[list[Type], Type]:
        return read_functype(self.src, tree)

    def adjoint(self, tree: Tree) -> AdjointDecl:
        decl = AdjointDecl(of=str(tree.children[1])[1:])
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
        assert decl is not None  # read by adjoint() before this check
        if decl.of not in module.functions:
            raise self.src.at(
                tree.children[1],
                f"[adjoint] of unknown function @{decl.of}" + suggest(decl.of, module.functions),
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
            for node in part.children[0].children if part.data != "adj_from" else part.children:
                tok = token(node)
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
                        assert inst.location is not None  # the reader located every call
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
