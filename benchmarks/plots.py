"""Plots of BENCHMARKS.md's tables for the documentation site (docs/benchmarks.md shows them):
step time against peers, compile time against depth, and what the e-graph buys per model.

    python benchmarks/plots.py            # every plot again; writes docs/img/*.png

A benchmark script's --update draws the plot its section feeds right after writing the section
(common.update_section -> redraw), from the tables in BENCHMARKS.md, so a plot shows what the
table says (matplotlib, from the `bench` extra, is needed only to draw).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img"


def section(text: str, heading: str) -> str:
    """The text under a `#`-heading that starts with `heading`, up to the next one as deep."""
    m = re.search(rf"^(#+) {re.escape(heading)}.*$", text, re.M)
    if not m:
        raise ValueError(f"BENCHMARKS.md has no section {heading!r}")
    rest = text[m.end() :]
    end = re.search(rf"^#{{1,{len(m.group(1))}}} ", rest, re.M)
    return rest[: end.start()] if end else rest


def table(text: str, first_column: str) -> list[dict[str, str]]:
    """The rows of the first Markdown table whose header starts with `first_column`."""
    lines = text.splitlines()
    for k, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_column:
            rows = []
            for row in lines[k + 2 :]:
                if not row.startswith("|"):
                    break
                values = [c.strip() for c in row.strip().strip("|").split("|")]
                rows.append(dict(zip(cells, values)))
            return rows
    raise ValueError(f"no table starting with {first_column!r}")


def number(cell: str) -> float:
    return float(re.match(r"[\d.,]+", cell).group(0).replace(",", ""))


def step_times(text: str) -> dict[str, dict[str, float]]:
    """model -> implementation -> median ms, for the training steps timed against peers."""
    out = {}
    mlp = section(text, "MLP training step")
    out["MLP"] = {r["implementation"]: number(r["median ms"]) for r in table(mlp, "implementation")}
    models = section(text, "Model training steps")
    for heading, name in [("CNN", "CNN"), ("transformer encoder layer", "transformer layer")]:
        rows = table(section(models, heading), "implementation")
        out[name] = {r["implementation"]: number(r["median ms"]) for r in rows}
    return out


def compile_times(text: str) -> list[tuple[int, float]]:
    """(layers, seconds to the first call, cold) of the deep-programs table."""
    rows = table(section(text, "Deep programs"), "layers n")
    return [(int(number(r["layers n"])), number(r["first call s (cold)"])) for r in rows]


def egraph_speedups(text: str) -> list[tuple[str, float, float]]:
    """(model, measured speedup, predicted speedup) with the algebra on against off."""
    rows = table(section(text, "What the e-graph buys"), "model")
    return [
        (r["model"].split(",")[0], number(r["measured speedup"]), number(r["predicted speedup"]))
        for r in rows
    ]


PEERS = ["dlvm_eq", "numpy hand-written", "PyTorch eager", "torch.compile", "JAX jit"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_step_times(text: str, out: Path = OUT) -> list[Path]:
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    steps = step_times(text)
    fig, axes = plt.subplots(1, len(steps), figsize=(11, 3.4))
    for ax, (model, times) in zip(axes, steps.items()):
        names = [
            p for p in PEERS if p in times or (p == "JAX jit" and any("JAX" in t for t in times))
        ]
        values = [
            times.get(p) or next(v for k, v in times.items() if k.startswith("JAX")) for p in names
        ]
        ax.barh(
            names[::-1],
            values[::-1],
            color=["#4c72b0" if n == "dlvm_eq" else "#bbbbbb" for n in names[::-1]],
        )
        ax.set_title(f"{model} training step")
        ax.set_xlabel("median ms per step (less is better)")
    fig.tight_layout()
    written.append(out / "step_time_vs_peers.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def draw_compile_depth(text: str, out: Path = OUT) -> list[Path]:
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    layers = compile_times(text)
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.plot([n for n, _ in layers], [s for _, s in layers], "o-", color="#4c72b0")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("layers n of x = tanh(x*x + x)")
    ax.set_ylabel("first call of jit(grad), s (cold)")
    ax.set_title("Compile time against depth")
    fig.tight_layout()
    written.append(out / "compile_time_vs_depth.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def draw_egraph_speedups(text: str, out: Path = OUT) -> list[Path]:
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    models = egraph_speedups(text)
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    y = range(len(models))
    ax.barh(
        [k + 0.2 for k in y], [m[1] for m in models], height=0.4, label="measured", color="#4c72b0"
    )
    ax.barh(
        [k - 0.2 for k in y], [m[2] for m in models], height=0.4, label="predicted", color="#dd8452"
    )
    ax.set_yticks(list(y), [m[0] for m in models])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ticks = [t for t in (1, 1.5, 2, 5, 10, 20) if t <= 1.2 * max(m[1] for m in models)]
    ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("speedup, algebra rules on against off")
    ax.set_title("What the e-graph buys, per model")
    ax.legend()
    fig.tight_layout()
    written.append(out / "egraph_speedup_per_model.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


# the section a benchmark script writes -> the plot it redraws (common.update_section)
DRAWN_FROM = {
    "## MLP training step": draw_step_times,
    "## Model training steps (CNN, transformer encoder layer)": draw_step_times,
    "## Deep programs": draw_compile_depth,
    "## What the e-graph buys (algebra off vs on)": draw_egraph_speedups,
}


def draw(text: str, out: Path = OUT) -> list[Path]:
    """Every plot (`python benchmarks/plots.py`)."""
    return [
        p for f in (draw_step_times, draw_compile_depth, draw_egraph_speedups) for p in f(text, out)
    ]


def redraw(path: Path, heading: str, out: Path | None = None) -> list[Path]:
    """The plots fed by section `heading` of `path`, drawn again from it: what a benchmark
    script's --update runs after writing its section. Into docs/img for the repository's
    BENCHMARKS.md, else beside `path` (img/); nothing where matplotlib is missing."""
    draw_one = DRAWN_FROM.get(heading)
    if draw_one is None:
        return []
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plots not redrawn: matplotlib is in the bench extra (pip install -e '.[bench]')")
        return []
    if out is None:
        out = OUT if path.resolve() == (ROOT / "BENCHMARKS.md").resolve() else path.parent / "img"
    try:
        return draw_one(path.read_text(), out)
    except ValueError as e:  # a file without the other sections a plot needs
        print(f"plot not redrawn: {e}")
        return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmarks", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    for path in draw(Path(args.benchmarks).read_text(), Path(args.out)):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


if __name__ == "__main__":
    main()
