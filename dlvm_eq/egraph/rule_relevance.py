"""Which rules of the rule files a program can fire: a fixpoint over constructors.

A rule fires only if every constructor, function and relation its query reads has a row. A row
exists if the program's own commands made it (its seeds), a top-level action of a rule file
made it, or the actions of a rule that can itself fire make it. The rules outside that closure
never match, so a session that leaves them out saturates to the same e-graph and extracts the
same program (tests/test_rule_relevance.py checks this against the full rule set), while
compiling a rule costs about 0.5 ms in egglog.

    table = RuleTable.of([text_of_schema, text_of_algebra])     # rule files in load order
    keep = table.closure(table.symbols_in(program_text))      # {(file, form), ...}

Conservative on purpose: every declared symbol called anywhere in a rule's actions counts as
made (a `delete` or `subsume` too), every one in its query or `:when` as needed, whatever its
sort; a name no file declares (a primitive such as `+` or `vec-of`) is always there. A file
with a command this reading does not know (`run`, `include`, `push`, a combined ruleset, ...)
has no table (None): its session compiles every rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .form_scan import FormScan, scan_forms

_HEAD = re.compile(r"\(\s*([^\s()]+)")  # the name a parenthesis calls
_RULES = ("rule", "rewrite", "birewrite")
_DECLARES = ("constructor", "function", "relation")
_ACTIONS = ("set", "union", "let", "delete", "subsume")  # top-level: rows before any program
_QUIET = ("ruleset", "sort")  # declarations that make no rows


@dataclass(frozen=True)
class RuleUnit:
    """One rule form (a birewrite is two, one per direction): where it is (file, form), its
    ruleset, the declared symbols its query needs and its actions make."""

    where: tuple[int, int]
    ruleset: str
    needs: frozenset[str]
    makes: frozenset[str]


@dataclass
class FileForms:
    """A rule file read for relevance: which forms are rules (the rest is always compiled)."""

    rules: list[tuple[int, str, set[str], set[str]]]  # form, ruleset, needs, makes (raw names)
    declared: set[str]
    given: set[str]  # names its top-level actions call


def _calls(text: str) -> set[str]:
    return set(_HEAD.findall(text))


def _keyword(items: list, key: str):
    return items[items.index(key) + 1] if key in items[:-1] else None


def _side(scan: FormScan, i: int, item) -> set[str]:
    return _calls(scan.child(i, item)) if isinstance(item, int) else set()


def read_forms(text: str) -> FileForms | None:
    """The rule file's forms as rules, declarations and actions; None where it holds a
    command this reading does not know, or is not a sequence of forms."""
    scan = scan_forms(text)
    if scan.spans is None:
        return None
    out = FileForms([], set(), set())
    for i in range(len(scan.spans)):
        items = scan.items(i)
        head = items[0] if items else None
        if head in _RULES:
            if len(items) < 3:
                return None
            ruleset = _keyword(items, ":ruleset") or ""
            if not isinstance(ruleset, str):
                return None
            when = _keyword(items, ":when")
            conditions = _side(scan, i, when) if when is not None else set()
            first, second = _side(scan, i, items[1]), _side(scan, i, items[2])
            if head == "rule":  # (rule (query) (actions) ...)
                out.rules.append((i, ruleset, first, second))
            else:
                out.rules.append((i, ruleset, first | conditions, second))
                if head == "birewrite":  # either direction fires
                    out.rules.append((i, ruleset, second | conditions, first))
        elif head in _DECLARES:
            if len(items) < 2 or not isinstance(items[1], str):
                return None
            out.declared.add(items[1])
        elif head == "datatype":
            out.declared.update(
                m.group(1)
                for k in items[2:]
                if isinstance(k, int) and (m := _HEAD.match(scan.child(i, k)))
            )
        elif head in _ACTIONS:
            out.given |= _calls(scan.code[scan.spans[i][0] : scan.spans[i][1]])
        elif head not in _QUIET:
            return None
    return out


@dataclass
class RuleTable:
    """The rule forms of rule files in load order, with what each needs and makes; `given`:
    symbols the files' own top-level actions make (rows before any program loads)."""

    units: list[RuleUnit] = field(default_factory=list)
    declared: set[str] = field(default_factory=set)
    given: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, files: Sequence[FileForms]) -> RuleTable:
        table = cls()
        for f in files:
            table.declared |= f.declared
            table.given |= f.given
        d = table.declared
        table.given &= d
        table.units = [
            RuleUnit((k, i), rs, frozenset(n & d), frozenset(m & d))
            for k, f in enumerate(files)
            for i, rs, n, m in f.rules
        ]
        return table

    def symbols_in(self, text: str) -> set[str]:
        """The declared symbols an egglog text calls (a conservative read of a program's
        commands: any name after a '(' counts)."""
        return _calls(text) & self.declared

    def closure(
        self, seeds: Iterable[str], rulesets: Iterable[str] | None = None
    ) -> tuple[frozenset[tuple[int, int]], frozenset[str]]:
        """(the rule forms that can fire from `seeds`, the symbols that can have rows), run to
        a fixpoint; with `rulesets`, only rules of those rulesets run at all."""
        have = set(seeds) | self.given
        runs = None if rulesets is None else set(rulesets)
        waiting = [u for u in self.units if runs is None or u.ruleset in runs]
        fired: set[tuple[int, int]] = set()
        changed = True
        while changed:
            changed, rest = False, []
            for u in waiting:
                if u.needs <= have:
                    fired.add(u.where)
                    if not u.makes <= have:
                        have |= u.makes
                        changed = True
                else:
                    rest.append(u)
            waiting = rest
        return frozenset(fired), frozenset(have)
