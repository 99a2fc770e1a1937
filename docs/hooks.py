"""MkDocs hooks: the reference pages generated at build time, from the sources they describe
(the rule files, the op table, the command parser), so that none can go stale.

mkdocs.yml names this file under `hooks:`; `make docs` and tests/test_docs.py build the site.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
# this checkout's package and the generators, before any installed dlvm_eq
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent / "gen")]

from cli_reference import cli_reference_page  # noqa: E402
from ir_reference import ir_reference_page  # noqa: E402
from rule_language import rule_language_page  # noqa: E402

GENERATED = {
    "reference/rule-language.md": lambda: rule_language_page(ROOT / "rules"),
    "reference/ir.md": lambda: ir_reference_page(ROOT / "rules" / "adjoint.egg"),
    "reference/cli.md": cli_reference_page,
}


def dq_names() -> str:
    """Every public name of `dlvm_eq` (the DSL's `__all__` and the package's own), as a list."""
    import dlvm_eq
    import dlvm_eq.dsl

    names = set(dlvm_eq.dsl.__all__) | {n for n in dir(dlvm_eq) if not n.startswith("_")}
    names -= {"lazy_attributes"}  # the package's own helper, imported into its namespace
    modules = {"optim", "distributed"}  # namespaces of their own, documented below
    names = {n for n in names if not isinstance(getattr(dlvm_eq, n, None), type(sys))} | modules
    return ", ".join(f"`dq.{n}`" for n in sorted(names))


def on_page_markdown(markdown, page, config, files):
    """`<!-- dq-names -->` in a page: the list of `dq.*` names, from the package itself."""
    return markdown.replace("<!-- dq-names -->", dq_names())


def on_files(files, config):
    for path, page in GENERATED.items():
        files.append(File.generated(config, path, content=page()))
    return files
