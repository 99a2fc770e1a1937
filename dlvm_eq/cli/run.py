"""`dlvm-eq run FILE.dl -f NAME (--inputs IN.npz | --random) [--target interp|cpu|gpu]`: run a
function of a .dl file (declared adjoints included) and print or save its outputs.

    $ dlvm-eq run examples/mlp.dl -f mlp --random     # reference interpreter on random inputs
    $ dlvm-eq run examples/mlp.dl -f mlp --inputs in.npz --target cpu -o out.npz

`run` targets are registered in TARGETS; every one goes through the pipeline.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import DlvmError
from ..ir import Module, verify
from ..ir.module import Function
from ..ir.parser import load
from ..ir.sample import sample_inputs
from ..ir.types import TensorType
from ..pipeline import interpret
from . import PROG


def _run_interp(module: Module, name: str, arrays: list[np.ndarray], float64: bool):
    return interpret(module, name, *arrays, float64=float64)


def _run_compiled(target: str):
    def run(module: Module, name: str, arrays: list[np.ndarray], float64: bool):
        if float64:
            raise DlvmError(
                f"--float64 runs the interpreter in float64; the {target} target "
                "computes in the function's own dtypes (drop --float64 or use --target interp)"
            )
        from ..pipeline import compile

        out = compile(module, name, target)(*arrays)
        if target == "gpu":  # CuPy arrays back to the host for printing and saving
            out = tuple(a.get() for a in out) if isinstance(out, tuple) else out.get()
        return out

    return run


# target name -> runner(module, function name, arrays, float64) -> array or tuple of arrays
TARGETS: dict[str, Callable[[Module, str, list[np.ndarray], bool], object]] = {
    "interp": _run_interp,
    "cpu": _run_compiled("cpu"),
    "gpu": _run_compiled("gpu"),
}


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a .dl file")
    p.add_argument("-f", "--function", required=True, metavar="NAME", help="the function to run")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--inputs",
        metavar="IN.npz",
        help="arrays named after the parameters (x, w, ...) or arg0, arg1, ...",
    )
    source.add_argument(
        "--random", action="store_true", help="standard-normal floats, small ints, random bools"
    )
    p.add_argument("--seed", type=int, default=0, help="seed for --random (default 0)")
    p.add_argument(
        "-o", "--output", metavar="OUT.npz", help="also save the outputs (out or out0, out1, ...)"
    )
    p.add_argument("--float64", action="store_true", help="compute float tensors in float64")
    p.add_argument(
        "--target", choices=sorted(TARGETS), default="interp", help="where to run (default interp)"
    )
    p.add_argument(
        "--cast",
        action="store_true",
        help="cast --inputs arrays to the declared dtypes (cpu/gpu targets refuse others)",
    )


def run(args: argparse.Namespace) -> int:
    module = load(args.file)
    verify(module)
    fn = module[args.function]
    if args.random:
        arrays = sample_inputs(fn, np.random.default_rng(args.seed))
    else:
        arrays = _read_inputs(Path(args.inputs), fn)
        if args.target != "interp":  # compiled code takes the declared dtypes only
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
    except Exception as e:
        raise DlvmError(f"{path}: cannot read as a .npz archive: {e}") from None
    arrays, used = [], set()
    for i, p in enumerate(fn.params):
        key = p.name if p.name in stored else f"arg{i}"
        if key not in stored:
            held = ", ".join(sorted(stored)) or "nothing"
            raise DlvmError(
                f"{path}: no array for parameter {i} (%{p.name}: {p.type}) of @{fn.name}; "
                f"expected '{p.name}' or 'arg{i}', the file holds {held}"
            )
        arrays.append(stored[key])
        used.add(key)
    unused = sorted(set(stored) - used)
    if unused:
        print(
            f"{PROG}: note: {path} arrays not used by @{fn.name}: {', '.join(unused)}",
            file=sys.stderr,
        )
    return arrays


def _declared_dtypes(fn: Function, arrays: list[np.ndarray], cast: bool) -> list[np.ndarray]:
    from ..codegen import check_argument

    return [
        check_argument(
            fn.name, i, p.name, a, p.type.shape, p.type.dtype.numpy, cast, "run with --cast"
        )
        if isinstance(p.type, TensorType)
        else a
        for i, (p, a) in enumerate(zip(fn.params, arrays))
    ]


def _save_npz(path: Path, outputs: dict[str, np.ndarray]) -> None:
    try:
        with open(path, "wb") as f:
            np.savez(f, **outputs)
    except OSError as e:
        raise DlvmError(f"{path}: cannot write: {e.strerror or e}") from None
