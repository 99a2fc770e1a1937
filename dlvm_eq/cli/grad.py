"""`dlvm-eq grad FILE.dl -f NAME [--wrt 1,2] [--from I] [--keeping 0] [--seedable]`: print the
adjoint of a function as DLVM IR, as a `[adjoint @NAME ...]` declaration would synthesize it.

    $ dlvm-eq grad examples/logreg.dl -f loss --wrt 0
    func @loss_grad: (<...>, ...) -> <...> { ... }
"""

from __future__ import annotations

import argparse
import sys

from ..ad import adjoint_function
from ..errors import DlvmError
from ..ir import verify
from ..ir.parser import load


def _indices(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected indices like 0,2, got {text!r}") from None


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a .dl file")
    p.add_argument(
        "-f", "--function", required=True, metavar="NAME", help="the function to differentiate"
    )
    p.add_argument(
        "--wrt",
        type=_indices,
        metavar="I,J",
        help="parameters to differentiate (default: every float one)",
    )
    p.add_argument(
        "--from",
        dest="from_index",
        type=int,
        metavar="I",
        help="the output of a tuple result to differentiate (default: all)",
    )
    p.add_argument("--keeping", type=_indices, metavar="I,J", help="outputs also returned, first")
    p.add_argument(
        "--seedable",
        action="store_true",
        help="take the output's adjoint as a last parameter (default: ones)",
    )
    p.add_argument("--name", help="the adjoint's name (default NAME_grad)")
    p.add_argument(
        "--no-optimize",
        dest="optimize",
        action="store_false",
        help="skip the algebra rules (adjoint rules only)",
    )
    p.add_argument(
        "--target", choices=("cpu", "gpu"), default="cpu", help="cost model for extraction"
    )


def run(args: argparse.Namespace) -> int:
    module = load(args.file)
    verify(module)
    fn = module[args.function]
    if fn.is_declaration and fn.adjoint is None:
        raise DlvmError(f"@{fn.name} has no body to differentiate")
    adj = adjoint_function(
        module,
        fn,
        wrt=args.wrt,
        from_index=args.from_index,
        keeping=args.keeping,
        seedable=args.seedable,
        name=args.name,
        optimize=args.optimize,
        target=args.target,
    )
    sys.stdout.write(str(adj) + "\n")
    return 0
