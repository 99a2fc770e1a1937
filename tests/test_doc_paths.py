"""Every repository path named in a docstring or comment, in the rule files' comments, in the
README, BENCHMARKS.md or the docs exists (issue 35: seven docstrings named files that had
moved). A path resolves from the repository root, from the package (`codegen/llvm/emitter.py`
is dlvm_eq/codegen/llvm/emitter.py) or from a folder above the file that names it; a bare file name
(`ops.py`) must be some file of the repository; a path inside dlvm_eq/codegen may leave out
`codegen/` (`runtime/gemm_tiles.py`), as the code names its layers. Names that stand for the reader's own files
(`FILE.dl`, `my.egg`) are listed below."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dlvm_eq"
# a relative path ending in a file type the repository holds
PATH = re.compile(
    r"(?<![\w./~$%@<-])((?:[\w.-]+/)*[\w-]+\.(?:py|egg|dl|md|toml|ll|lark|yml|yaml))(?![\w/(])"
)
URL = re.compile(r"\w+://\S+")
# the reader's files in examples and usage lines, and a tutorial's files made in a temporary
# folder (docs/tutorials/write_a_rule.py)
PLACEHOLDERS = {"my.egg", "f.dl", "x.dl", "extra.egg", "wrong.egg", "tutorial.dl", "rules.egg"}
PLACEHOLDER = re.compile(r"^(FILE|NAME|OUT|R|PROGRAM)\.\w+$")  # FILE.dl, R.egg, NAME.py, ...


def _generated_pages() -> set[Path]:
    """The pages docs/hooks.py writes at build time (they exist in the site, not on disk)."""
    text = (ROOT / "docs" / "hooks.py").read_text()
    return {ROOT / "docs" / p for p in re.findall(r'"(reference/[\w-]+\.md)"', text)}


GENERATED = _generated_pages()
FILE_NAMES = {
    p.name
    for p in ROOT.rglob("*")
    if p.is_file() and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
}


def _python_texts(path: Path) -> list[str]:
    """The docstrings and comments of a Python file."""
    source = path.read_text()
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append(doc)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out.append(tok.string)
    return out


def _egg_comments(path: Path) -> list[str]:
    return [line.split(";", 1)[1] for line in path.read_text().splitlines() if ";" in line]


def _exists(name: str, where: Path) -> bool:
    if name in PLACEHOLDERS or PLACEHOLDER.match(name.rsplit("/", 1)[-1]):
        return True
    if "/" not in name:
        return name in FILE_NAMES or (where.parent / name).resolve() in GENERATED
    # codegen's layers are named by their own folders in prose (`runtime/blas_threads.py`)
    bases = [ROOT, PACKAGE, PACKAGE / "codegen"]
    bases += [d for d in where.parents if ROOT in (d, *d.parents)]
    return any((b / name).exists() or (b / name).resolve() in GENERATED for b in bases)


def _sources() -> list[tuple[Path, list[str]]]:
    out = []
    for folder in ["dlvm_eq", "tests", "benchmarks", "examples", "scripts", "docs"]:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "data" not in path.relative_to(ROOT).parts:
                out.append((path, _python_texts(path)))
    out += [(p, _egg_comments(p)) for p in sorted((ROOT / "rules").glob("*.egg"))]
    pages = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]
    out += [(p, [p.read_text()]) for p in pages]
    return out


def named_paths(text: str) -> list[str]:
    return PATH.findall(URL.sub("", text))


def test_the_path_pattern_finds_what_prose_names():
    text = "see codegen/emitter.py (`rules/algebra.egg`), ops.py; https://x.org/a.md, ~/.cache/b.py"
    assert named_paths(text) == ["codegen/emitter.py", "rules/algebra.egg", "ops.py"]
    here = PACKAGE / "codegen" / "planning" / "plan.py"
    assert _exists("codegen/planning/plan.py", here) and _exists("runtime/gemm_tiles.py", here)
    assert not _exists("codegen/emitter.py", here)  # one of the seven the issue found
    assert not _exists("no_such_module.py", here)


def test_every_named_path_exists():
    stale = [
        f"{path.relative_to(ROOT)}: {name}"
        for path, texts in _sources()
        for text in texts
        for name in named_paths(text)
        if not _exists(name, path)
    ]
    assert stale == []
