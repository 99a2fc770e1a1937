"""The `dlvm-eq` command line. Each subcommand is one small function plus its arguments,
registered in COMMANDS; `run` targets are registered in TARGETS.

    dlvm-eq check examples/mlp.dl                   # parse + verify: "ok: 2 functions"
    dlvm-eq fmt examples/mlp.dl [-i]                # canonical text (in place with -i)
    dlvm-eq run examples/mlp.dl -f mlp --random     # reference interpreter on random inputs
    dlvm-eq cache info | clear                      # the compile cache: what it holds, empty it

A user mistake prints one message to stderr and exits 1 (usage errors exit 2); no traceback.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import cli_cache, cli_codegen, cli_demo, cli_grad, cli_optimize, cli_verify
from .errors import DlvmError, SourceError
from .ir import Module, verify
from .ir.module import Function
from .ir.comments import format_with_comments
from .ir.parser import load, parse, read_source
from .ir.sample import sample_inputs
from .ir.types import TensorType
from .pipeline import interpret

PROG = "dlvm-eq"


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int | None]


# ---------------------------------------------------------------- run targets

def _run_interp(module: Module, name: str, arrays: list[np.ndarray], float64: bool):
    return interpret(module, name, *arrays, float64=float64)


def _run_compiled(target: str):
    def run(module: Module, name: str, arrays: list[np.ndarray], float64: bool):
        if float64:
            raise DlvmError(f"--float64 runs the interpreter in float64; the {target} target "
                            "computes in the function's own dtypes (drop --float64 or use --target interp)")
        from .pipeline import compile
        out = compile(module, name, target)(*arrays)
        if target == "gpu":   # CuPy arrays back to the host for printing and saving
            out = tuple(a.get() for a in out) if isinstance(out, tuple) else out.get()
        return out
    return run


# target name -> runner(module, function name, arrays, float64) -> array or tuple of arrays
TARGETS: dict[str, Callable[[Module, str, list[np.ndarray], bool], object]] = {
    "interp": _run_interp,
    "cpu": _run_compiled("cpu"),
    "gpu": _run_compiled("gpu"),
}


# ---------------------------------------------------------------- check

def _check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a .dl file")


def check(args: argparse.Namespace) -> int:
    module = load(args.file)
    verify(module)
    n = len(module.functions)
    print(f"ok: {n} function{'s' * (n != 1)}")
    return 0


# ---------------------------------------------------------------- fmt

def _fmt_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a .dl file")
    p.add_argument("-i", "--in-place", action="store_true", help="rewrite the file instead of printing")


def fmt(args: argparse.Namespace) -> int:
    source = read_source(args.file)
    module = parse(source, args.file)
    verify(module)
    text = format_with_comments(module, source)   # the source's comments kept
    if args.in_place:
        _write_text(Path(args.file), text)
    else:
        sys.stdout.write(text)
    return 0


# ---------------------------------------------------------------- run

def _run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a .dl file")
    p.add_argument("-f", "--function", required=True, metavar="NAME", help="the function to run")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--inputs", metavar="IN.npz",
                        help="arrays named after the parameters (x, w, ...) or arg0, arg1, ...")
    source.add_argument("--random", action="store_true",
                        help="standard-normal floats, small ints, random bools")
    p.add_argument("--seed", type=int, default=0, help="seed for --random (default 0)")
    p.add_argument("-o", "--output", metavar="OUT.npz", help="also save the outputs (out or out0, out1, ...)")
    p.add_argument("--float64", action="store_true", help="compute float tensors in float64")
    p.add_argument("--target", choices=sorted(TARGETS), default="interp", help="where to run (default interp)")
    p.add_argument("--cast", action="store_true",
                   help="cast --inputs arrays to the declared dtypes (cpu/gpu targets refuse others)")


def run(args: argparse.Namespace) -> int:
    module = load(args.file)
    verify(module)
    fn = module[args.function]
    if args.random:
        arrays = sample_inputs(fn, np.random.default_rng(args.seed))
    else:
        arrays = _read_inputs(Path(args.inputs), fn)
        if args.target != "interp":    # compiled code takes the declared dtypes only
            arrays = _declared_dtypes(fn, arrays, args.cast)
    result = TARGETS[args.target](module, fn.name, arrays, args.float64)
    outputs = _name_outputs(result)
    with np.printoptions(threshold=200, edgeitems=4, precision=6, linewidth=100):
        for name, a in outputs.items():
            print(f"{name}: shape {a.shape}, {a.dtype}")
            print(np.array2string(a))
    if args.output:
        _save_npz(Path(args.output), outputs)
    return 0


def _name_outputs(result) -> dict[str, np.ndarray]:
    if isinstance(result, tuple):
        return {f"out{i}": np.asarray(a) for i, a in enumerate(result)}
    return {"out": np.asarray(result)}


def _read_inputs(path: Path, fn: Function) -> list[np.ndarray]:
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise DlvmError(f"{path}: expected a .npz archive (numpy.savez), not a single array")
        with archive:
            stored = {k: archive[k] for k in archive.files}
    except DlvmError:
        raise
    except FileNotFoundError:
        raise DlvmError(f"{path}: no such file") from None
    except Exception as e:  # noqa: BLE001 - numpy raises many types for a file that is not an .npz
        raise DlvmError(f"{path}: cannot read as a .npz archive: {e}") from None
    arrays, used = [], set()
    for i, p in enumerate(fn.params):
        key = p.name if p.name in stored else f"arg{i}"
        if key not in stored:
            held = ", ".join(sorted(stored)) or "nothing"
            raise DlvmError(f"{path}: no array for parameter {i} (%{p.name}: {p.type}) of @{fn.name}; "
                            f"expected '{p.name}' or 'arg{i}', the file holds {held}")
        arrays.append(stored[key])
        used.add(key)
    unused = sorted(set(stored) - used)
    if unused:
        print(f"{PROG}: note: {path} arrays not used by @{fn.name}: {', '.join(unused)}", file=sys.stderr)
    return arrays


def _declared_dtypes(fn: Function, arrays: list[np.ndarray], cast: bool) -> list[np.ndarray]:
    from .codegen import check_argument
    return [check_argument(fn.name, i, p.name, a, p.type.shape, p.type.dtype.numpy, cast, "run with --cast")
            if isinstance(p.type, TensorType) else a
            for i, (p, a) in enumerate(zip(fn.params, arrays))]


def _save_npz(path: Path, outputs: dict[str, np.ndarray]) -> None:
    try:
        with open(path, "wb") as f:
            np.savez(f, **outputs)
    except OSError as e:
        raise DlvmError(f"{path}: cannot write: {e.strerror or e}") from None


def _write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise DlvmError(f"{path}: cannot write: {e.strerror or e}") from None


# ---------------------------------------------------------------- the table and main

COMMANDS: list[Command] = [
    Command("check", "parse and verify a .dl file", _check_arguments, check),
    Command("fmt", "print a .dl file in canonical form", _fmt_arguments, fmt),
    Command("run", "run a function of a .dl file", _run_arguments, run),
    Command("grad", "print the adjoint of a function as DLVM IR", cli_grad.arguments, cli_grad.run),
    Command("opt", "optimize a .dl file with the e-graph", cli_optimize.opt_arguments, cli_optimize.opt),
    Command("query", "the cheapest equivalent form of an expression", cli_optimize.query_arguments,
            cli_optimize.query),
    Command("verify-rules", "check rule files on small symbolic tensors", cli_verify.arguments,
            cli_verify.run),
    Command("demo", "compile and train an MLP on the digits data set", cli_demo.arguments, cli_demo.run),
    Command("codegen", "print or write the kernels of a function (LLVM IR or PTX)",
            cli_codegen.arguments, cli_codegen.run),
    Command("cache", "show (info) or empty (clear) the compile cache", cli_cache.arguments, cli_cache.run),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="DLVM IR, adjoints and optimizations in an e-graph.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in COMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.arguments(p)
        p.set_defaults(handler=cmd.run)
    return parser


def _process_start() -> float:
    """When this process started, in time.perf_counter() seconds (Linux; else: now). A time
    budget on the command line bounds the command's wall time, interpreter start included."""
    now = time.perf_counter()
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - age if 0 <= age < 60 else now


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Warnings as one line each, like errors (an untrusted cache says why it is not used)."""
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    # argv None: this is the dlvm-eq program itself, counting its time from its start
    started = _process_start() if argv is None else time.perf_counter()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # usage errors (2) and --help (0)
        return int(e.code or 0)
    args.started = started
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return int(args.handler(args) or 0)
    except SourceError as e:
        print(e, file=sys.stderr)
    except DlvmError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `dlvm-eq fmt x.dl | head`: the reader left; not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - so that the exit flush does not fail
        return 1
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
