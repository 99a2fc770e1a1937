"""`dlvm-eq check FILE.dl` and `dlvm-eq fmt FILE.dl [-i]`: a .dl file parsed and verified,
or printed in canonical form with its comments kept (`--cfg`: whiles and conds written as
DLVM's blocks, branches and conditionals, comments dropped).

    $ dlvm-eq check examples/mlp.dl                   # "ok: 2 functions"
    $ dlvm-eq fmt examples/mlp.dl -i                  # rewritten in place
    $ dlvm-eq fmt tests/data/control_flow/loops.dl --cfg   # loops as blocks and branches
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import DlvmError
from ..ir import verify
from ..ir.cfg_printer import print_module_cfg
from ..ir.comments import format_with_comments
from ..ir.parser import load, parse, read_source


def check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a .dl file")


def check(args: argparse.Namespace) -> int:
    module = load(args.file)
    verify(module)
    n = len(module.functions)
    print(f"ok: {n} function{'s' * (n != 1)}")
    return 0


def fmt_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a .dl file")
    p.add_argument(
        "-i", "--in-place", action="store_true", help="rewrite the file instead of printing"
    )
    p.add_argument(
        "--cfg",
        action="store_true",
        help="write while loops and conds as DLVM's blocks with arguments, branch and "
        "conditional (comments are not kept)",
    )


def fmt(args: argparse.Namespace) -> int:
    source = read_source(args.file)
    module = parse(source, args.file)
    verify(module)
    if getattr(args, "cfg", False):
        text = print_module_cfg(module)
    else:
        text = format_with_comments(module, source)  # the source's comments kept
    if args.in_place:
        write_text(Path(args.file), text)
    else:
        sys.stdout.write(text)
    return 0


def write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise DlvmError(f"{path}: cannot write: {e.strerror or e}") from None
