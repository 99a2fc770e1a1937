"""One egglog e-graph holding the schema, rule files and loaded programs.

s = EGraphSession()                     # schema.egg loaded
s.add_rules_file("rules/algebra.egg")
prog = s.add_function(fn, module)        # the function's terms, roots are its results
s.run_analysis()
graph = s.serialize(prog.roots)          # Graph with root e-classes in order
"""

from __future__ import annotations

import json
import math
import re
import threading
from pathlib import Path

from ..errors import DlvmError
from ..ir.module import Function, Module
from ..sexpr import parens
from .egglog_bindings import (
    AddRuleset,
    Call,
    EggSmolError,
    EGraph,
    Int,
    Lit,
    PanicSpan,
    UnstableCombinedRuleset,
)
from .egglog_bindings import Var as EggVar
from .exit_gate import in_egglog, owned
from .lets import Let
from .loader import LoadedProgram, load_function
from .rule_program import parsed_program
from .rule_text import RuleFileError, RuleIndex, is_shipped
from .rulefiles import read_rule_file, rule_file
from .scratch_rules import ScratchRules
from .serialized import Graph
from .values import MARKER_DECLARATION, BoundValues, drop_markers


class EgglogPanic(DlvmError):
    """egglog failed inside its Rust code (a pyo3 panic, which Python sees as a BaseException):
    the session is left in an unknown state and is not used again."""


def _is_panic(err: BaseException) -> bool:
    # pyo3's PanicException lives in a module pyo3 creates at run time: match it by name
    return type(err).__name__ == "PanicException" and type(err).__module__ == "pyo3_runtime"


def _panic_error(err: BaseException, what: str) -> EgglogPanic:
    first = (str(err).strip().splitlines() or ["no message"])[0]
    return EgglogPanic(
        f"egglog failed while {what}: {first} (this is a bug in dlvm_eq or "
        "egglog, not in your program; please report it)"
    )


_LOCATION = re.compile(r"In (\d+):(\d+)-(\d+:)?(\d+) of ([^:\n]+)")


def egg_error(err: Exception, text: str, filename: str) -> DlvmError:
    """egglog's error as the project's own, pointing at the file, line and rule text."""
    msg = str(err).strip()
    lines = text.splitlines()
    if "end of file" in msg:  # egglog points at the end; the mistake is the open paren
        at = unclosed_paren(text)
        if at is not None:
            line, col = at
            return RuleFileError(
                "this '(' is never closed (no matching ')' before the end of the file)",
                filename,
                line,
                col,
                lines[line - 1] if line <= len(lines) else None,
            )
    m = _LOCATION.search(msg)
    if m:
        line, col = int(m.group(1)), int(m.group(2))
        src = lines[line - 1] if 0 < line <= len(lines) else None
        clean = _LOCATION.sub("", msg).strip(" :\n")
        return RuleFileError(clean or msg, filename, line, col, src)
    return RuleFileError(msg, filename)


def _duplicate_error(err: EgglogPanic, index: RuleIndex, filename: str) -> DlvmError | None:
    """egglog's panic on a rule defined twice that our index did not see (two spellings it
    prints alike) as the user's error, naming the first definition where known; None for
    other panics."""
    m = re.search(r"Rule '(.*)' was already present", str(err), re.S)
    if m is None:
        return None
    first = index.where(m.group(1))
    at = f" (first defined at {first[0]}:{first[1]})" if first else ""
    name = " ".join(m.group(1).split())
    return RuleFileError(f"a rule is defined twice{at}: {name}", filename)


def unclosed_paren(text: str) -> tuple[int, int] | None:
    """(line, column) of the outermost '(' that is never closed, strings and ; comments
    skipped; None when every '(' is closed.

    >>> unclosed_paren('(a (b)\n(c)')
    (1, 1)
    """
    stack: list[tuple[int, int]] = []
    for c, _, line, col in parens(text):
        if c == "(":
            stack.append((line, col))
        elif stack:
            stack.pop()
    return stack[0] if stack else None


class EGraphSession:
    """One egglog e-graph. egglog's EGraph is `unsendable` (pyo3): only the thread that made it
    may use it, so a session refuses calls from another thread (caches keep one per thread)."""

    def __init__(self, schema: bool = True, prune: bool = False):
        self.thread = threading.get_ident()
        self.broken = False  # a panic left egglog in an unknown state
        self.egraph = EGraph()
        owned(self)  # at interpreter exit, never dropped on another thread (exit_gate.py)
        self.files: list[str] = []
        self.rulesets: list[str] = []  # declared so far: running an unknown one panics egglog
        self.rule_index = RuleIndex()  # the rules loaded, by egglog's name: where each is
        self.user_rules: list[str] = []  # rule sources not shipped: their e-nodes are checked
        self._unindexed: dict[str, str] = {}  # shipped files not indexed yet: name -> text
        self._programs = 0
        self.values = BoundValues()  # our let names -> rows of the marker function
        self._marker = False
        # prune: compile only the rules a scratch program can fire (scratch_rules.py)
        self.pruned = ScratchRules(self) if prune else None
        if schema:
            self.add_rules_file(rule_file("schema.egg"))
            self.declare_marker()

    def declare_marker(self) -> None:
        """Declare the marker function the loaders' values are bound through (see values.py);
        after the Term sort, before any push."""
        if not self._marker:
            if self.pruned is not None:
                self.pruned.run_base(MARKER_DECLARATION, "<marker>")
            else:
                self.run_text(MARKER_DECLARATION, "<marker>")
            self._marker = True

    def _check_usable(self) -> None:
        if self.thread != threading.get_ident():
            raise DlvmError(
                "an e-graph session is used from a thread other than the one that "
                "made it (egglog's e-graphs belong to one thread)"
            )
        if self.broken:
            raise EgglogPanic("this e-graph session failed earlier and cannot be used again")

    def push(self, rulesets=None) -> None:
        """egglog's (push); `rulesets`: those the program up to the matching pop runs (None:
        any), which a pruned session compiles rules of (more is found and compiled when run)."""
        if self.pruned is not None:
            self.pruned.next_rulesets = rulesets
        self.run_text("(push)")

    def run_text(self, text: str, filename: str = "<egglog>"):
        """Run egglog commands; `$names` bound by add_lets are read as their marker rows."""
        self._check_usable()
        if self.pruned is not None:
            return self.pruned.run_text(text, filename)
        return self.plain_run_text(text, filename)

    def plain_run_text(self, text: str, filename: str = "<egglog>"):
        """run_text without a pruned session's bookkeeping (scratch_rules.py calls it)."""
        command = text.strip()
        if command == "(push)":
            self.values.push()
        elif command == "(pop)":
            self.values.pop()
        elif "$" in text:
            text = self.values.refer(text)
        return self._run(lambda: self.egraph.parse_program(text, filename=filename), text, filename)

    def _run(self, parse, text: str, filename: str):
        """Run the commands parse() returns; egglog's errors as the project's own."""
        try:
            with in_egglog():  # the interpreter's exit waits for it (exit_gate.py)
                commands = parse()
                out = self.egraph.run_program(*commands)
        except EggSmolError as e:
            raise egg_error(e, text, filename) from None
        except BaseException as e:
            if not _is_panic(e):
                raise
            self.broken = True
            raise _panic_error(e, f"running {filename}") from None
        self.rulesets.extend(
            c.name for c in commands if isinstance(c, (AddRuleset, UnstableCombinedRuleset))
        )
        return out

    def add_rules_file(self, path: str | Path):
        text, filename = read_rule_file(path)
        self.files.append(filename)
        return self.add_rules_text(text, filename)

    def add_rules_text(self, text: str, filename: str = "<rules>"):
        """Declarations and rules (no `$` names, no push/pop), checked by us before egglog
        parses them (rule_text.py: depth, commands, duplicates), parsed once per process
        (rule_program.py), compiled into this session's e-graph."""
        self._check_usable()
        trusted = is_shipped(filename)
        if trusted and filename not in self._unindexed and not self.user_rules:
            # checked in CI: indexed only once another file joins, whose rules are then
            # checked against them (a third of the rule files' Python time in a cold compile)
            self._unindexed[filename] = text
        else:
            for name, shipped in self._unindexed.items():
                self.rule_index.add(shipped, name)
            self._unindexed.clear()
            self.rule_index.add(text, filename)
            if not trusted:
                self.user_rules.append(filename)
        try:
            if self.pruned is not None:
                return self.pruned.add_rules_text(text, filename, trusted)
            return self._run(lambda: parsed_program(text, filename), text, filename)
        except EgglogPanic as e:
            raise _duplicate_error(e, self.rule_index, filename) or e from None

    def add_function(self, fn: Function, module: Module | None = None) -> LoadedProgram:
        prefix = f"p{self._programs}_"
        self._programs += 1
        prog = load_function(fn, module, prefix=prefix)
        self.add_lets(prog.lets, f"<program @{fn.name}>")
        return prog

    def add_lets(
        self, lets: list[Let], filename: str = "<egglog>", facts: bool = True, chunk: int = 64
    ) -> None:
        """Bind Lets (lets.py) as rows of the marker function (values.py says why), in
        chunks: egglog's time per command grows with the length of the text it came in
        (measured: 2,100 lets of a 1,000-op program, 3.8 s in one text, 0.6 s in chunks of
        64). facts: set the shapes and dtypes of leaves (an e-graph with the analysis)."""
        self._need_marker()
        for i in range(0, len(lets), chunk):
            self.run_text(self.values.bind(lets[i : i + chunk], facts), filename)

    def add_globals(self, lets: list[Let], filename: str = "<egglog>") -> None:
        """Bind Lets as egglog globals (for sorts the marker function cannot hold: fusion's
        Scalar loads); their operands are read through the marker rows."""
        self._run_lines([f"(let {let.name} {let.term(self.values.ref)})" for let in lets], filename)

    def delete(self, lets: list[Let], filename: str = "<egglog>") -> None:
        """Delete the e-nodes of these Lets' terms (their rows stay: they name e-classes)."""
        self._run_lines([f"(delete {let.term(self.values.ref)})" for let in lets], filename)

    def _run_lines(self, lines: list[str], filename: str, chunk: int = 64) -> None:
        """One-command lines run in chunks (as add_lets: egglog's time per command grows with
        the length of its text; a tanh-128 gradient's 641 deletes took 0.49 s in one text)."""
        for i in range(0, len(lines), chunk):
            self.run_text("\n".join(lines[i : i + chunk]) + "\n", filename)

    def _need_marker(self) -> None:
        if not self._marker:
            raise DlvmError(
                "this e-graph session has no marker function declared "
                "(EGraphSession.declare_marker) to bind program values with"
            )

    def run_analysis(self):
        return self.run_text("(run-schedule (saturate (run analysis)))")

    def serialize(
        self, roots: list[str], terms_only: bool = False, max_rows: int | None = None
    ) -> Graph:
        """The e-graph as extraction-gym JSON; `roots` are let names, e.g. prog.roots (the
        marker function's rows are left out: readers see only terms and analyses).
        terms_only: leave out the rows of functions outside Term classes (the analyses'
        `shape`, `dtype`, ...): never extracted, they are a third of a saturated e-graph.
        max_rows: at most this many rows per function (egglog's max_calls_per_function), for
        when time is short; a class whose rows were all cut keeps egglog's placeholder node,
        costed infinite, so extraction never picks it."""
        self._check_usable()
        if self.pruned is not None:
            self.pruned.settle()
        span = PanicSpan()
        try:
            exprs = []
            for r in roots:
                row = self.values.row(r)
                exprs.append(
                    EggVar(span, r)
                    if row is None
                    else Call(span, self.values.marker, [Lit(span, Int(row))])
                )
            with in_egglog():
                ser = self.egraph.serialize(exprs, max_calls_per_function=max_rows)
                text = ser.to_json()
        except BaseException as e:
            if not _is_panic(e):
                raise
            self.broken = True
            raise _panic_error(e, "serializing the e-graph") from None
        data = json.loads(text)
        drop_markers(data, self.values.marker)
        if max_rows is not None:
            for nid, d in data["nodes"].items():
                if nid.startswith("dummy-"):
                    d["cost"] = math.inf
        if terms_only:
            term = {c for c, d in data.get("class_data", {}).items() if d.get("type") == "Term"}
            data["nodes"] = {
                n: d
                for n, d in data["nodes"].items()
                if d["eclass"] in term or not n.startswith("function-")
            }
        return Graph(data)
