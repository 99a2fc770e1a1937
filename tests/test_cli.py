"""dlvm-eq check / fmt / run: outputs, exit codes, and one clear message (no traceback) on mistakes."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.cli import COMMANDS, TARGETS, main
from dlvm_eq.ir.sample import sample_inputs

ROOT = Path(__file__).parent.parent
EXAMPLES = ROOT / "examples"
MLP = EXAMPLES / "mlp.dl"


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.dl")), ids=lambda p: p.name)
def test_check_examples(capsys, path):
    code, out, err = cli(capsys, "check", path)
    n = len(dq.load(path).functions)
    assert (code, out, err) == (0, f"ok: {n} function{'s' * (n != 1)}\n", "")


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.dl")), ids=lambda p: p.name)
def test_run_every_example_function_on_random_inputs(capsys, path):
    m = dq.load(path)
    for fn in m.functions.values():
        if fn.is_declaration:
            continue
        code, out, err = cli(capsys, "run", path, "-f", fn.name, "--random", "--seed", "3")
        assert code == 0, err
        assert out.startswith("out")


def _without_comments(text: str) -> str:
    from dlvm_eq.ir.comments import split_comment

    lines = [split_comment(line) for line in text.splitlines()]
    return (
        "\n".join(code.rstrip() for code, comment in lines if code.strip() or comment is None)
        + "\n"
    )


def test_fmt_prints_canonical_text_keeping_comments(capsys, tmp_path):
    code, out, _ = cli(capsys, "fmt", MLP)
    assert code == 0
    assert _without_comments(out) == str(dq.load(MLP))
    assert out.count("//") == MLP.read_text().count("//") and "init 0.0: f32" in out
    p = tmp_path / "m.dl"
    p.write_text(MLP.read_text())
    code, written, _ = cli(capsys, "fmt", p, "-i")
    assert (code, written) == (0, "")
    assert p.read_text() == out


def test_run_random_is_seeded_and_matches_the_interpreter(capsys, tmp_path):
    out_npz = tmp_path / "out.npz"
    code, out, _ = cli(capsys, "run", MLP, "-f", "mlp", "--random", "--seed", "7", "-o", out_npz)
    assert code == 0
    assert out.splitlines()[0] == "out: shape (4, 3), float32"
    saved = np.load(out_npz)["out"]
    m = dq.load(MLP)
    args = sample_inputs(m["mlp"], np.random.default_rng(7))
    np.testing.assert_array_equal(saved, dq.interpret(m, "mlp", *args))
    _, out2, _ = cli(capsys, "run", MLP, "-f", "mlp", "--random", "--seed", "7")
    _, out3, _ = cli(capsys, "run", MLP, "-f", "mlp", "--random", "--seed", "8")
    assert out2 == out and out3 != out


def test_run_with_inputs_by_name_and_position(capsys, tmp_path):
    m = dq.load(EXAMPLES / "matrix_chain.dl")
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(p.type.shape) for p in m["chain"].params]
    named = tmp_path / "named.npz"
    np.savez(named, A=arrays[0], B=arrays[1], C=arrays[2], D=arrays[3], extra=np.zeros(1))
    out_npz = tmp_path / "o.npz"
    code, out, err = cli(
        capsys,
        "run",
        EXAMPLES / "matrix_chain.dl",
        "-f",
        "@chain",
        "--inputs",
        named,
        "-o",
        out_npz,
        "--float64",
    )
    assert code == 0 and "extra" in err
    want = arrays[0] @ arrays[1] @ arrays[2] @ arrays[3]
    got = np.load(out_npz)["out"]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12)
    positional = tmp_path / "pos.npz"
    np.savez(positional, *arrays)  # arr_0 ... is numpy's default: use arg0 ... instead
    np.savez(positional, **{f"arg{i}": a for i, a in enumerate(arrays)})
    code, out, _ = cli(
        capsys, "run", EXAMPLES / "matrix_chain.dl", "-f", "chain", "--inputs", positional
    )
    assert code == 0 and out.startswith("out: shape (30, 10), float32")


def test_run_tuple_result(capsys, tmp_path):
    out_npz = tmp_path / "o.npz"
    code, out, _ = cli(
        capsys, "run", EXAMPLES / "moments.dl", "-f", "moments", "--random", "-o", out_npz
    )
    assert code == 0
    assert "out0: shape (4,), float32" in out and "out1: shape (4,), float32" in out
    saved = np.load(out_npz)
    assert sorted(saved.files) == ["out0", "out1"] and (saved["out1"] >= 0).all()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["check", "nope.dl"], "nope.dl: no such file"),
        (["run", str(MLP), "-f", "nope", "--random"], "no function @nope"),
        (["run", str(MLP), "-f", "mlp", "--inputs", str(MLP)], "cannot read as a .npz archive"),
        (["run", str(MLP), "-f", "mlp", "--inputs", "missing.npz"], "missing.npz: no such file"),
    ],
)
def test_user_mistakes_exit_1_with_one_message(capsys, argv, message):
    code, out, err = cli(capsys, *argv)
    assert code == 1 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1


def test_syntax_error_shows_location(capsys, tmp_path):
    p = tmp_path / "bad.dl"
    p.write_text(
        'module "m"\nstage raw\nfunc @f: (f32) -> f32 {\n\'entry(%x: f32):\n  %0 = exq %x: f32\n'
        "  return %0: f32\n}\n"
    )
    code, _, err = cli(capsys, "check", p)
    assert code == 1
    assert err.startswith(f"{p}:5:8: error: unknown op 'exq'")
    assert "  %0 = exq %x: f32" in err and err.splitlines()[2].endswith("^")


def test_bad_npz_inputs(capsys, tmp_path):
    wrong_shape = tmp_path / "w.npz"
    np.savez(
        wrong_shape,
        A=np.zeros((2, 2)),
        B=np.zeros((35, 15)),
        C=np.zeros((15, 5)),
        D=np.zeros((5, 10)),
    )
    code, _, err = cli(
        capsys, "run", EXAMPLES / "matrix_chain.dl", "-f", "chain", "--inputs", wrong_shape
    )
    assert code == 1 and "argument 0 has shape (2, 2)" in err
    lacking = tmp_path / "l.npz"
    np.savez(lacking, A=np.zeros((30, 35)))
    code, _, err = cli(
        capsys, "run", EXAMPLES / "matrix_chain.dl", "-f", "chain", "--inputs", lacking
    )
    assert (
        code == 1 and "no array for parameter 1 (%B: <35 x 15 x f32>)" in err and "holds A" in err
    )
    not_npz = tmp_path / "x.npz"
    not_npz.write_text("hello")
    code, _, err = cli(capsys, "run", MLP, "-f", "mlp", "--inputs", not_npz)
    assert code == 1 and "cannot read as a .npz archive" in err
    npy = tmp_path / "a.npy"
    np.save(npy, np.zeros(3))
    code, _, err = cli(capsys, "run", MLP, "-f", "mlp", "--inputs", npy)
    assert code == 1 and "not a single array" in err


def test_unwritable_output(capsys, tmp_path):
    code, _, err = cli(
        capsys, "run", MLP, "-f", "mlp", "--random", "-o", tmp_path / "no" / "such" / "o.npz"
    )
    assert code == 1 and "cannot write" in err


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["run", str(MLP), "--random"],
        ["run", str(MLP), "-f", "mlp"],
        ["run", str(MLP), "-f", "mlp", "--random", "--inputs", "x.npz"],
        ["run", str(MLP), "-f", "mlp", "--random", "--target", "tpu"],
    ],
)
def test_usage_errors_exit_2(capsys, argv):
    code, out, err = cli(capsys, *argv)
    assert code == 2 and "usage: dlvm-eq" in err


def test_help_exits_0(capsys):
    code, out, _ = cli(capsys, "--help")
    assert code == 0
    for cmd in COMMANDS:
        assert cmd.name in out


def test_commands_and_targets_are_tables():
    assert [c.name for c in COMMANDS][:3] == ["check", "fmt", "run"]
    assert "interp" in TARGETS


def _installed_script():
    script = Path(sys.executable).parent / "dlvm-eq"
    return str(script) if script.exists() else shutil.which("dlvm-eq")


@pytest.mark.skipif(
    _installed_script() is None, reason="the dlvm-eq console script is not installed"
)
def test_installed_console_script():
    script = _installed_script()
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    ok = subprocess.run(
        [script, "run", str(MLP), "-f", "mlp", "--random"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert ok.returncode == 0 and ok.stdout.startswith("out: shape (4, 3), float32")
    bad = subprocess.run(
        [script, "check", str(ROOT / "nope.dl")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert bad.returncode == 1 and "no such file" in bad.stderr and "Traceback" not in bad.stderr
