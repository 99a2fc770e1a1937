"""Shared by the benchmark scripts: a clean BLAS environment, timing, tables, BENCHMARKS.md.

    reexec_without(OPENBLAS_OVERRIDES)            # first thing, before numpy is imported
    t = median_time(step, repeats=50, warmup=5)   # seconds per call (Timing: median, spread)
    print(markdown_table(["implementation", "ms"], rows))
    update_section(Path("BENCHMARKS.md"), "## MLP training step", text)
    with Busy(): ...                              # one process spinning on the last CPU
    row = child_json(tree, CHILD, ["mlp"], cache)  # a fresh process on one source tree

Imports nothing heavy at module level, so that `reexec_without` runs before numpy loads
OpenBLAS (which reads its environment once, at load time).
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

# OpenBLAS's core-type override picks the Haswell kernels on this AVX-512 machine: x @ w1 of
# the MLP step takes 0.43 ms instead of 0.24 (measured on the 2-core AVX-512 EPYC).
OPENBLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_REEXEC_MARK = "DLVM_EQ_BENCH_UNSET"


def child_json(
    tree: Path, code: str, argv: Sequence[str], cache: str, env: dict | None = None, timeout=600
) -> dict:
    """The JSON object a fresh `python -c code *argv` prints last, importing dlvm_eq from
    `tree` with its disk cache in `cache` (and `env` on top), run from the temporary directory
    so that neither the working directory nor stale bytecode settings pick the tree."""
    import tempfile

    full = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    full.update(PYTHONPATH=str(tree), DLVM_EQ_CACHE_DIR=cache, **(env or {}))
    run = subprocess.run(
        [sys.executable, "-c", code, *argv],
        env=full,
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} ({tree}): {run.stderr[-1500:]}")
    import json

    return json.loads(run.stdout.strip().splitlines()[-1])


def pin_threads(argv: Sequence[str]) -> int | None:
    """--threads N: this process on its first N CPUs, before numpy, OpenBLAS, torch or JAX size
    their thread pools (call it at import time, before they load)."""
    if "--threads" not in argv:
        return None
    n = int(argv[list(argv).index("--threads") + 1])
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cpus[:n])
    return n


def reexec_without(names: Sequence[str] = OPENBLAS_OVERRIDES) -> dict[str, str]:
    """Restart this process without the environment variables `names`, if any is set.

    Returns the variables that were removed (name -> value), in the restarted process too
    (passed along in $DLVM_EQ_BENCH_UNSET), so the script can say what it did."""
    present = {n: os.environ[n] for n in names if n in os.environ}
    if present:
        if "numpy" in sys.modules:
            raise RuntimeError("reexec_without must run before numpy is imported")
        env = {k: v for k, v in os.environ.items() if k not in present}
        env[_REEXEC_MARK] = ";".join(f"{k}={v}" for k, v in present.items())
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    mark = os.environ.get(_REEXEC_MARK, "")
    return dict(item.split("=", 1) for item in mark.split(";") if item)


@dataclass
class Timing:
    """Seconds per call over `repeats` timed calls after warm-up."""

    median: float
    q1: float
    q3: float
    repeats: int

    @property
    def ms(self) -> float:
        return self.median * 1e3

    @property
    def spread_ms(self) -> float:
        """The interquartile range, in ms."""
        return (self.q3 - self.q1) * 1e3


def median_time(
    fn: Callable[[], object],
    repeats: int = 50,
    warmup: int = 5,
    sync: Callable[[object], object] | None = None,
) -> Timing:
    """Call `fn` `warmup` times, then time `repeats` calls one by one. `sync(result)` runs
    inside the timed region (e.g. `block_until_ready` for asynchronous JAX results)."""
    for _ in range(warmup):
        out = fn()
        if sync is not None:
            sync(out)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        if sync is not None:
            sync(out)
        times.append(time.perf_counter() - t0)
    q1, _, q3 = statistics.quantiles(times, n=4)
    return Timing(statistics.median(times), q1, q3, repeats)


def ratio_text(value: float, baseline: float) -> str:
    """`value / baseline` as `1.53x`; '-' when either is missing."""
    if value is None or baseline is None or baseline <= 0:
        return "-"
    return f"{value / baseline:.2f}x"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table; cells are str()-ed, None prints as '-'."""
    cell = lambda v: "-" if v is None else str(v)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def timing_table(
    rows: Sequence[dict],
    baseline: str,
    name_header: str = "implementation",
    ratio_header: str | None = None,
) -> str:
    """A table of timings with a ratio column against the row named `baseline`.

    rows: dicts with "name", "timing" (a Timing or None when it did not run), "note"."""
    base = next(
        (r["timing"].median for r in rows if r["name"] == baseline and r.get("timing")), None
    )
    ratio_header = ratio_header or f"time / {baseline}"
    body = []
    for r in rows:
        t = r.get("timing")
        body.append(
            [
                r["name"],
                f"{t.ms:.3f}" if t else None,
                f"{t.spread_ms:.3f}" if t else None,
                ratio_text(t.median, base) if t else None,
                r.get("note", ""),
            ]
        )
    return markdown_table([name_header, "median ms", "IQR ms", ratio_header, "note"], body)


def machine_line() -> str:
    """CPU model, cores, Python, numpy and its BLAS: one line for a results section."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    parts = [cpu, f"{os.cpu_count()} cores", f"Python {platform.python_version()}"]
    try:
        import numpy as np

        parts.append(f"numpy {np.__version__}")
        config = np.show_config(mode="dicts") or {}
        blas = config.get("Build Dependencies", {}).get("blas", {})
        if blas:
            parts.append(f"{blas.get('name', 'BLAS')} {blas.get('version', '')}".strip())
        from threadpoolctl import threadpool_info  # which kernels OpenBLAS picked

        for info in threadpool_info():
            if info.get("internal_api") == "openblas" and "numpy" in info.get(
                "filepath", ""
            ) + info.get("prefix", ""):
                parts.append(
                    f"OpenBLAS core {info.get('architecture')}, {info.get('num_threads')} threads"
                )
                break
    except Exception:
        pass
    return ", ".join(parts)


def update_section(path: Path, heading: str, text: str, plots_dir: Path | None = None) -> None:
    """Replace the section `heading` of markdown file `path` (up to the next '## ' heading)
    with `text`, or append it; other sections are left as they are. Then the plots that section
    feeds are drawn again (plots.redraw; into plots_dir when given)."""
    doc = path.read_text() if path.exists() else "# Benchmarks\n"
    text = text.rstrip() + "\n"
    if not text.startswith(heading):
        text = f"{heading}\n\n{text}"
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(doc):
        doc = pattern.sub(lambda _: text + "\n", doc, count=1).rstrip() + "\n"
    else:
        doc = doc.rstrip() + "\n\n" + text
    path.write_text(doc)
    from plots import redraw  # this folder's module (benchmarks/plots.py)

    for written in redraw(Path(path), heading, plots_dir):
        print(f"plot: {written}")


class Busy:
    """A process spinning on the last CPU while the `with` block runs."""

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            os.sched_setaffinity(self.proc.pid, {max(os.sched_getaffinity(0))})
        except (AttributeError, OSError):
            pass
        time.sleep(0.3)
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()
