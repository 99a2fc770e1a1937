"""benchmarks/plots.py reads BENCHMARKS.md's tables as the benchmark scripts write them (the
numbers its plots show are the tables'), draws the three plots docs/benchmarks.md shows, and a
benchmark script's --update draws the plot its section feeds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import plots  # noqa: E402

TEXT = (ROOT / "BENCHMARKS.md").read_text()


def test_the_tables_read_as_numbers():
    steps = plots.step_times(TEXT)
    assert set(steps) == {"MLP", "CNN", "transformer layer"}
    assert all(steps[m]["dlvm_eq"] > 0 and "PyTorch eager" in steps[m] for m in steps)
    layers = plots.compile_times(TEXT)
    assert [n for n, _ in layers] == sorted(n for n, _ in layers) and len(layers) >= 3
    speedups = plots.egraph_speedups(TEXT)
    assert len(speedups) >= 4 and all(m > 0 and p > 0 for _, m, p in speedups)


def test_a_missing_section_is_named():
    with pytest.raises(ValueError, match="no section 'Nothing here'"):
        plots.section(TEXT, "Nothing here")


def test_the_plots_are_drawn(tmp_path):
    pytest.importorskip("matplotlib", reason="the bench extra draws the plots")
    written = plots.draw(TEXT, tmp_path)
    assert sorted(p.name for p in written) == sorted(
        p.name for p in (ROOT / "docs/img").glob("*.png")
    )
    assert all(p.stat().st_size > 10_000 for p in written)


def test_a_benchmarks_update_redraws_the_plot_its_section_feeds(tmp_path):
    """common.update_section (each script's --update) writes the section, then draws the plots
    that section feeds from the file it wrote: a changed number shows in the plot at once."""
    pytest.importorskip("matplotlib", reason="the bench extra draws the plots")
    from common import update_section

    report = tmp_path / "BENCHMARKS.md"
    report.write_text(TEXT)
    heading = "## Deep programs"
    section = plots.section(TEXT, "Deep programs")
    update_section(report, heading, heading + "\n" + section, plots_dir=tmp_path / "img")
    assert sorted(p.name for p in (tmp_path / "img").iterdir()) == ["compile_time_vs_depth.png"]
    assert plots.compile_times(report.read_text()) == plots.compile_times(TEXT)
    # a section that feeds no plot draws none
    update_section(report, "## Adjoints", "## Adjoints\n\nnothing timed\n", tmp_path / "img2")
    assert not (tmp_path / "img2").exists()
