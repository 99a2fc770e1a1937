"""Finding the shipped rule files: the repository's rules/ first (an editable install has no
package copy), then the copy force-included in the wheel at dlvm_eq/rules."""

from __future__ import annotations

from pathlib import Path

from ..cache import shared_cache
from ..config import rules_dir
from ..digests import files_digest
from ..errors import DlvmError

# The shipped rule files, in load order (each builds on the ones before it).
SHIPPED = ("schema.egg", "algebra.egg", "adjoint.egg", "fusion.egg", "attention.egg")
SHIPPED += ("attention_adjoint.egg",)  # issue 33: Attention's adjoints, after both it builds on
SHIPPED += ("loops.egg",)  # issue 30: constant selectors of conds and switches (needs cval)
SHIPPED += ("layout.egg",)  # issue 36: transposes moved and cancelled, batched operand order
SHIPPED += ("per_example.egg",)  # issue 31: per-example gradients reduced unstored (DP-SGD)
SHIPPED += ("merge_adjoint.egg",)  # issue 33: x^T [dQ|dK|dV], facts noted by the adjoint


def rule_file(name: str) -> Path:
    return rules_dir() / name


def shipped_rule_files() -> list[Path]:
    return [rule_file(n) for n in SHIPPED]


def read_rule_file(path: str | Path) -> tuple[str, str]:
    """(text, filename) of a rule file; a missing or unreadable file, or one that is not
    UTF-8, is the user's error (located at the first bad byte), not a traceback."""
    p = Path(path)
    if not p.is_file():
        raise DlvmError(f"{path}: no such rule file")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise DlvmError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        return data.decode("utf-8"), str(p)
    except UnicodeDecodeError as e:
        from .rule_text import RuleFileError

        line = data.count(b"\n", 0, e.start) + 1
        bol = data.rfind(b"\n", 0, e.start) + 1
        eol = data.find(b"\n", e.start)
        src = data[bol : eol if eol >= 0 else len(data)].decode("utf-8", "replace")
        col = len(data[bol : e.start].decode("utf-8", "replace")) + 1
        raise RuleFileError(
            f"not a UTF-8 text file (byte 0x{data[e.start]:02x} at offset {e.start} is not "
            "UTF-8; save the file as UTF-8)",
            str(p),
            line,
            col,
            src,
        ) from None


_RULES_DIGEST: str | None = None


def rules_digest() -> str:
    """sha256 of the shipped rule files (names and contents), once per process: what cache
    keys of results built with them include (ir.function_cache, the plan cache). Read from the
    cache where the files' stat signature was hashed before (digests.files_digest): a warm
    process reads no rule file."""
    global _RULES_DIGEST
    if _RULES_DIGEST is None:
        files = [(p.name, str(p)) for p in sorted(rules_dir().glob("*.egg"))]
        _RULES_DIGEST = files_digest(files, shared_cache())
    return _RULES_DIGEST
