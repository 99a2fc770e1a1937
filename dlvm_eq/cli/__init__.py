"""The `dlvm-eq` command line: one module per command group, each with `arguments(parser)`
and `run(args)`; main.py holds the table (COMMANDS) and `main`.

    dlvm-eq check | fmt       source.py        dlvm-eq opt | query   optimize.py
    dlvm-eq run               run.py           dlvm-eq grad          grad.py
    dlvm-eq codegen           codegen.py       dlvm-eq verify-rules  verify.py
    dlvm-eq demo              demo.py          dlvm-eq cache         cache.py

`python -m dlvm_eq.cli` runs it too. Commands that compile or run go through the pipeline.
May import every layer below it (pipeline, models, verify, ad, egraph, extract, codegen, ir,
cache, config, errors); nothing imports the CLI.
"""

PROG = "dlvm-eq"  # (set before the submodules load: they read it)

from .main import COMMANDS, build_parser, main  # noqa: E402
from .run import TARGETS  # noqa: E402

__all__ = ["COMMANDS", "PROG", "TARGETS", "build_parser", "main"]
