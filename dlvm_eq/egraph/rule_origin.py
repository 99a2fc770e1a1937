"""Which user rule is to blame when an optimized program is ill-typed: the rules of the user's
files that fired during saturation, by file:line, and the command that checks them.

    raise blame_user_rules(error, session, saturation_report)   # `error` itself if none fired

The shipped rule files are checked in CI (`dlvm-eq verify-rules --strict`); a user's file is
not, so a term that does not type-check after saturation with a user's rules most likely comes
from one of them.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import DlvmError
from .parens import parens
from .rulefiles import shipped_rule_files


class UserRuleError(DlvmError):
    """A user's rule produced a term that is not a valid program (wrong shape or dtype)."""


def top_level_forms(text: str) -> list[tuple[int, str]]:
    """(line, text) of each top-level parenthesized form; strings and ; comments skipped."""
    forms, depth, start, start_line = [], 0, 0, 1
    for c, i, line, _ in parens(text):
        if c == "(":
            if depth == 0:
                start, start_line = i, line
            depth += 1
        elif depth:
            depth -= 1
            if depth == 0:
                forms.append((start_line, text[start : i + 1]))
    return forms


def _normal(text: str) -> str:
    return " ".join(text.split())


def user_rule_locations(session) -> dict[str, tuple[str, int]]:
    """{egglog's name of a rule (its :name, or its text): (file, line)} for the session's
    rule files that are not shipped."""
    shipped = set()
    for p in shipped_rule_files():
        try:
            shipped.add(p.resolve())
        except OSError:
            pass
    out: dict[str, tuple[str, int]] = {}
    for filename in getattr(session, "files", ()):
        try:
            path = Path(filename)
            if path.resolve() in shipped:
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for line, form in top_level_forms(text):
            head = form[1:].split(None, 1)[0] if len(form) > 2 else ""
            if head not in ("rule", "rewrite", "birewrite"):
                continue
            out[_normal(form)] = (filename, line)
            if ":name" in form:
                name = form.split(":name", 1)[1].strip().split('"')
                if len(name) >= 2:
                    out[name[1]] = (filename, line)
    return out


def blame_user_rules(error: DlvmError, session, saturation) -> DlvmError:
    """`error` with the user rules that fired named (file:line) and verify-rules suggested;
    `error` itself when no user rule fired."""
    fired = getattr(saturation, "rule_matches", None) or {}
    where = user_rule_locations(session)
    hits = []
    for rule, n in sorted(fired.items(), key=lambda kv: (-kv[1], kv[0])):
        loc = where.get(rule) or where.get(_normal(rule))
        if loc is not None:
            hits.append((loc, rule, n))
    if not hits:
        return error
    files = sorted({loc[0] for loc, _, _ in hits})
    label = lambda r: _normal(r) if len(_normal(r)) <= 70 else _normal(r)[:67] + "..."
    if len(hits) == 1:
        (file, line), rule, n = hits[0]
        head = f"{file}:{line}: the rule {label(rule)} produced an ill-typed term: {error}"
    else:
        head = (
            f"the optimized program is ill-typed ({error}); rules of yours that fired: "
            + "; ".join(f"{f}:{ln} {label(r)} (x{n})" for (f, ln), r, n in hits)
        )
    return UserRuleError(f"{head}\n  check the rule with: dlvm-eq verify-rules {' '.join(files)}")
