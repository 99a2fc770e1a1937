"""`dlvm-eq verify-rules [FILE.egg ...] [--strict] [-v] [--quick]`: check every rule of egglog
rule files on small symbolic tensors (dlvm_eq.verify.rules); without files, the shipped ones.

    $ dlvm-eq verify-rules rules/algebra.egg
    136 rules in rules/algebra.egg: 130 proven, ... 0 skipped, 0 failed (9.1 s)

Files are loaded in order after rules/schema.egg (pass the files a rule file builds on before
it). Exit status: 0 when no rule fails, 1 when one does (or, with --strict, when one is
skipped or stays unproven; a rule sympy ran out of time on is listed as "checked numerically"
and accepted: how far sympy gets depends on the machine's load); rule-file syntax errors print
file:line and exit 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from .interrupt import prompt_interrupt

if TYPE_CHECKING:  # the verifier (sympy, egglog: ~1.5 s) loads only for this command
    from ..verify.rules import Settings


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "files",
        nargs="*",
        metavar="FILE.egg",
        help="rule files, loaded in order (default: the shipped rules/*.egg)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="also fail when a rule is skipped or sympy cannot prove it (rules sympy "
        "runs out of time on are listed as checked numerically)",
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="list every rule, not only problems"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="at most 48 shape assignments per rule and 5 s of sympy (CI)",
    )
    p.add_argument(
        "--max-assignments",
        type=int,
        metavar="N",
        help="shape assignments checked per rule (default 400)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random points (default 0)")


def settings_from(args: argparse.Namespace) -> Settings:
    from ..verify.rules import Settings
    from ..verify.search import Space

    limit = args.max_assignments or (48 if args.quick else Space().limit)
    if limit < 1:
        raise argparse.ArgumentTypeError("--max-assignments must be at least 1")
    return Settings(
        space=Space(limit=limit), symbolic_seconds=5.0 if args.quick else 20.0, seed=args.seed
    )


def run(args: argparse.Namespace) -> int:
    with prompt_interrupt():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from ..verify.rules import verify_rules

    files = args.files
    if not files:
        from ..egraph.rulefiles import shipped_rule_files

        files = [str(p) for p in shipped_rule_files()]
        sys.stdout.write(f"checking the shipped rules: {', '.join(files)}\n")
    report = verify_rules(files, settings=settings_from(args))
    sys.stdout.write(report.render(verbose=args.verbose) + "\n")
    ok = report.ok_strict if args.strict else report.ok
    return 0 if ok else 1
