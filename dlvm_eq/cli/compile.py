"""`dlvm-eq compile FILE.dl [-f NAME] [--target cpu|gpu] [--measure]`: compile a function as
`dq.compile` does and print its compile report, with the predicted time of the planned program;
`--measure` runs it on random inputs and prints the measured median next to the prediction,
then each step's predicted and measured time.

    $ dlvm-eq compile examples/mlp.dl -f mlp --measure
    compiled @mlp for cpu
      ...
      predicted time per call: 41.2 us (measured profile 6eb4...); measured median 38.9 us over 20 calls (...)
        0  product   predicted  20.1 us  measured  18.7 us  64 x 784 x 32 NN
"""

from __future__ import annotations

import argparse

from ..ir import verify
from ..ir.parser import load
from .codegen import pick_function


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a .dl file")
    p.add_argument(
        "-f", "--function", metavar="NAME", help="the function (default: the only one in the file)"
    )
    p.add_argument(
        "--target", choices=("cpu", "gpu"), default="cpu", help="where it runs (default cpu)"
    )
    p.add_argument("--no-optimize", dest="optimize", action="store_false", help="skip the e-graph")
    p.add_argument(
        "--measure",
        action="store_true",
        help="run it on random inputs: the measured median next to the predicted time, per step too",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=20,
        metavar="N",
        help="calls timed with --measure (default 20)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")


def run(args: argparse.Namespace) -> int:
    from ..pipeline import compile as compile_function
    from ..pipeline.measure_time import measure_compiled

    module = load(args.file)
    verify(module)
    name = pick_function(module, args.function)
    compiled = compile_function(module, name, args.target, optimize=args.optimize)
    measured = (
        measure_compiled(compiled, repeats=args.repeats, seed=args.seed) if args.measure else None
    )
    print(compiled.report)
    if measured is not None:
        print("  steps:")
        print(compiled.report.predicted.table(measured.steps))
    return 0
