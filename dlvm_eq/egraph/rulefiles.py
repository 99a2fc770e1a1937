"""Finding the shipped rule files: the repository's rules/ first (an editable install has no
package copy), then the copy force-included in the wheel at dlvm_eq/rules."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..config import rules_dir
from ..errors import DlvmError

# The shipped rule files, in load order (each builds on the ones before it).
SHIPPED = ("schema.egg", "algebra.egg", "adjoint.egg", "fusion.egg", "attention.egg")
SHIPPED += ("attention_adjoint.egg",)  # issue 33: Attention's adjoints, after both it builds on


def rule_file(name: str) -> Path:
    return rules_dir() / name


def shipped_rule_files() -> list[Path]:
    return [rule_file(n) for n in SHIPPED]


def read_rule_file(path: str | Path) -> tuple[str, str]:
    """(text, filename) of a rule file; a missing file is the user's error, not a traceback."""
    p = Path(path)
    if not p.is_file():
        raise DlvmError(f"{path}: no such rule file")
    return p.read_text(), str(p)


_RULES_DIGEST: str | None = None


def rules_digest() -> str:
    """sha256 of the shipped rule files (names and contents), once per process: what cache
    keys of results built with them include (ir.function_cache, the plan cache)."""
    global _RULES_DIGEST
    if _RULES_DIGEST is None:
        h = hashlib.sha256()
        for p in sorted(rules_dir().glob("*.egg")):
            h.update(p.name.encode() + b"\0" + p.read_bytes())
        _RULES_DIGEST = h.hexdigest()
    return _RULES_DIGEST
