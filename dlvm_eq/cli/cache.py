"""`dlvm-eq cache info` and `dlvm-eq cache clear`: what the compile cache holds, and emptying it.

$ dlvm-eq cache info
cache: /home/me/.cache/dlvm_eq (trusted: private to you)
size: 1.2 MiB in 57 entries
  cpu         41
  plan         4
  ...
$ dlvm-eq cache clear
removed 57 files from /home/me/.cache/dlvm_eq
kept the machine profile profiles/cpu.json (`dlvm-eq calibrate` measured it)

`clear` removes only the cache's own files and says what else it kept; it refuses a directory
that is a symbolic link or not dlvm_eq's cache (dlvm_eq/cache.py).
"""

from __future__ import annotations

import argparse
import os
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
        done = cache.clear()
        n = done.removed
        print(f"removed {n} file{'s' * (n != 1)} from {cache.root}")
        if done.profiles:
            print(
                f"kept the machine profile{'s' * (len(done.profiles) != 1)} "
                f"{_listed(done.root, done.profiles)} (`dlvm-eq calibrate` measured "
                f"{'them' if len(done.profiles) != 1 else 'it'})"
            )
        if done.kept:
            k = len(done.kept)
            print(
                f"kept {k} file{'s' * (k != 1)} that {'are' if k != 1 else 'is'} not the "
                f"cache's: {_listed(done.root, done.kept)}"
            )
        return 0
    with warnings.catch_warnings():  # the report below says it, once
        warnings.simplefilter("ignore")
        info = cache.info()
    trust = "trusted: private to you" if info["trusted"] else f"NOT USED: {info['problem']}"
    print(f"cache: {info['path']} ({trust})")
    if not info["exists"]:
        print("size: empty (the directory is created, private, on first use)")
        return 0
    if not info["trusted"]:
        return 0  # not read, not written, not described: it may not be the cache's at all
    total = sum(info["entries"].values())
    print(f"size: {_bytes(info['bytes'])} in {total} entr{'ies' if total != 1 else 'y'}")
    for kind, n in info["entries"].items():
        print(f"  {kind:<12}{n:>6}")
    if info["other"]:
        print(
            f"other: {info['other']} file{'s' * (info['other'] != 1)} not the cache's "
            "(`dlvm-eq cache clear` keeps them)"
        )
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


def _listed(root, paths, shown: int = 8) -> str:
    """Paths relative to the cache directory, the first `shown` of them."""
    names = sorted(os.path.relpath(p, root) + ("/" if p.endswith(os.sep) else "") for p in paths)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
