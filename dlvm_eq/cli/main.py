"""The `dlvm-eq` command table and `main`: each subcommand is one module of this package (its
`arguments` and `run`), listed in COMMANDS.

    dlvm-eq check examples/mlp.dl                   # parse + verify: "ok: 2 functions"
    dlvm-eq fmt examples/mlp.dl [-i]                # canonical text (in place with -i)
    dlvm-eq run examples/mlp.dl -f mlp --random     # reference interpreter on random inputs
    dlvm-eq cache info | clear                      # the compile cache: what it holds, empty it
    dlvm-eq calibrate                               # measure this machine for the cost model

A user mistake prints one message to stderr and exits 1 (usage errors exit 2); no traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import DlvmError, SourceError
from . import PROG, cache, calibrate, codegen, compile, demo, grad, optimize, run, source, verify


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int | None]


# ---------------------------------------------------------------- the table and main

COMMANDS: list[Command] = [
    Command("check", "parse and verify a .dl file", source.check_arguments, source.check),
    Command("fmt", "print a .dl file in canonical form", source.fmt_arguments, source.fmt),
    Command("run", "run a function of a .dl file", run.arguments, run.run),
    Command("grad", "print the adjoint of a function as DLVM IR", grad.arguments, grad.run),
    Command("opt", "optimize a .dl file with the e-graph", optimize.opt_arguments, optimize.opt),
    Command(
        "query",
        "the cheapest equivalent form of an expression",
        optimize.query_arguments,
        optimize.query,
    ),
    Command(
        "verify-rules", "check rule files on small symbolic tensors", verify.arguments, verify.run
    ),
    Command("demo", "compile and train an MLP on the digits data set", demo.arguments, demo.run),
    Command(
        "codegen",
        "print or write the kernels of a function (LLVM IR or PTX)",
        codegen.arguments,
        codegen.run,
    ),
    Command(
        "compile",
        "compile a function: its report, predicted time (and measured, --measure)",
        compile.arguments,
        compile.run,
    ),
    Command("cache", "show (info) or empty (clear) the compile cache", cache.arguments, cache.run),
    Command(
        "calibrate",
        "time this machine for the cost model (a profile in the cache)",
        calibrate.arguments,
        calibrate.run,
    ),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="DLVM IR, adjoints and optimizations in an e-graph."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in COMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.arguments(p)
        p.set_defaults(handler=cmd.run)
    return parser


def _process_start() -> float:
    """When this process started, in time.perf_counter() seconds (Linux; else: now). A time
    budget on the command line bounds the command's wall time, interpreter start included."""
    now = time.perf_counter()
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - age if 0 <= age < 60 else now


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Warnings as one line each, like errors (an untrusted cache says why it is not used)."""
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    # argv None: this is the dlvm-eq program itself, counting its time from its start
    started = _process_start() if argv is None else time.perf_counter()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # usage errors (2) and --help (0)
        return int(e.code or 0)
    args.started = started
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return int(args.handler(args) or 0)
    except SourceError as e:
        print(e, file=sys.stderr)
    except DlvmError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `dlvm-eq fmt x.dl | head`: the reader left; not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - so that the exit flush does not fail
        return 1
    return 1
