"""`dlvm-eq cache info` and `dlvm-eq cache clear`: what the compile cache holds, and emptying it.

$ dlvm-eq cache info
cache: /home/me/.cache/dlvm_eq (trusted: private to you)
size: 1.2 MiB in 57 entries
  cpu         41
  plan         4
  ...
$ dlvm-eq cache clear
removed 57 files from /home/me/.cache/dlvm_eq
"""

from __future__ import annotations

import argparse
import warnings


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action",
        choices=("info", "clear"),
        help="info: path, size, entries by kind, trusted or not; clear: remove every entry",
    )


def run(args) -> int:
    from ..cache import shared_cache

    cache = shared_cache()
    if args.action == "clear":
        n = cache.clear()
        print(f"removed {n} file{'s' * (n != 1)} from {cache.root}")
        return 0
    with warnings.catch_warnings():  # the report below says it, once
        warnings.simplefilter("ignore")
        info = cache.info()
    trust = "trusted: private to you" if info["trusted"] else f"NOT USED: {info['problem']}"
    print(f"cache: {info['path']} ({trust})")
    if not info["exists"]:
        print("size: empty (the directory is created, private, on first use)")
        return 0
    total = sum(info["entries"].values())
    print(f"size: {_bytes(info['bytes'])} in {total} entr{'ies' if total != 1 else 'y'}")
    for kind, n in info["entries"].items():
        print(f"  {kind:<12}{n:>6}")
    if info["stale"]:
        print(
            f"stale: {info['stale']} file{'s' * (info['stale'] != 1)} of an older format "
            "(never read; `dlvm-eq cache clear` removes them)"
        )
    return 0


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
