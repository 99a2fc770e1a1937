"""The documentation site builds with warnings as errors (`mkdocs build --strict`, as `make
docs` runs it), and its generated reference pages say what the sources say: every op of the
op table with an example that parses, every ruleset and constructor of rules/*.egg, every
command of `dlvm-eq`. Skipped only where MkDocs is not installed (the test extra installs it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "gen"))

from cli_reference import cli_reference_page  # noqa: E402
from ir_reference import EXAMPLES, example, ir_reference_page, spelling  # noqa: E402
from rule_language import rule_files, rule_language_page  # noqa: E402

import dlvm_eq as dq  # noqa: E402
from dlvm_eq.cli import COMMANDS  # noqa: E402
from dlvm_eq.ir.ops import OPS  # noqa: E402


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="MkDocs is not installed: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings")
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return out


def test_the_site_builds_with_warnings_as_errors(site):
    for page in [
        "index.html",
        "getting-started/index.html",
        "tutorials/write-a-rule/index.html",
        "reference/api/index.html",
        "reference/ir/index.html",
        "reference/rule-language/index.html",
        "reference/cli/index.html",
        "benchmarks/index.html",
    ]:
        assert (site / page).is_file(), page
    api = (site / "reference/api/index.html").read_text()
    for name in ["value_and_grad", "data_parallel", "adam", "verify_rules", "make_ir"]:
        assert 'id="dlvm_eq.' in api and name in api, name  # rendered from the docstrings
    # the tutorial pages include their scripts (snippets), so the asserts are on the page
    page = re.sub(r"<[^>]+>", "", (site / "tutorials/write-a-rule/index.html").read_text())
    assert "def main()" in page and "assert t_before / t_after &gt; 1.5" in page


def test_the_ir_reference_lists_every_op_with_an_example_that_parses():
    page = ir_reference_page(ROOT / "rules" / "adjoint.egg")
    # every elementwise op and every op of the table's families today has an example; an op
    # added later still gets its row (from its table entry) until docs/gen/ir_reference.py
    # has an example for it
    assert all(spelling(name) is not None for name in OPS if name in EXAMPLES)
    for name, spec in OPS.items():
        assert f"| `{name}` |" in page and f"`{spec.egg}`" in page
        if name == "extract" or spelling(name) is None:  # a tuple operand; no example yet
            continue
        inst, signature = spelling(name)
        types, _ = example(name)
        result = signature.split(" -> ")[-1]
        params = ", ".join(f"%{chr(97 + k)}: {t}" for k, t in enumerate(types))
        text = (
            f'module "m"\nstage raw\n\nfunc @f: ({", ".join(map(str, types))}) -> {result} {{\n'
            f"'entry({params}):\n    {inst}\n    return %r: {result}\n}}\n"
        )
        if name == "apply":
            text += (
                "func @g: (<2 x 3 x f32>) -> <2 x f32> {\n'entry(%x: <2 x 3 x f32>):\n"
                "    %s = reduce %x: <2 x 3 x f32> by add init 0: f32 along 1\n"
                "    return %s: <2 x f32>\n}\n"
            )
        module = dq.parse(text)  # parses and type-checks: the page's spelling is the IR's
        assert str(module["f"].result_type) == result
    # adjoints come from rules/adjoint.egg: exp's is g * exp(x)
    assert "| `exp` |" in page and "0: `(Multiply g (Exp x))`" in page


def test_the_rule_language_page_names_every_ruleset_and_constructor():
    page = rule_language_page(ROOT / "rules")
    sources = "\n".join(p.read_text() for p in rule_files(ROOT / "rules"))
    for name in re.findall(r"^\(ruleset ([\w-]+)\)", sources, re.M):
        assert f"### `{name}`" in page, name
    schema = (ROOT / "rules" / "schema.egg").read_text()
    datatype = schema[schema.index("(datatype Term") :]
    for name in re.findall(r"\(([A-Z]\w*)[\s)]", datatype):
        assert f"| `{name}` |" in page, name
    for name in ["shape", "dtype", "positive", "nonzero"]:
        assert f"| `{name}` |" in page, name  # the analyses a guard may use


def test_the_cli_reference_has_every_command():
    page = cli_reference_page()
    for c in COMMANDS:
        assert f"## {c.name}" in page and f"usage: dlvm-eq {c.name}" in page


def test_the_readme_example_runs_as_written(tmp_path):
    """The README's Python example, run as a reader pastes it (a fresh process)."""
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        DLVM_EQ_CACHE_DIR=str(tmp_path / "cache"),
        PYTHONIOENCODING="utf-8",
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "func @loss" in run.stdout  # the traced IR
    assert "compiled @loss for cpu" in run.stdout and "kernels:" in run.stdout  # the report
