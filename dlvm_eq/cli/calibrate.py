"""`dlvm-eq calibrate`: time this machine for the cost model and store the profile.

    $ dlvm-eq calibrate                 # about 10-30 s; writes <cache dir>/profiles/cpu.json
    $ dlvm-eq calibrate --show          # print the stored profile (or say there is none)
    $ dlvm-eq calibrate --no-write      # measure and print only
    $ dlvm-eq calibrate --target gpu    # the current CUDA device: <cache dir>/profiles/gpu.json

Compiles made after a calibration price e-nodes with the measured rates (optimize and plan
caches key on the profile, so nothing extracted under the old prices is reused).
"""

from __future__ import annotations

import argparse


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        default="cpu",
        choices=("cpu", "gpu"),
        help="the machine to measure (default: cpu; gpu: the current CUDA device)",
    )
    p.add_argument("--show", action="store_true", help="print the stored profile, measure nothing")
    p.add_argument("--no-write", action="store_true", help="measure and print, store nothing")


def run(args) -> int:
    from ..calibration import calibrate, profile_table
    from ..extract.profile import load_profile, profile_path

    if args.show:
        profile = load_profile(args.target)
        if profile is None:
            print(
                f"no profile for {args.target} at {profile_path(args.target)}: the shipped "
                f"defaults are used (run `dlvm-eq calibrate`)"
            )
            return 0
        print(profile_table(profile))
        return 0
    profile = calibrate(args.target, write=not args.no_write)
    print(profile_table(profile))
    if not args.no_write:
        print(f"written to {profile_path(args.target)}")
    return 0
