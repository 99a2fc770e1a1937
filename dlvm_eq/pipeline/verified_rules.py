"""`verify_rules=True` on dq.jit, dq.compile and dq.optimize: the user's rule files go through verify-rules
(verify/rules.py) before anything is compiled with them, and a rule it cannot prove is refused
with its file:line.

    dq.jit(f, rules=["my.egg"], verify_rules=True)   # VerificationError: my.egg:3: FAILED ...
    dq.optimize(module, rules=["my.egg"], verify_rules=True)   # the same refusal

Refused, as by `dlvm-eq verify-rules --strict`: a rule that fails (a counterexample), is
skipped (the checker cannot read it) or stays unproven. A rule sympy ran out of time on, but
that agreed on every shape assignment checked ("checked numerically"), passes as it does
there: that verdict depends on the machine's load, and refusing it would make a compile flaky.
Each file's verdict is kept per process, keyed by its path and text: a second jit of the same
rules checks nothing again, an edited file is checked again.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from ..egraph.rulefiles import read_rule_file

_VERDICTS: dict[tuple, str | None] = {}  # (path, text) of each file -> refusal text or None
_LOCK = threading.Lock()


def check_user_rules(rules, caller: str) -> None:
    """Raise VerificationError naming each rule of `rules` (paths) that verify-rules cannot
    prove; nothing when every rule is proven. `caller` starts the message ("jit")."""
    from ..verify import VerificationError

    if isinstance(rules, (str, os.PathLike)):
        rules = [rules]
    problems = [p for p in (_verdict(path) for path in rules) if p]
    if problems:
        raise VerificationError(
            f"{caller}: verify_rules=True refuses rules that verify-rules cannot prove:\n"
            + "\n".join(problems)
        )


def _verdict(path) -> str | None:
    text, name = read_rule_file(path)  # a missing file is the user's located error
    key = (str(Path(name).resolve()), text)
    with _LOCK:  # one check per file and process, also when threads jit at once
        if key not in _VERDICTS:
            from ..verify.rules import verify_rules

            report = verify_rules([name])
            refused = report.failed + report.skipped + report.unproven
            _VERDICTS[key] = "\n".join(r.render() for r in refused) or None
        return _VERDICTS[key]
