"""Inputs a user may hand over: a .dl file with a byte order mark, types too large to exist,
and arrays of another dtype than a compiled function declares (an error, or a cast on request)."""

import textwrap

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.cli import main
from dlvm_eq.errors import DlvmError, SourceError

SRC = textwrap.dedent("""
    module "m"
    stage raw
    func @f: (<4 x f32>, f32, i32) -> <4 x f32> {
    'entry(%x: <4 x f32>, %s: f32, %n: i32):
        %0 = multiply %x: <4 x f32>, %s: f32
        %c = dataTypeCast %n: i32 to f32
        %1 = add %0: <4 x f32>, %c: f32
        return %1: <4 x f32>
    }
""").lstrip()

BIG = "<2147483647 x 2147483647 x 2147483647 x f32>"


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_a_byte_order_mark_is_accepted(tmp_path, capsys):
    p = tmp_path / "bom.dl"
    p.write_bytes(b"\xef\xbb\xbf" + SRC.encode())
    assert cli(capsys, "check", p) == (0, "ok: 1 function\n", "")
    m = dq.load(p)
    assert str(m) == str(dq.parse(SRC))
    # positions are those of the text without the mark
    bad = b"\xef\xbb\xbf" + SRC.replace("multiply", "multiplx").encode()
    p.write_bytes(bad)
    code, _, err = cli(capsys, "check", p)
    assert code == 1 and f"{p}:5:10: error: unknown op 'multiplx'" in err


@pytest.mark.parametrize("command", ["check", "run"])
def test_a_type_too_large_to_exist_is_a_located_error(tmp_path, capsys, command):
    p = tmp_path / "big.dl"
    p.write_text(
        textwrap.dedent(f"""
        module "big"
        stage raw
        func @f: ({BIG}) -> {BIG} {{
        'entry(%x: {BIG}):
            %0 = exp %x: {BIG}
            return %0: {BIG}
        }}""").lstrip()
    )
    argv = [command, p] + (["-f", "f", "--random", "--target", "cpu"] if command == "run" else [])
    code, out, err = cli(capsys, *argv)
    assert code == 1 and out == ""
    assert err.startswith(
        f"{p}:3:11: error: {BIG}: 9903520300447984150353281023 elements of 4 bytes: "
        "more than 2^62 bytes"
    )


def test_shape_attributes_too_large_are_located():
    src = SRC.replace(
        "%c = dataTypeCast %n: i32 to f32",
        "%c = dataTypeCast %n: i32 to f32\n    %z = shapeCast %x: <4 x f32> to "
        "2147483647 x 2147483647 x 2147483647",
    )
    with pytest.raises(
        SourceError,
        match=r":7:37: error: shape 2147483647 x 2147483647 x 2147483647: \d+ elements: more than 2\^62",
    ):
        dq.parse(src)


def test_type_sizes_are_exact():
    from dlvm_eq.ir.types import F32, TensorType

    assert TensorType((2**31 - 1,) * 3, F32).size == (2**31 - 1) ** 3  # np.prod wrapped around


@pytest.fixture(scope="module")
def f():
    return dq.compile(dq.parse(SRC), "f")


def _x(dtype=np.float32):
    return np.arange(4).astype(dtype)


def test_declared_dtypes_run(f):
    got = f(_x(), np.float32(2), np.int32(3))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, _x() * 2 + 3)


@pytest.mark.parametrize("dtype", [np.float64, np.bool_, np.int64, np.float16])
def test_another_dtype_is_an_error_naming_the_argument(f, dtype):
    with pytest.raises(DlvmError) as e:
        f(_x(dtype), np.float32(2), np.int32(3))
    msg = str(e.value)
    assert f"@f: argument 0 (%x) is {np.dtype(dtype)}, declared f32" in msg
    assert "cast=True" in msg


def test_complex_and_object_arrays_are_never_cast(f):
    fc = dq.compile(dq.parse(SRC), "f", cast=True)
    for bad, what in (
        (_x(np.complex64), "complex64"),
        (np.array([1, "a", 2, 3], dtype=object), "object"),
    ):
        for fn in (f, fc):
            with pytest.raises(
                DlvmError, match=rf"argument 0 \(%x\) is a {what} array; declared f32: .*never cast"
            ):
                fn(bad, np.float32(2), np.int32(3))
    with pytest.raises(DlvmError, match="complex"):
        fc(_x(), 2j, np.int32(3))


def test_cast_true_casts(f):
    fc = dq.compile(dq.parse(SRC), "f", cast=True)
    np.testing.assert_array_equal(
        fc(_x(np.float64) + 0.25, np.float64(2), np.int64(3)), (_x() + 0.25) * 2 + 3
    )
    np.testing.assert_array_equal(fc(np.array([True, False, True, True]), 1.0, 0.0), [1, 0, 1, 1])


def test_python_numbers_are_weakly_typed(f):
    np.testing.assert_array_equal(f(_x(), 2.0, 3), _x() * 2 + 3)  # float -> f32, int -> i32
    np.testing.assert_array_equal(f([0.0, 1.0, 2.0, 3.0], 2, 3), _x() * 2 + 3)  # a list of floats
    with pytest.raises(DlvmError, match=r"argument 2 \(%n\) is a Python float, declared i32"):
        f(_x(), 2.0, 3.5)
    with pytest.raises(
        DlvmError, match=r"argument 2 \(%n\): the Python int 4294967296 does not fit i32"
    ):
        f(_x(), 2.0, 2**32)
    with pytest.raises(DlvmError, match=r"argument 1 \(%s\) is a Python bool, declared f32"):
        f(_x(), True, 3)


def test_jit_compiles_for_the_arguments_it_gets():
    # jit traces for the arguments' own types (int64 as i32, Python floats as f32): no error
    step = dq.jit(lambda x, n: x * 2.0 + n)
    got = step(np.arange(4, dtype=np.float32), np.arange(4))
    np.testing.assert_allclose(got, np.arange(4) * 3.0)


def test_cli_run_refuses_other_dtypes_for_compiled_targets_unless_cast(tmp_path, capsys):
    p = tmp_path / "f.dl"
    p.write_text(SRC)
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.arange(4.0), s=np.float64(2), n=np.int64(3))  # numpy's defaults
    code, out, err = cli(capsys, "run", p, "-f", "f", "--inputs", inputs, "--target", "cpu")
    assert code == 1 and out == ""
    assert "argument 0 (%x) is float64, declared f32" in err and "--cast" in err
    code, out, err = cli(
        capsys, "run", p, "-f", "f", "--inputs", inputs, "--target", "cpu", "--cast"
    )
    assert code == 0, err
    assert "float32" in out and "[3. 5. 7. 9.]" in out
    code, out, _ = cli(capsys, "run", p, "-f", "f", "--inputs", inputs)  # the interpreter casts
    assert code == 0 and "[3. 5. 7. 9.]" in out
