"""What a pruned session holds: the rule files it was given, and which of their rules it has
compiled so far (egraph/rule_relevance.py says which a program needs; session.py compiles them
before the program's push).

    book = RuleBook()
    book.add_file(text, "rules/algebra.egg")      # its declarations compile at once
    book.add_text(MARKER_DECLARATION)             # commands that are not a rule file
    wanted, have = book.table().closure(seeds, rulesets)
    book.appendable(wanted)                       # False: only a rebuild keeps egglog's order

Order: egglog runs a ruleset's rules in the order they were added, and that order decides which
new e-node gets which id (so, on a tie, which program extraction picks). Rules are therefore
only ever added after every compiled rule of their ruleset in the files' order; otherwise the
session is rebuilt with the files' order (`commands`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .egglog_bindings import EGraph
from .form_scan import scan_forms
from .rule_program import parsed_forms
from .rule_relevance import FileForms, RuleTable


@dataclass
class _Item:
    text: str
    filename: str
    forms: FileForms | None  # None: commands that are not a rule file, always run whole


@dataclass
class RuleBook:
    parser: Callable[[], EGraph | None] = lambda: None  # what parses forms (rule_program.py)
    items: list[_Item] = field(default_factory=list)
    compiled: set[tuple[int, int]] = field(default_factory=set)  # (item, form) of rules
    _table: RuleTable | None = None
    _rule_forms: list[set[int]] = field(default_factory=list)  # per item: its rule forms
    _ruleset: dict[tuple[int, int], str] = field(default_factory=dict)  # rule form -> ruleset

    def add_file(self, text: str, filename: str, forms: FileForms) -> list[tuple]:
        """Record a rule file; the egglog commands of its forms that are not rules (run now)."""
        self.items.append(_Item(text, filename, forms))
        rules = {i for i, *_ in forms.rules}
        self._rule_forms.append(rules)
        self._table = None
        n = self.count(len(self.items) - 1)
        return _flat(
            parsed_forms(text, filename, [i for i in range(n) if i not in rules], self.parser())
        )

    def add_text(self, text: str, filename: str) -> None:
        self.items.append(_Item(text, filename, None))
        self._rule_forms.append(set())
        self._table = None

    def count(self, k: int) -> int:
        """How many top-level forms item k has (0 for commands that are not a rule file)."""
        item = self.items[k]
        return len(scan_forms(item.text).spans or ()) if item.forms else 0

    def table(self) -> RuleTable:
        if self._table is None:
            self._table = RuleTable.of([i.forms or FileForms([], set(), set()) for i in self.items])
            self._ruleset = {u.where: u.ruleset for u in self._table.units}
        return self._table

    def appendable(self, new: set[tuple[int, int]]) -> bool:
        """Whether compiling `new` after what is compiled keeps every ruleset's order."""
        last: dict[str, tuple[int, int]] = {}
        for u in self.table().units:
            if u.where in self.compiled and u.where > last.get(u.ruleset, (-1, -1)):
                last[u.ruleset] = u.where
        return all(w > last.get(self._ruleset[w], (-1, -1)) for w in new)

    def rule_commands(self, wheres) -> list[tuple]:
        """egglog's commands of these rule forms, in the files' order."""
        out: list[tuple] = []
        for k, i in sorted(wheres):
            item = self.items[k]
            out.extend(parsed_forms(item.text, item.filename, [i], self.parser())[0])
        return out

    def commands(self) -> Iterator[tuple[_Item, list]]:
        """(item, its commands) in order, for a rebuild: every form that is not a rule, and
        the compiled rules, each in its file's order."""
        for k, item in enumerate(self.items):
            if item.forms is None:
                yield item, []
                continue
            rules = self._rule_forms[k]
            keep = [i for i in range(self.count(k)) if i not in rules or (k, i) in self.compiled]
            yield item, _flat(parsed_forms(item.text, item.filename, keep, self.parser()))


def _flat(forms: list[tuple]) -> list:
    return [c for form in forms for c in form]
