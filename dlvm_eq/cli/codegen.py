"""`dlvm-eq codegen FILE.dl -f NAME --emit llvm|ptx [-o DIR]`: the kernels of a function.

    $ dlvm-eq codegen examples/mlp.dl -f predict --emit llvm           # LLVM IR on stdout
    $ dlvm-eq codegen examples/mlp.dl -f predict --emit ptx -o out/    # out/<kernel>.ptx, plan printed

The function goes through the pipeline exactly as `dq.compile` would (declared adjoints,
the e-graph unless `--no-optimize`, the fusion decision, the plan cache); each kernel of the
plan is emitted: LLVM IR for the host CPU (before LLVM's O3 pipeline, as handed to it) or PTX
for `--arch` (default sm_75). BLAS calls, views and copies
are not kernels; the plan printed with `-o` (or `--plan`) shows them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import DlvmError
from ..ir import verify
from ..ir.parser import load

EMITS = ("llvm", "ptx")  # codegen.kernel_texts' kinds
SUFFIX = {"llvm": ".ll", "ptx": ".ptx"}
COMMENT = {"llvm": ";", "ptx": "//"}


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a .dl file")
    p.add_argument(
        "-f", "--function", metavar="NAME", help="the function (default: the only one in the file)"
    )
    p.add_argument("--emit", choices=EMITS, required=True, help="LLVM IR (host CPU) or PTX")
    p.add_argument(
        "-o",
        "--output-dir",
        metavar="DIR",
        help="write DIR/<kernel>.ll or .ptx, one file per kernel, and print the plan",
    )
    p.add_argument("--arch", default="sm_75", help="PTX target (default sm_75; sm_75 .. sm_90)")
    p.add_argument(
        "--plan", action="store_true", help="also print the kernel plan (to stderr without -o)"
    )
    p.add_argument(
        "--no-optimize",
        dest="optimize",
        action="store_false",
        help="plan the IR as written (skip the e-graph)",
    )


def pick_function(module, name: str | None) -> str:
    """The function `-f NAME` names, or the file's only function; an error listing them
    where the file has several and no name was given (codegen and compile share it)."""
    if name is not None:
        return module[name].name
    if len(module.functions) == 1:
        return next(iter(module.functions))
    known = ", ".join("@" + n for n in module.functions)
    raise DlvmError(
        f"{len(module.functions)} functions in the file ({known}): pick one with -f NAME"
    )


def run(args: argparse.Namespace) -> int:
    from ..codegen import kernel_texts
    from ..pipeline import lower

    module = load(args.file)
    verify(module)
    name = pick_function(module, args.function)
    target = "cpu" if args.emit == "llvm" else "gpu"  # fusion is costed for that machine
    report = lower(module, name, target, optimize=args.optimize)  # as dq.compile plans it
    if report.note:
        print(f"dlvm-eq: note: {report.note}", file=sys.stderr)
    plan = report.plan
    texts = kernel_texts(plan, args.emit, args.arch)
    if args.output_dir is None:
        for kname, text in texts:
            sys.stdout.write(f"{COMMENT[args.emit]} kernel {kname}\n{text.rstrip()}\n\n")
        if args.plan:
            print(plan, file=sys.stderr)
        if not texts:
            print(
                f"dlvm-eq: note: @{name} has no kernels (only BLAS calls, views or copies)",
                file=sys.stderr,
            )
        return 0
    out = Path(args.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for kname, text in texts:
            (out / f"{kname}{SUFFIX[args.emit]}").write_text(text)
    except OSError as e:
        raise DlvmError(f"{out}: cannot write: {e.strerror or e}") from None
    print(plan)
    print(f"wrote {len(texts)} file{'s' * (len(texts) != 1)} to {out}/")
    return 0
