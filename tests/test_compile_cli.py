"""`dlvm-eq run --target cpu|gpu` and `dlvm-eq codegen --emit llvm|ptx [-o DIR]`."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dlvm_eq.cli import main
from dlvm_eq.codegen import gpu_available, set_cache_dir

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MLP = str(EXAMPLES / "mlp.dl")


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


def _outputs(tmp_path, target):
    out = tmp_path / f"{target}.npz"
    assert main(["run", MLP, "-f", "predict", "--random", "--target", target, "-o", str(out)]) == 0
    with np.load(out) as z:
        return {k: z[k] for k in z.files}


def test_run_on_cpu_agrees_with_the_interpreter(tmp_path, capsys):
    cpu, interp = _outputs(tmp_path, "cpu"), _outputs(tmp_path, "interp")
    assert cpu.keys() == interp.keys() == {"out"}
    np.testing.assert_allclose(cpu["out"], interp["out"], rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(cpu["out"].sum(axis=1), 1.0, rtol=1e-6)
    assert "out: shape (4, 3), float32" in capsys.readouterr().out


def test_run_on_the_gpu_without_cuda_is_one_message(capsys):
    if gpu_available():
        pytest.skip("CUDA works here")
    assert main(["run", MLP, "-f", "mlp", "--random", "--target", "gpu"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dlvm-eq: error:") and "gpu target" in err[0]


def test_run_float64_is_for_the_interpreter(capsys):
    assert main(["run", MLP, "-f", "mlp", "--random", "--target", "cpu", "--float64"]) == 1
    assert "--float64" in capsys.readouterr().err


def test_codegen_llvm_to_stdout(capsys):
    assert main(["codegen", MLP, "-f", "predict", "--emit", "llvm"]) == 0
    out = capsys.readouterr().out
    names = re.findall(r"^; kernel (\S+)$", out, re.M)
    assert names and all(n.startswith("k") for n in names)
    assert out.count("define void @") == len(names)


def test_codegen_ptx_files_per_kernel_and_the_plan(tmp_path, capsys):
    out_dir = tmp_path / "ptx"
    assert (
        main(
            [
                "codegen",
                MLP,
                "-f",
                "predict",
                "--emit",
                "ptx",
                "-o",
                str(out_dir),
                "--arch",
                "sm_90",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    files = sorted(out_dir.glob("*.ptx"))
    assert files and printed.startswith("plan @predict:")
    for f in files:
        assert f.stem in printed  # the plan names every kernel written
        text = f.read_text()
        assert ".target sm_90" in text and ".entry" in text
    ptxas = shutil.which("ptxas")
    if ptxas:
        for f in files:
            r = subprocess.run(
                [ptxas, "-arch=sm_90", str(f), "-o", str(f.with_suffix(".cubin"))],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert r.returncode == 0, r.stderr


def test_codegen_llvm_files_and_errors(tmp_path, capsys):
    out_dir = tmp_path / "ll"
    assert main(["codegen", MLP, "-f", "mlp", "--emit", "llvm", "-o", str(out_dir)]) == 0
    assert [p.suffix for p in out_dir.iterdir()] == [".ll"] * len(list(out_dir.iterdir())) != []
    capsys.readouterr()
    assert main(["codegen", MLP, "--emit", "llvm"]) == 1  # two functions: which?
    assert "-f NAME" in capsys.readouterr().err
    assert main(["codegen", MLP, "-f", "nope", "--emit", "ptx"]) == 1
    assert "no function @nope" in capsys.readouterr().err
    assert main(["codegen", MLP, "-f", "mlp", "--emit", "ptx", "--arch", "sm_20"]) == 1
    assert "unknown PTX target" in capsys.readouterr().err
