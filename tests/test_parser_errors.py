"""Malformed inputs: each error names file:line:col, shows the line with a caret under the column,
and says what was expected."""

import pytest

import dlvm_eq as dq
from dlvm_eq.errors import DlvmError, SourceError

F = "func @f: (<2 x f32>) -> <2 x f32> {\n'entry(%x: <2 x f32>):\n"  # lines 1-2
END = "    return %0: <2 x f32>\n}\n"

# (name, text, line, column, words the message must contain)
CASES = [
    ("module name not quoted", "module m\n", 1, 8, ["unexpected 'm'", "quoted string"]),
    (
        "unknown stage",
        'module "m"\nstage cooked\n',
        2,
        7,
        ["unknown stage 'cooked'", "raw or optimizable"],
    ),
    ("unknown op", F + "    %0 = ad %x: <2 x f32>\n" + END, 3, 10, ["unknown op 'ad'", "'add'"]),
    (
        "undefined value",
        F + "    %0 = add %x: <2 x f32>, %y: <2 x f32>\n" + END,
        3,
        29,
        ["%y is not defined"],
    ),
    (
        "use before definition",
        F + "    %0 = exp %1: <2 x f32>\n    %1 = exp %x: <2 x f32>\n" + END,
        3,
        14,
        ["%1 is used before it is defined"],
    ),
    (
        "written type differs",
        F + "    %0 = exp %x: <3 x f32>\n" + END,
        3,
        18,
        ["%x has type <2 x f32> but is written as <3 x f32>"],
    ),
    (
        "redefinition",
        F + "    %x = exp %x: <2 x f32>\n" + END,
        3,
        5,
        ["%x is already defined", "line 2"],
    ),
    (
        "shapes do not broadcast",
        F + "    %0 = add %x: <2 x f32>, %y: <3 x f32>\n" + END,
        3,
        29,
        ["%y is not defined"],
    ),
    (
        "op type rule",
        "func @f: (<2 x f32>, <3 x f32>) -> <2 x f32> {\n'entry(%x: <2 x f32>, %y: <3 x f32>):\n"
        "    %0 = add %x: <2 x f32>, %y: <3 x f32>\n" + END,
        3,
        10,
        ["add: shapes do not broadcast"],
    ),
    (
        "missing 'x' in tensor type",
        F + "    %0 = exp %x: <2 f32>\n" + END,
        3,
        21,
        ["unexpected 'f32'", "'x'"],
    ),
    (
        "unknown data type",
        F + "    %0 = exp %x: <2 x f16>\n" + END,
        3,
        23,
        ["unknown data type 'f16'", "f32, f64, i32 or bool"],
    ),
    (
        "stray character",
        F + "    %0 = exp %x: <2 x f32> ^\n" + END,
        3,
        28,
        ["unexpected character '^'", "'return'", "a value like %x"],
    ),
    ("missing op", F + "    %0 =\n" + END, 4, 5, ["unexpected 'return'", "an op name"]),
    ("end of file", "func @f: (f32) -> f32 {\n", 2, 1, ["unexpected end of file", "block label"]),
    (
        "return type",
        (F + "    %0 = exp %x: <2 x f32>\n    return %0: <2 x f32>\n}\n").replace(
            "func @f: (<2 x f32>) -> <2 x f32>", "func @f: (<2 x f32>) -> f32"
        ),
        4,
        12,
        ["@f returns <2 x f32> but is declared to return f32"],
    ),
    (
        "unknown callee",
        F + "    %0 = apply @nope(%x: <2 x f32>)\n" + END,
        3,
        16,
        ["apply of unknown function @nope"],
    ),
    (
        "wrong apply arguments",
        "func @g: (f32) -> f32 {\n'entry(%a: f32):\n  return %a: f32\n}\n"
        + F.replace("@f", "@h")
        + "    %0 = apply @g(%x: <2 x f32>)\n"
        + END,
        7,
        16,
        ["@g takes (f32) but is applied to (<2 x f32>)"],
    ),
    (
        "conditional",
        F + "    %c = greaterThan %x: <2 x f32>, 0.0: f32\n"
        "    conditional %c: <2 x bool> then 'a() else 'b()\n'a():\n    return %x: <2 x f32>\n"
        "'b():\n    return %x: <2 x f32>\n}\n",
        4,
        5,
        ["%c is <2 x bool> but must be bool"],  # a diamond becomes `cond` (ir/cfg.py)
    ),
    (
        "loop",
        F + "    %0 = exp %x: <2 x f32>\n    branch 'entry(%0: <2 x f32>)\n}\n",
        4,
        12,
        ["control flow is not supported", "loop"],
    ),
    (
        "branch arguments",
        F + "    branch 'next()\n'next(%y: <2 x f32>):\n    return %y: <2 x f32>\n}\n",
        3,
        12,
        ["branch passes () but block 'next takes (<2 x f32>)"],
    ),
    (
        "unreached block",
        F + "    return %x: <2 x f32>\n'dead():\n    return %x: <2 x f32>\n}\n",
        4,
        1,
        ["block 'dead is never branched to"],
    ),
    (
        "function twice",
        "func @f: (f32) -> f32 {\n'entry(%a: f32):\n  return %a: f32\n}\n"
        "func @f: (f32) -> f32 {\n'entry(%a: f32):\n  return %a: f32\n}\n",
        5,
        6,
        ["function @f is already defined at line 1"],
    ),
    ("body missing", "func @f: (f32) -> f32\n", 1, 1, ["@f has no body", "[adjoint"]),
    (
        "adjoint of unknown",
        "[adjoint @g wrt 0]\nfunc @f: (f32) -> f32\n",
        1,
        10,
        ["unknown function @g"],
    ),
    (
        "adjoint index",
        "func @g: (f32) -> f32 {\n'entry(%a: f32):\n  return %a: f32\n}\n"
        "[adjoint @g wrt 0, 3]\nfunc @d: (f32) -> f32\n",
        5,
        20,
        ["@g has 1 parameter", "index 3 is out of range"],
    ),
    (
        "reduce combinator",
        F + "    %0 = reduce %x: <2 x f32> by sum init 0: f32 along 0\n    return %0: f32\n}\n",
        3,
        34,
        ["unknown reduction 'sum'", "add, multiply, max, min"],
    ),
    (
        "reduce axis",
        F + "    %0 = reduce %x: <2 x f32> by add init 0: f32 along 1\n    return %0: f32\n}\n",
        3,
        10,
        ["reduce: axes [1]"],
    ),
    (
        "ragged array",
        F + "    %0 = literal <<1, 2>, <3>>: <2 x 2 x f32>\n" + END,
        3,
        27,
        ["ragged"],
    ),
    (
        "array shape",
        F + "    %0 = literal <1, 2, 3>: <2 x f32>\n" + END,
        3,
        18,
        ["array literal has shape 3", "<2 x f32>"],
    ),
    (
        "int literal",
        F
        + "    %0 = dataTypeCast %x: <2 x f32> to i32\n    %1 = add %0: <2 x i32>, 1.5: i32\n"
        + END,
        4,
        29,
        ["expected an integer for an i32 literal"],
    ),
    (
        "float overflow",
        F + "    %0 = add %x: <2 x f32>, 1e39: f32\n" + END,
        3,
        29,
        ["out of range for f32"],
    ),
    ("bool literal", F + "    %0 = add %x: <2 x f32>, true: f32\n" + END, 3, 29, ["bool literal"]),
    (
        "recursion",
        F + "    %0 = apply @f(%x: <2 x f32>)\n" + END,
        3,
        5,
        ["recursive apply", "@f -> @f"],
    ),
    (
        "shapeCast size",
        F + "    %0 = shapeCast %x: <2 x f32> to 3\n" + END,
        3,
        10,
        ["shapeCast: cannot cast"],
    ),
    (
        "dimension not an integer",
        F + "    %0 = shapeCast %x: <2 x f32> to 1.5\n" + END,
        3,
        37,
        ["expected a dimension", "1.5"],
    ),
    (
        "tuple parameter",
        "func @f: ((f32, f32)) -> f32\n",
        1,
        11,
        ["parameter cannot have tuple type"],
    ),
    (
        "extract index",
        "func @f: (f32) -> f32 {\n'entry(%a: f32):\n  %t = literal (%a: f32): (f32)\n"
        "  %e = extract 2 from %t: (f32)\n  return %e: f32\n}\n",
        4,
        8,
        ["extract: index 2 out of range"],
    ),
    (
        "arity",
        F + "    %0 = exp %x: <2 x f32>, %x: <2 x f32>\n" + END,
        3,
        10,
        ["exp takes 1 operand, got 2"],
    ),
]


@pytest.mark.parametrize("name,text,line,column,words", CASES, ids=[c[0] for c in CASES])
def test_error_location(name, text, line, column, words):
    with pytest.raises(SourceError) as info:
        dq.parse(text, "bad.dl")
    e = info.value
    assert (e.filename, e.line, e.column) == ("bad.dl", line, column), str(e)
    rendered = str(e)
    assert rendered.startswith(f"bad.dl:{line}:{column}: error: ")
    for w in words:
        assert w in e.message, (w, rendered)
    # the offending line is shown with a caret under the column
    lines = rendered.splitlines()
    source_line = text.splitlines()[line - 1] if line <= len(text.splitlines()) else ""
    assert lines[1] == "    " + source_line.rstrip()
    assert lines[2] == "    " + " " * (column - 1) + "^"


def test_there_are_enough_cases():
    assert len(CASES) >= 12


def test_load_missing_file(tmp_path):
    with pytest.raises(DlvmError, match="no such file"):
        dq.load(tmp_path / "nope.dl")


def test_load_directory_and_binary(tmp_path):
    with pytest.raises(DlvmError, match="is a directory"):
        dq.load(tmp_path)
    p = tmp_path / "b.dl"
    p.write_bytes(b"\xff\xfe\x00module")
    with pytest.raises(DlvmError, match="not a text file"):
        dq.load(p)


def test_load_names_the_file_in_errors(tmp_path):
    p = tmp_path / "m.dl"
    p.write_text('module "m"\nstage nope\n')
    with pytest.raises(SourceError) as info:
        dq.load(p)
    assert str(info.value).startswith(f"{p}:2:7: error: ")
