"""The command-line reference, generated from the `dlvm-eq` parser (`dlvm_eq.cli.COMMANDS`):
each command's `--help`, as argparse prints it, so that the page and the program agree.

    markdown = cli_reference_page()
"""

from __future__ import annotations

import argparse
import os

from dlvm_eq.cli import COMMANDS, PROG, build_parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its subcommands here and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def cli_reference_page() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps at the terminal's width: a fixed one here
    parser = build_parser()
    subs = _subparsers(parser)
    out = [
        "# Command line",
        "",
        f"*Generated from the `{PROG}` parser (`dlvm_eq/cli/main.py`, `COMMANDS`) when the site",
        "is built: each section is the command's `--help`.*",
        "",
        f"`{PROG} COMMAND --help` prints the same. A mistake prints one message and exits 1",
        "(usage errors exit 2); errors in a `.dl` or `.egg` file name file:line:col.",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    out += [f"| [`{c.name}`](#{c.name}) | {c.help} |" for c in COMMANDS]
    for c in COMMANDS:
        out += ["", f"## {c.name}", "", "```", subs[c.name].format_help().rstrip(), "```"]
    return "\n".join(out) + "\n"
