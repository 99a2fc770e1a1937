"""`dlvm-eq opt` and `dlvm-eq query`: the optimizer on the command line.

    $ dlvm-eq opt examples/matrix_chain.dl --explain          # optimized IR on stdout, report on stderr
    $ dlvm-eq query "A @ B @ C" --shape A=30x35 --shape B=35x15 --shape C=15x5
    $ dlvm-eq query "(Dot (Dot A B) C)" --shape A=30x35 --shape B=35x15 --shape C=15x5

`dlvm_eq.cli.main` lists both in its COMMANDS table (`opt_arguments`/`opt`,
`query_arguments`/`query`); `opt` goes through the pipeline (declared adjoints resolved).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

from ..errors import DlvmError
from ..extract.machine import MACHINES
from .interrupt import prompt_interrupt


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(
            f"expected NAME=DIMS like A=30x35 (or s=scalar), got {text!r}"
        )
    dims = dims.strip()
    if dims in ("", "scalar", "()"):
        return name.strip(), ()
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: dimensions are positive integers joined by x, like 30x35"
        ) from None
    if any(d < 1 for d in shape):
        raise argparse.ArgumentTypeError(f"{text!r}: dimensions must be at least 1")
    return name.strip(), shape


def _budget_item(text: str) -> tuple[str, float]:
    key, sep, value = text.partition("=")
    if key not in ("iterations", "nodes", "work", "seconds") or not sep:
        raise argparse.ArgumentTypeError(
            f"expected iterations=N, nodes=N, work=N or seconds=S, got {text!r}"
        )
    try:
        number = float(value) if key == "seconds" else int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: {value!r} is not a number") from None
    # nan compares false with every limit: the budget would never stop anything
    if not (math.isfinite(number) and number > 0):
        kind = "a finite number" if key == "seconds" else "a whole number"
        raise argparse.ArgumentTypeError(f"{text!r}: {key} must be {kind} above 0")
    return key, number


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rules",
        nargs="+",
        action="extend",
        default=[],
        metavar="R.egg",
        help="extra rule files, loaded after rules/algebra.egg",
    )
    p.add_argument(
        "--target", choices=sorted(MACHINES), default="cpu", help="cost model (default cpu)"
    )
    p.add_argument(
        "--budget",
        type=_budget_item,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="saturation budget: iterations=N, nodes=N, work=N (these decide the program), "
        "seconds=S (a wall-clock safety net; default 600) (repeatable)",
    )


# ---------------------------------------------------------------- opt


def opt_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a .dl file")
    p.add_argument("-f", "--function", metavar="NAME", help="optimize only this function")
    _common(p)
    p.add_argument(
        "--extractor",
        choices=("greedy", "ilp", "tree"),
        default="greedy",
        help="extraction method (default greedy)",
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help="write each result before and after, costs, stop reason, e-graph sizes and "
        "rules fired to stderr",
    )
    p.add_argument(
        "--no-never-slower",
        dest="never_slower",
        action="store_false",
        help="write the e-graph's program even where the never-slower guard keeps the program "
        "as written (a predicted gain within the cost model's error)",
    )
    p.add_argument("-o", "--output", metavar="OUT.dl", help="write the optimized module here")


def _deadline(args: argparse.Namespace):
    """The budget's seconds counted from when the command started (starting Python, loading
    egglog, the rules and the program are part of the time the user waits for)."""
    from ..egraph.deadline import Deadline
    from ..egraph.ruleset_schedule import Budget

    started = getattr(args, "started", None)  # set by dlvm_eq.cli.main.main
    return Deadline(
        Budget.of(dict(args.budget) or None).seconds,
        start=time.perf_counter() if started is None else started,
    )


def opt(args: argparse.Namespace) -> int:
    with prompt_interrupt():
        return _opt(args)


def _opt(args: argparse.Namespace) -> int:
    from ..ir import verify
    from ..ir.parser import load
    from ..pipeline import optimize  # declared adjoints resolved first

    module = load(args.file)
    verify(module)
    result = optimize(
        module,
        func=args.function,
        rules=args.rules,
        target=args.target,
        budget=dict(args.budget) or None,
        extractor=args.extractor,
        explain=args.explain,
        deadline=_deadline(args),
        never_slower=args.never_slower,
    )
    text = str(result.module)
    if args.output:
        _write(Path(args.output), text)
    else:
        sys.stdout.write(text)
    if args.explain:
        print(result.report, file=sys.stderr)
    return 0


def _write(path: Path, text: str) -> None:
    """Write through a temporary file and a rename: Ctrl-C leaves the file whole or as it was."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise DlvmError(f"{path}: cannot write: {e.strerror or e}") from None


# ---------------------------------------------------------------- query


def query_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "expression",
        metavar="EXPR",
        help='infix like "A @ B @ C" or "sum(X * (U @ V.T))", or an s-expression over '
        'the schema constructors like "(Dot (Dot A B) C)"',
    )
    p.add_argument(
        "--shape",
        type=_shape,
        action="append",
        default=[],
        metavar="NAME=DIMS",
        help="a variable's shape, e.g. A=30x35 (repeat per variable; s=scalar)",
    )
    p.add_argument(
        "--dtype", choices=("f32", "f64"), default="f32", help="element type (default f32)"
    )
    _common(p)
    p.add_argument(
        "-k",
        "--alternatives",
        type=int,
        default=4,
        metavar="N",
        help="how many next-best forms to show (default 4)",
    )


def query(args: argparse.Namespace) -> int:
    from ..egraph.query import query as run_query

    with prompt_interrupt():
        result = run_query(
            args.expression,
            dict(args.shape),
            dtype=args.dtype,
            target=args.target,
            rules=args.rules,
            budget=dict(args.budget) or None,
            alternatives=max(args.alternatives, 0),
            deadline=_deadline(args),
        )
    print(result)
    return 0
