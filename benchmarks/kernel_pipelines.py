"""LLVM compile time per kernel family and pipeline: the kernels a program compiles (recorded as
dq.jit builds them, empty cache), each compiled again under each pipeline, summed per family.
What llvm_cpu.FAMILY_PIPELINE is chosen from (with each family's kernels timed at run time).

    .venv/bin/python benchmarks/kernel_pipelines.py mlp cnn tanh30
    .venv/bin/python benchmarks/kernel_pipelines.py cnn --update BENCHMARKS.md

Pipelines: O3 and O2 (speed levels) with the loop and SLP vectorizers, O3 without them, O1
without them, "cleanup" (llvm_cpu.CLEANUP: sroa, instcombine, simplifycfg, then the -O3 back
end); "shipped" is FAMILY_PIPELINE's choice. Each cell is parse + passes + emit of the
family's kernels, in ms, one process; the programs are compile_time.py's.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SECTION = "## LLVM pipeline per kernel family (compile time)"
PIPELINES = {
    "O3": (3, True),
    "O2": (2, True),
    "O3 no vectorizers": (3, False),
    "O1": (1, False),
    "cleanup": (0, False),  # llvm_cpu.CLEANUP
}


def record(program: str) -> list[tuple[str, str]]:
    """(family, LLVM IR) of every kernel compiled for `program` (compile_time.py's programs)."""
    import numpy as np

    import dlvm_eq as dq
    from dlvm_eq.codegen.runtime import jit as runtime_jit

    seen = []
    build = runtime_jit.compile_object

    def recording(text, *args, **kwargs):
        kir = sys._getframe(1).f_locals.get("kir")  # Jit.kernel's CpuIR: its family
        seen.append((getattr(kir, "kind", "other"), text))
        return build(text, *args, **kwargs)

    runtime_jit.compile_object = recording
    try:
        if program == "mlp":
            from dlvm_eq.models.mlp import init_params, loss

            rng = np.random.default_rng(0)
            params = init_params([784, 256, 10])
            x = rng.random((256, 784), dtype=np.float32)
            y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 256)]
            dq.jit(dq.value_and_grad(loss, argnums=(0, 1, 2, 3)))(*params, x, y)
        elif program.startswith("tanh"):
            depth = int(program[4:])

            def deep(x):
                for _ in range(depth):
                    x = dq.tanh(x * x + x)
                return dq.sum(x)

            dq.jit(dq.grad(deep))(np.linspace(-0.5, 0.5, 6).astype(np.float32))
        else:
            sys.path.insert(0, str(HERE))
            import models

            model = models.MODELS[program]
            params, (x, y) = model.params(), model.data()
            models.dlvm_step_functions(model)[1](params, x, y)
    finally:
        runtime_jit.compile_object = build
    return seen


def pipeline_name(pipeline: tuple[int, bool]) -> str:
    speed, vectorize = pipeline
    return "cleanup" if speed == 0 else f"O{speed}{'' if vectorize else ', no vec'}"


def table(program: str) -> str:
    import llvmlite.binding as llvm

    from dlvm_eq.codegen.cpu import llvm_cpu

    kernels = record(program)
    tm = llvm_cpu.target_machine()
    ms: dict = collections.defaultdict(lambda: collections.defaultdict(float))
    count = collections.Counter(kind for kind, _ in kernels)
    for kind, text in kernels:
        shipped = llvm_cpu.family_pipeline(kind)
        for label, (speed, vectorize) in {**PIPELINES, "shipped": shipped}.items():
            t = time.perf_counter()
            with llvm_cpu.LLVM_LOCK:
                mod = llvm.parse_assembly(text)
                mod.verify()
                llvm_cpu.run_passes(mod, tm, vectorize, speed)
                tm.emit_object(mod)
            ms[kind][label] += (time.perf_counter() - t) * 1e3
    labels = [*PIPELINES, "shipped"]
    lines = [
        "| program | family | kernels | " + " | ".join(labels) + " |",
        "|---|---|---|" + "---|" * len(labels),
    ]
    for kind in sorted(ms):
        shipped = llvm_cpu.family_pipeline(kind)
        lines.append(
            f"| {program} | {kind} | {count[kind]} | "
            + " | ".join(f"{ms[kind][label]:.0f}" for label in labels[:-1])
            + f" | {ms[kind]['shipped']:.0f} ({pipeline_name(shipped)}) |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("programs", nargs="+", help="mlp, cnn, transformer, tanhN")
    ap.add_argument("--update", type=Path, help="write the section into this markdown file")
    args = ap.parse_args(argv)
    os.environ["DLVM_EQ_CACHE_DIR"] = tempfile.mkdtemp(prefix="dq-pipelines-")  # every kernel built
    sys.path.insert(0, str(HERE))
    from common import machine_line

    tables = [table(p) for p in args.programs]
    load = os.getloadavg()[0]
    cmd = "benchmarks/kernel_pipelines.py " + " ".join(argv if argv is not None else sys.argv[1:])
    head = tables[0].splitlines()[:2]
    body = [line for t in tables for line in t.splitlines()[2:]]
    section = (
        f"{SECTION}\n\n`{cmd.strip()}`, {machine_line()}, load average {load:.1f} at the end; "
        "ms per family (parse + passes + emit), one process.\n\n" + "\n".join(head + body)
    )
    print(section)
    if args.update:
        from common import update_section

        update_section(args.update, SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
