"""`dlvm-eq demo`: compile and train a bundled model: the MLP on the digits data set (the default,
what `make demo` runs), a CNN on the same digits (`--model cnn`), a GRU reading them as a sequence through dq.scan
(`--model rnn`, rows as steps or `--sequence pixels`), or a transformer encoder that learns to
sort digit sequences (`--model transformer`)."""

from __future__ import annotations

import argparse


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default="mlp",
        choices=("mlp", "cnn", "rnn", "transformer"),
        help="which bundled model to train (default: mlp)",
    )
    p.add_argument(
        "--target",
        default="cpu",
        choices=("cpu", "gpu", "interp"),
        help="where the compiled training step runs (default: cpu)",
    )
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="training epochs (default: mlp 40, cnn 25, rnn 30, transformer 3)",
    )
    p.add_argument(
        "--dropout",
        type=float,
        default=0.0,
        metavar="RATE",
        help="cnn: drop the dense layer's inputs with probability RATE in training (default 0)",
    )
    p.add_argument(
        "--batch-norm",
        action="store_true",
        help="cnn: batch norm after each convolution (running statistics at test time)",
    )
    p.add_argument("--plot", metavar="PNG", help="draw the loss curve with matplotlib")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--sequence",
        default=None,
        choices=("rows", "pixels"),
        help="rnn: the digits as 8 steps of a row (default) or 64 steps of a pixel",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="train data-parallel on N Ray workers, on a local Ray instance started "
        "for the run (needs the 'distributed' extra)",
    )


def run(args) -> int:
    from ..errors import DlvmError
    from ..models import cnn_demo, demo, rnn_demo, transformer_demo

    kwargs = {"target": args.target, "plot": args.plot, "seed": args.seed}
    if args.epochs is not None:
        kwargs["epochs"] = args.epochs
    if args.workers is not None:
        if args.model != "mlp":
            raise DlvmError("--workers trains the MLP demo only (use --model mlp)")
        kwargs["workers"] = args.workers
    if args.dropout or args.batch_norm:
        if args.model != "cnn":
            raise DlvmError("--dropout and --batch-norm train the CNN demo only (use --model cnn)")
        if not 0.0 <= args.dropout < 1.0:
            raise DlvmError(f"--dropout must be in [0, 1), got {args.dropout}")
        kwargs.update(dropout=args.dropout, batch_norm=args.batch_norm)
    if args.sequence is not None:
        if args.model != "rnn":
            raise DlvmError("--sequence is for the GRU demo only (use --model rnn)")
        kwargs["sequence"] = args.sequence
    models = {"mlp": demo, "cnn": cnn_demo, "rnn": rnn_demo, "transformer": transformer_demo}
    models[args.model].run(**kwargs)
    return 0
