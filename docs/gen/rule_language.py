"""The rule-language page, generated from rules/*.egg so that it cannot go stale.

    markdown = rule_language_page(Path("rules"))

It lists the sorts and constructors a rule may match and build (with each declaration's
comment), the analyses a guard may query (`function`s and `relation`s, with the comment above
each), and every ruleset with the comment block of its section and how many rules it holds.
It reads the files as text: a top-level form splitter and the files' own comment conventions
(`;; ---- name: what it does` opens a ruleset's section; `; ...` after a declaration says what
it is).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# the shipped files in load order; any other *.egg in rules/ comes after them
ORDER = ("schema.egg", "algebra.egg", "adjoint.egg", "fusion.egg")


@dataclass
class Ruleset:
    name: str
    file: str
    what: str
    rules: list[str] = field(default_factory=list)

    def examples(self, n: int = 3) -> list[str]:
        """The n shortest rules, in file order: what a reader looks at first."""
        short = sorted(self.rules, key=len)[:n]
        return [r for r in self.rules if r in short][:n]


@dataclass
class Form:
    """One top-level s-expression: its text, first line, and the `;;` comments right above."""

    text: str
    line: int
    comment: list[str] = field(default_factory=list)

    @property
    def head(self) -> str:
        m = re.match(r"\(\s*([^\s()]+)", self.text)
        return m.group(1) if m else ""


def split_forms(source: str) -> list[Form]:
    """The top-level forms of an egglog file, strings and `;` comments respected; each form
    carries the block of whole-line comments right above it (a blank line ends a block)."""
    forms: list[Form] = []
    comment: list[str] = []
    depth, start, start_line, line = 0, 0, 0, 1
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if c == "\n":
            line += 1
            if depth == 0 and source[i + 1 : i + 2] == "\n":
                comment = []
        elif c == ";":
            end = source.find("\n", i)
            end = n if end < 0 else end
            line_start = source.rfind("\n", 0, i) + 1
            if depth == 0 and not source[line_start:i].strip():
                comment.append(source[i:end].lstrip(";").strip())
            i = end
            continue
        elif c == '"':
            i = source.index('"', i + 1)
        elif c == "(":
            if depth == 0:
                start, start_line = i, line
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                forms.append(Form(source[start : i + 1], start_line, _after_rule(comment)))
                comment = []
        i += 1
    return forms


def _after_rule(comment: list[str]) -> list[str]:
    """The comment lines after the last `---- section` rule line: the section's title is not
    part of what the form under it is."""
    for k in range(len(comment) - 1, -1, -1):
        if re.match(r"[-=]{8,}", comment[k]):
            return comment[k + 1 :]
    return comment


def _file_header(source: str) -> str:
    """The first sentence of a file's opening comment, after its `rules/NAME.egg --`."""
    lines = []
    for line in source.splitlines():
        text = line.lstrip(";").strip()
        if not line.startswith(";;") or not text:
            break
        lines.append(text)
    text = re.sub(r"^[\w/.]+\.egg\s*--\s*", "", " ".join(lines))
    return text.split(". ")[0].rstrip(".") + "."


def rule_files(rules: Path) -> list[Path]:
    shipped = [rules / name for name in ORDER if (rules / name).is_file()]
    return shipped + sorted(p for p in rules.glob("*.egg") if p.name not in ORDER)


def _trailing_comments(source: str) -> dict[int, str]:
    """line number -> the `; comment` at the end of that line (after code)."""
    out = {}
    for k, text in enumerate(source.splitlines(), 1):
        m = re.match(r"\s*\(.*?[^;]\s+;\s*(.+)$", text)
        if m:
            out[k] = m.group(1).strip()
    return out


def _constructors_in_datatype(form: Form, notes: dict[int, str]) -> list[tuple[str, str, str]]:
    """(name, argument sorts, comment) of each variant of a `(datatype Sort ...)`."""
    out = []
    body = form.text[form.text.index("(", 1) :] if "(" in form.text[1:] else ""
    offset = form.line + form.text[: form.text.index(body)].count("\n") if body else form.line
    line = offset
    for m in re.finditer(r"\(([A-Z][\w-]*)((?:\s+\w+)*)\s*\)|\n", body):
        if m.group(0) == "\n":
            line += 1
            continue
        out.append((m.group(1), " ".join(m.group(2).split()), notes.get(line, "")))
    return out


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def _section_comments(source: str) -> dict[str, list[str]]:
    """ruleset-ish section name -> the comment block that opens it (`;; ---- name[: what]`)."""
    out: dict[str, list[str]] = {}
    lines = source.splitlines()
    for k, text in enumerate(lines):
        m = re.match(r";;\s*-{8,}\s*([\w-]+)(?:\s*\(ruleset ([\w-]+)\))?(?::\s*(.*))?", text)
        if not m:
            continue
        block = [m.group(3)] if m.group(3) else []
        for more in lines[k + 1 :]:
            if not more.startswith(";;") or re.match(r";;\s*-{8,}", more):
                break
            block.append(more.lstrip(";").strip())
        out.setdefault(m.group(2) or m.group(1), block)
    return out


def _listed_rulesets(source: str) -> dict[str, str]:
    """`;; Rulesets: a (what a does), b (what b does).` lines: name -> what it does."""
    out = {}
    text = " ".join(
        line.lstrip(";").strip() for line in source.splitlines() if line.startswith(";;")
    )
    for listing in re.findall(r"Rulesets:\s*(.*?)(?:\.\s|$)", text):
        for name, what in re.findall(r"([\w-]+)\s*\(([^)]*)\)", listing):
            out[name] = what
    return out


def rule_language_page(rules: Path) -> str:
    sorts, constructors, analyses, rulesets = [], [], [], {}
    sections: dict[str, list[str]] = {}
    for path in rule_files(rules):
        for name, block in _section_comments(path.read_text()).items():
            if not sections.get(name):
                sections[name] = block
    for path in rule_files(rules):
        source = path.read_text()
        forms = split_forms(source)
        notes = _trailing_comments(source)
        listed = _listed_rulesets(source)
        header = _file_header(source)
        for f in forms:
            where = f"{path.name}:{f.line}"
            if f.head == "sort":
                sorts.append((f.text, where))
            elif f.head == "datatype":
                sort = f.text.split()[1]
                for name, args, note in _constructors_in_datatype(f, notes):
                    constructors.append((name, args, sort, note, path.name))
            elif f.head == "constructor":
                m = re.match(r"\(constructor\s+([\w-]+)\s+\(([^)]*)\)\s+([\w-]+)", f.text)
                if m:
                    note = notes.get(f.line) or " ".join(f.comment)
                    constructors.append((m[1], m[2], m[3], note, path.name))
            elif f.head in ("function", "relation"):
                m = re.match(r"\((?:function|relation)\s+([\w-]+)\s+\(([^)]*)\)\s*([\w-]*)", f.text)
                if m:
                    analyses.append((f.head, m[1], m[2], m[3], " ".join(f.comment), where))
            elif f.head == "ruleset":
                name = f.text.split()[1].rstrip(")")
                what = listed.get(name, "")
                block = sections.get(name, [])
                if not what and not block:
                    block = [header]
                if what and block and block[0] == what:
                    block = block[1:]
                rulesets[name] = Ruleset(name, path.name, " ".join([what, *block]).strip())
        for f in forms:
            m = re.search(r":ruleset\s+([\w-]+)", f.text)
            if f.head in ("rewrite", "rule", "birewrite") and m and m[1] in rulesets:
                rulesets[m[1]].rules.append(" ".join(f.text.split()))
    out = [
        "# The rule language",
        "",
        "*Generated from `rules/*.egg` when the site is built (`docs/gen/rule_language.py`):",
        "every name below is one the shipped files declare.*",
        "",
        "A rule file is plain [egglog](https://egraphs-good.github.io/egglog/). A rule matches",
        "and builds terms of the constructors below; a guard in a `rule`'s query may read the",
        "analyses; each rule belongs to a ruleset, and the optimizer's schedule runs the",
        "rulesets. A user's file is read after the shipped ones, so it may use every name here.",
        "",
        "```",
        "(ruleset mine)",
        "(rewrite (Subtract (Softplus x) (Softplus (Negate x))) x :ruleset mine)",
        "(rule ((= e (Sqrt (Multiply a a))) (positive a)) ((union e a)) :ruleset mine)",
        "```",
        "",
        "Check a file with `dlvm-eq verify-rules FILE.egg`, use it with",
        "`dlvm-eq opt PROGRAM.dl --rules FILE.egg --explain` (the",
        "[tutorial](../tutorials/write-a-rule.md) walks through both).",
        "",
        "## Sorts",
        "",
    ]
    out += [f"- `{text}` ({where})" for text, where in sorts]
    out += [
        "",
        "## Constructors",
        "",
        "One per IR op (the op table's `egg` field names it: see the",
        "[IR reference](ir.md)), plus helper terms. Attributes are primitive children:",
        "axes and shapes are `IVec`, dtypes are `String`s.",
        "",
        "| constructor | children | sort | file | what it is |",
        "|---|---|---|---|---|",
    ]
    for name, args, sort, note, file in constructors:
        out.append(f"| `{name}` | `{args}` | {sort} | {file} | {_md(note)} |")
    out += [
        "",
        "## Analyses a guard may use",
        "",
        "Facts computed by rules of the `analysis` ruleset; a rule binds them in its query",
        "(`(= s (shape x))`, `(positive a)`) and never calls them in an action.",
        "",
        "| analysis | kind | of | value | declared in | what it says |",
        "|---|---|---|---|---|---|",
    ]
    for kind, name, args, value, comment, where in analyses:
        out.append(
            f"| `{name}` | {kind} | `{args}` | `{value or 'fact'}` | {where} | {_md(comment)} |"
        )
    out += [
        "",
        "## Rulesets",
        "",
        "The optimizer runs the algebra rulesets together (a user file's rulesets join them);",
        "`adjoint` runs alone first, to expand gradients; `analysis` runs with every ruleset;",
        "`fusion` runs in the fusion decision's own e-graph. A ruleset's shortest rules are",
        "shown as examples.",
    ]
    for r in rulesets.values():
        out += ["", f"### `{r.name}`", "", f"{r.file}, {len(r.rules)} rules. {r.what}", ""]
        if r.rules:
            out += ["```", *r.examples(), "```"]
    return "\n".join(out) + "\n"
