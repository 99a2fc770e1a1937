"""A pruned session: rules compiled only once a program needs them (issue 32: compiling all
~550 rules of the shipped files cost a cold compile ~0.5 ms each).

A session made with `EGraphSession(prune=True)` compiles its rule files' declarations and
top-level actions at once, their rules later. Programs live between a (push) and a (pop) (the
pool of egraph/optimize.py); the push is held back while the program's terms arrive, until
its first command that is not a term (a run, a check, a serialization). Then the rules the
program can fire (egraph/rule_relevance.py: its terms' constructors, closed under the rules)
are compiled into the session below the push, and stay for the next program. Should a later
command need more (new constructors, a ruleset not announced), the session pops, compiles
them and replays the program's commands: slower, never different.

The rules a program cannot fire never match, and the ones it can are compiled in the files'
order within each ruleset (rule_book.py says why), so the e-graph and the extracted program are
those of the whole rule set (tests/test_rule_relevance.py compares them).
"""

from __future__ import annotations

import re
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .deadline import excuse, excused
from .rule_book import RuleBook
from .rule_program import parsed_program
from .rule_relevance import read_forms

if TYPE_CHECKING:
    from .session import EGraphSession

# commands that only add terms: a program's terms arrive as these before anything runs
_TERM_COMMANDS = {"set", "let", "union", "delete", "subsume"}
_HEADS = re.compile(r"(?m)^\s*\(\s*([^\s()]+)")
# commands that make no rows (a check's query only reads): their calls need no rules
_READ_COMMANDS = {"check", "run-schedule", "run", "print-size", "print-function"}
_RUNS = re.compile(r"\(run\s+([^\s()]+)")


def _rulesets_run(text: str) -> set[str]:
    """The rulesets `(run ...)` commands in `text` name (`(run 3)`: the default ruleset)."""
    return {"" if name[0].isdigit() or name[0] == ":" else name for name in _RUNS.findall(text)}


def compile_seconds() -> float:
    """Seconds this thread spent compiling rules into pruned sessions as programs came (the
    compile report's `rules` phase adds them; no budget counts them: deadline.excuse)."""
    return excused()


@dataclass
class _Scratch:
    """One program between the outermost (push) and its (pop)."""

    rulesets: set[str] | None  # those it may run (None: any)
    waiting: list[tuple[str, str]] | None = field(default_factory=list)  # before the push
    seeds: set[str] = field(default_factory=set)  # symbols its commands call
    have: frozenset[str] = frozenset()  # symbols that can get rows with what is compiled
    log: list[tuple[str, str, bool]] = field(default_factory=list)  # (text, file, is rules)
    depth: int = 0  # egglog pushes in effect


class ScratchRules:
    def __init__(self, session: EGraphSession):
        # weak: a cycle would leave the session (and its unsendable EGraph) to the cyclic
        # collector, which may run on another thread
        self._session = weakref.ref(session)
        # None: pruning off, every rule compiled; forms are parsed by the session's EGraph
        self.book: RuleBook | None = RuleBook(parser=lambda: self.session.egraph)
        self.scratch: _Scratch | None = None
        self.next_rulesets = None

    @property
    def session(self) -> EGraphSession:
        s = self._session()
        assert s is not None  # called by the session itself
        return s

    # ---------------------------------------------------------------- the base session

    def add_rules_text(self, text: str, filename: str, shipped: bool):
        s = self.session
        if self.scratch is not None:  # rules inside a program: compiled now, gone at its pop
            self.settle()
            out = s._run(lambda: parsed_program(text, filename, s.egraph), text, filename)
            self.scratch.log.append((text, filename, True))
            return out
        forms = read_forms(text) if shipped and self.book is not None else None
        if forms is None:  # a user's file (its every rule is checked), or one we cannot read
            self.compile_all()
            return s._run(lambda: parsed_program(text, filename, s.egraph), text, filename)
        assert self.book is not None
        commands = self.book.add_file(text, filename, forms)
        return s._run(lambda: commands, text, filename)

    def run_base(self, text: str, filename: str):
        """Commands of the base session that are not a rule file (the marker declaration)."""
        if self.book is not None and self.scratch is None:
            self.book.add_text(text, filename)
        return self.session.plain_run_text(text, filename)

    def compile_all(self) -> None:
        """Turn pruning off: every rule of the files, in their order."""
        book = self.book
        if book is None:
            return
        wanted = {u.where for u in book.table().units}
        self._compile(wanted)
        self.book = None

    def compile_for(self, texts, rulesets) -> None:
        """Compile now, below any program, the rules that programs with these egglog texts
        can fire when they run `rulesets` (egraph/fusion_ahead.py: programs known ahead);
        nothing once a program has run a command (its push is then in egglog) or with
        pruning off."""
        book, sc = self.book, self.scratch
        if book is None or (sc is not None and sc.waiting is None):
            return
        table = book.table()
        seeds: set[str] = set()
        for text in texts:
            seeds |= table.symbols_in(text)
        wanted, _ = table.closure(seeds, rulesets)
        self._compile(wanted)

    def _compile(self, wanted) -> None:
        """Compile the rule forms `wanted` below any push (appended, or the session rebuilt
        in the files' order)."""
        book = self.book
        assert book is not None
        new = set(wanted) - book.compiled
        if not new:
            return
        t0 = time.perf_counter()
        try:
            self._compile_new(book, new)
        finally:
            excuse(time.perf_counter() - t0)

    def _compile_new(self, book: RuleBook, new: set[tuple[int, int]]) -> None:
        s = self.session
        if book.appendable(new):
            book.compiled |= new
            commands = book.rule_commands(new)
            s._run(lambda: commands, "", "<rules>")
            return
        book.compiled |= new
        from .egglog_bindings import EGraph

        s.egraph, s.rulesets = EGraph(), []  # the session stays registered (exit_gate.owned)
        for item, commands in book.commands():
            if item.forms is None:
                s._run(
                    lambda item=item: s.egraph.parse_program(item.text, filename=item.filename),
                    item.text,
                    item.filename,
                )
            else:
                s._run(lambda commands=commands: commands, item.text, item.filename)

    # ---------------------------------------------------------------- programs

    def run_text(self, text: str, filename: str):
        s = self.session
        command = text.strip()
        sc = self.scratch
        if command == "(push)":
            s.values.push()
            if sc is None:  # the outermost: held back until the program's terms are in
                self.scratch = _Scratch(
                    None if self.next_rulesets is None else set(self.next_rulesets)
                )
                self.next_rulesets = None
                return []
            self.settle()
            out = self._raw(text, filename)
            sc.depth += 1
            return out
        if command == "(pop)":
            s.values.pop()
            if sc is None:
                return self._raw(text, filename)
            if sc.waiting is not None:  # nothing ran: nothing to undo in egglog
                self.scratch = None
                return []
            out = self._raw(text, filename)
            sc.depth -= 1
            if sc.depth == 0:
                self.scratch = None
            return out
        if "$" in text:
            text = s.values.refer(text)
        if sc is None:
            if self.book is not None:  # terms in the base session: every rule may apply
                self.compile_all()
            return s._run(lambda: s.egraph.parse_program(text, filename=filename), text, filename)
        if sc.waiting is not None and set(_HEADS.findall(text)) <= _TERM_COMMANDS:
            sc.waiting.append((text, filename))
            return []
        self._admit(text)
        return self._raw(text, filename)

    def settle(self) -> None:
        """Run what the program has sent so far, once the rules it needs are compiled."""
        sc = self.scratch
        if sc is not None and sc.waiting is not None:
            self._admit("")

    def _raw(self, text: str, filename: str, rules: bool = False):
        s = self.session
        if rules:
            out = s._run(lambda: parsed_program(text, filename, s.egraph), text, filename)
        else:
            out = s._run(lambda: s.egraph.parse_program(text, filename=filename), text, filename)
        if self.scratch is not None:
            self.scratch.log.append((text, filename, rules))
        return out

    def _admit(self, text: str) -> None:
        """Make sure the rules `text` (and what the program sent before) can fire are compiled,
        pushing the held-back program or replaying it."""
        sc = self.scratch
        assert sc is not None
        book = self.book
        runs = _rulesets_run(text)
        if book is None:  # every rule compiled: only the held-back push is left to do
            if sc.waiting is not None:
                self._push_waiting(sc)
            return
        table = book.table()
        new_runs = sc.rulesets is not None and not runs <= sc.rulesets
        if new_runs:
            assert sc.rulesets is not None
            sc.rulesets |= runs
        reads = set(_HEADS.findall(text)) <= _READ_COMMANDS
        fresh = set() if reads else table.symbols_in(text) - sc.have
        if sc.waiting is not None:
            for t, _ in sc.waiting:
                fresh |= table.symbols_in(t)
        elif not fresh and not new_runs:
            return
        sc.seeds |= fresh
        wanted, sc.have = table.closure(sc.seeds, sc.rulesets)
        if sc.waiting is not None:
            self._compile(wanted)
            self._push_waiting(sc)
            return
        if wanted <= book.compiled:
            return
        # compiled below the push: undo the program, compile, run it again
        log, s = sc.log, self.session
        for _ in range(sc.depth):
            s._run(lambda: s.egraph.parse_program("(pop)"), "(pop)", "<replay>")
        self._compile(wanted)
        s._run(lambda: s.egraph.parse_program("(push)"), "(push)", "<replay>")
        sc.log = []
        for t, f, rules in log:
            self._raw(t, f, rules)

    def _push_waiting(self, sc: _Scratch) -> None:
        waiting, sc.waiting = sc.waiting or [], None
        self._raw("(push)", "<scratch>")
        sc.log = []  # the push itself is not replayed: a replay pushes first
        sc.depth = 1
        for t, f in waiting:
            self._raw(t, f)
