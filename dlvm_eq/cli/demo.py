"""`dlvm-eq demo`: compile and train the bundled MLP on the digits data set (what `make demo` runs)."""
from __future__ import annotations

import argparse


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="cpu", choices=("cpu", "gpu", "interp"),
                   help="where the compiled training step runs (default: cpu)")
    p.add_argument("--epochs", type=int, default=None, help="training epochs (default: 40)")
    p.add_argument("--plot", metavar="PNG", help="draw the loss curve with matplotlib")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="train data-parallel on N Ray workers, on a local Ray instance started "
                        "for the run (needs the 'distributed' extra)")


def run(args) -> int:
    from ..models import demo
    kwargs = {"target": args.target, "plot": args.plot, "seed": args.seed}
    if args.epochs is not None:
        kwargs["epochs"] = args.epochs
    if args.workers is not None:
        kwargs["workers"] = args.workers
    demo.run(**kwargs)
    return 0
