"""What egglog may see of a rule file: its text is read by us first, in one iterative pass, and
refused with a located error (file:line:col) where egglog would crash, hang or panic.

    index = RuleIndex()              # one per e-graph session
    index.add(text, "my.egg")        # RuleFileError for a mistake, located; then egglog runs it

Checks, each for a measured failure of egglog 13:
- nesting deeper than MAX_DEPTH: egglog's parser and query compiler recurse (10,000 deep:
  SIGSEGV; a 1,000-deep pattern compiled in 73 s, 400 in 1.6 s, 100 in 0.07 s);
- an unclosed '(' or string, a ')' that closes nothing: located here, not at the end of file;
- in a user's file, commands other than declarations and rules: a `run`/`run-schedule` ran
  outside the budget and Ctrl-C (28 s under --budget seconds=5), `push`/`pop` would unbalance
  the session's scopes, `include`/`input`/`output` touch other files, top-level facts
  (`union`, `let`, ...) would assert equalities no rule checker sees;
- a rule defined twice (same text, or the same :name): egglog panics ("already present").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import SourceError
from ..sexpr import TOKEN, Lines

# egglog compiles a 64-deep pattern in ~15 ms; the shipped rule files nest at most 11 deep
MAX_DEPTH = 64
RULES = ("rule", "rewrite", "birewrite")
# top-level commands a user's file may hold: declarations and rules (the optimizer runs them)
USER_COMMANDS = frozenset(
    {"sort", "datatype", "datatype*", "constructor", "function", "relation", "ruleset", "set"}
    | set(RULES)
)
RUN_COMMANDS = frozenset({"run", "run-schedule"})

FORBIDDEN_ACTIONS = ("delete", "panic")  # actions a user's rule may not take


class RuleFileError(SourceError):
    """A mistake in a rule file: file, line and the rule's text (a long line cut to the part
    around the column, so that a 90 kB line of a generated file prints as one screen line)."""

    WIDTH = 100

    def _render(self) -> str:
        src, col = self.source_line, self.column or 1
        if src is None or len(src) <= self.WIDTH:
            return super()._render()
        src = src.rstrip()
        lo = max(0, min(col - 1 - self.WIDTH // 2, len(src) - self.WIDTH))
        cut = ("..." if lo else "") + src[lo : lo + self.WIDTH]
        cut += "..." if lo + self.WIDTH < len(src) else ""
        where = f"{self.filename}:{self.line}:{col}"
        caret = " " * (col - 1 - lo + (3 if lo else 0)) + "^"
        return f"{where}: error: {self.message}\n    {cut}\n    {caret}"


@dataclass(frozen=True)
class Form:
    """One top-level form: text[start:end], its first line and column, its head ("rewrite"),
    and for a rule its identity in egglog (its :name, or its tokens) and its ruleset."""

    start: int
    end: int
    line: int
    col: int
    head: str
    key: str | None = None
    ruleset: str | None = None
    tokens: str = ""  # its tokens joined by single spaces (strings and comments left whole)


def _error(text: str, filename: str, i: int, message: str) -> RuleFileError:
    line, col = Lines(text)(i)
    lines = text.split("\n")
    return RuleFileError(message, filename, line, col, lines[line - 1])


def scan_forms(text: str, filename: str) -> list[Form]:
    """The top-level forms of egglog text, strings and ; comments skipped; RuleFileError at an
    unbalanced paren, an unclosed string, nesting deeper than MAX_DEPTH, or a bare atom."""
    forms: list[Form] = []
    where = Lines(text)
    depth, start, tokens, opts = 0, 0, [], []
    for m in TOKEN.finditer(text):
        tok = m.group()
        c = tok[0]
        if c == ";":
            continue
        if c == '"' and not m.group(1):
            raise _error(text, filename, m.start(), "this string is never closed")
        if c == "(":
            depth += 1
            if depth > MAX_DEPTH:
                raise _error(
                    text,
                    filename,
                    m.start(),
                    f"terms nest deeper than {MAX_DEPTH} parentheses here (the limit: egglog "
                    "parses and compiles terms recursively)",
                )
            if depth == 1:
                start, tokens, opts = m.start(), [], []
        elif c == ")":
            if depth == 0:
                raise _error(text, filename, m.start(), "this ')' closes nothing")
            depth -= 1
            if depth == 0:
                tokens.append(")")
                forms.append(_form(text, start, m.end(), where, tokens, opts))
                continue
        elif depth == 0:
            raise _error(
                text, filename, m.start(), f"{tok!r} is outside any (command); expected '('"
            )
        elif depth == 1:
            opts.append(tok)
        tokens.append(tok)
    if depth:
        raise _error(
            text,
            filename,
            start + _outermost_open(text[start:]),
            "this '(' is never closed (no matching ')' before the end of the file)",
        )
    return forms


def _outermost_open(text: str) -> int:
    """Offset of the first '(' of text whose form is never closed (text starts with a '(')."""
    stack = []
    for m in TOKEN.finditer(text):
        if m.group() == "(":
            stack.append(m.start())
        elif m.group() == ")" and stack:
            stack.pop()
    return stack[0] if stack else 0


def _form(text: str, start: int, end: int, where: Lines, tokens, opts) -> Form:
    line, col = where(start)
    head = tokens[1] if len(tokens) > 1 else ""
    key = ruleset = None
    joined = " ".join(tokens)
    if head in RULES:
        # egglog names a rule by its :name, else by its text as it prints it (1.00 as 1.0):
        # equal names panic egglog
        named = _option(opts, ":name")
        key = f":name {named}" if named is not None else " ".join(map(_number, tokens))
        ruleset = _option(opts, ":ruleset")
    return Form(start, end, line, col, head, key, ruleset, joined)


_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?|[+-]?(inf|nan)")


def _number(tok: str) -> str:
    """A numeric literal as one spelling per value (egglog prints 1.00 as 1.0)."""
    if _INT.fullmatch(tok):
        return str(int(tok))
    if _FLOAT.fullmatch(tok):
        return repr(float(tok))
    return tok


def _option(opts: list[str], name: str) -> str | None:
    """The value after a keyword among a form's top-level atoms (a rule's :name, :ruleset)."""
    for i, tok in enumerate(opts[:-1]):
        if tok == name:
            return opts[i + 1]
    return None


def is_shipped(filename: str) -> bool:
    """Whether a file is one of the shipped rule files (checked in CI, trusted)."""
    from .rulefiles import shipped_rule_files

    try:
        path = Path(filename).resolve()
        return any(path == p.resolve() for p in shipped_rule_files())
    except (OSError, ValueError):
        return False


class RuleIndex:
    """The rules loaded into one session, by egglog's name for them: where each was defined."""

    def __init__(self):
        self.rules: dict[str, tuple[str, int]] = {}  # key -> (file, line)

    def add(self, text: str, filename: str) -> list[Form]:
        """Check a rule file's text (see the module docstring) and record its rules; its
        forms. Nothing is recorded when the text is refused."""
        forms = scan_forms(text, filename)
        user = not is_shipped(filename)
        if user:
            declared = {_name(text, f) for f in forms if f.head == "function"}
            for f in forms:
                _check_user_form(text, filename, f, declared)
        seen: dict[str, tuple[str, int]] = {}
        for f in forms:
            if f.key is None:
                continue
            first = self.rules.get(f.key) or seen.get(f.key)
            if first is not None:
                what = "a rule of this :name" if f.key.startswith(":name ") else "this rule"
                raise _error(
                    text,
                    filename,
                    f.start,
                    f"{what} is already defined at {first[0]}:{first[1]} (egglog allows each "
                    "rule once; delete one of them or give it another :name)",
                )
            seen[f.key] = (filename, f.line)
        self.rules.update(seen)
        return forms

    def where(self, name: str) -> tuple[str, int] | None:
        """(file, line) of a rule by egglog's name for it (its :name, or its text)."""
        if f":name {_quoted(name)}" in self.rules:
            return self.rules[f":name {_quoted(name)}"]
        return self.rules.get(_normal(name))


def _quoted(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _normal(text: str) -> str:
    """A rule's text as our keys spell it: its tokens joined by single spaces."""
    return " ".join(m.group() for m in TOKEN.finditer(text) if m.group()[0] != ";")


def _name(text: str, f: Form) -> str:
    toks = f.tokens.split(" ", 3)
    return toks[2] if len(toks) > 2 else ""


def _check_user_form(text: str, filename: str, f: Form, declared: set[str]) -> None:
    if f.head in RUN_COMMANDS:
        raise _error(
            text,
            filename,
            f.start,
            f"`{f.head}` is not allowed in a rule file: the optimizer runs the rulesets a "
            "file declares itself, one iteration per step under the --budget (iterations, "
            "nodes, seconds) and Ctrl-C; put your rules in a (ruleset NAME) with "
            ":ruleset NAME and delete this command",
        )
    if f.head not in USER_COMMANDS:
        raise _error(
            text,
            filename,
            f.start,
            f"`{f.head}` is not allowed in a rule file (at the top level a user's file may "
            "hold: " + ", ".join(sorted(USER_COMMANDS - {"set"})) + ", and `set` of a "
            "function it declares)",
        )
    if f.head == "set":
        toks = f.tokens.split(" ", 4)
        target = toks[3] if len(toks) > 3 and toks[2] == "(" else ""
        if target not in declared:
            raise _error(
                text,
                filename,
                f.start,
                f"`set` of {target or 'this'}: a user's file may set only functions it "
                "declares (the shipped analyses are computed by their own rules)",
            )
    for action in FORBIDDEN_ACTIONS:
        if f" ( {action} " in f.tokens:
            at = re.search(rf"\(\s*{action}[\s)]", text[f.start : f.end])
            raise _error(
                text,
                filename,
                f.start + (at.start() if at else 0),
                f"a user's rule cannot `{action}`: every e-node a user's rule makes is "
                "type-checked before extraction, and a deleted one could not be",
            )
    if f.ruleset == "analysis":
        raise _error(
            text,
            filename,
            f.start,
            "a user's rule cannot join the `analysis` ruleset (it is run to saturation after "
            "every step, outside the budget); declare a (ruleset NAME) of your own",
        )
