"""GPU code generation: every generated PTX is assembled by `ptxas` for sm_75 and sm_90
(skipped only where ptxas is absent); kernels run on a GPU where CuPy and CUDA work (`gpu`)."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from dlvm_eq.codegen import (
    BINARY_OPS,
    UNARY_OPS,
    Cast,
    GpuUnavailable,
    KernelInput,
    KernelSpec,
    Load,
    ReduceSpec,
    Select,
    binary,
    evaluate,
    gpu_available,
    ptx_kernel,
    set_cache_dir,
    unary,
)
from dlvm_eq.codegen.gpu.gpu_runtime import arch_for, compile_gpu, cupy_module
from dlvm_eq.codegen.kernels.spec import DTYPES

PTXAS = shutil.which("ptxas")


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


ARCHS = ["sm_75", "sm_90"]
needs_ptxas = pytest.mark.skipif(PTXAS is None, reason="ptxas is not on PATH")


def assemble(ptx: str, arch: str, tmp_path) -> None:
    src = tmp_path / f"k_{arch}.ptx"
    src.write_text(ptx)
    r = subprocess.run(
        [PTXAS, f"-arch={arch}", str(src), "-o", str(tmp_path / f"k_{arch}.cubin")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, f"ptxas -arch={arch} failed:\n{r.stderr}"


def _all_unary(dt):
    return KernelSpec(
        f"unary_{dt}",
        (1000,),
        [KernelInput(dt)],
        [unary(op, Load(0)) for op, dts in sorted(UNARY_OPS.items()) if dt in dts],
    )


def _all_binary(dt):
    ops = [op for op, (dts, _) in sorted(BINARY_OPS.items()) if dt in dts]
    return KernelSpec(
        f"binary_{dt}",
        (1000,),
        [KernelInput(dt), KernelInput(dt)],
        [binary(op, Load(0), Load(1)) for op in ops],
    )


def _casts(src):
    return KernelSpec(
        f"cast_{src}",
        (100,),
        [KernelInput(src)],
        [Cast(Load(0), d) for d in ("f32", "f64", "i32", "bool")],
    )


X = Load(0)
SPECS = {
    **{f"unary_{dt}": _all_unary(dt) for dt in ("f32", "f64", "i32", "bool")},
    **{f"binary_{dt}": _all_binary(dt) for dt in ("f32", "f64", "i32", "bool")},
    **{f"cast_{dt}": _casts(dt) for dt in ("f32", "f64", "i32", "bool")},
    "select": KernelSpec(
        "sel",
        (64,),
        [KernelInput("bool"), KernelInput("f32")],
        [Select(Load(0), Load(1), -Load(1))],
    ),
    "row_broadcast": KernelSpec(
        "row",
        (37, 129),
        [KernelInput("f32"), KernelInput.broadcast("f32", (129,), (37, 129))],
        [unary("sigmoid", X * 1.5 + Load(1)) * X],
    ),
    "3d_broadcast": KernelSpec(
        "b3",
        (5, 6, 70),
        [KernelInput("f64"), KernelInput.broadcast("f64", (5, 1, 70), (5, 6, 70))],
        [binary("pow", X, Load(1)), X - Load(1)],
    ),
    "transposed": KernelSpec("tr", (200, 300), [KernelInput("f32", (1, 200))], [X * 2.0]),
    "index_64bit": KernelSpec("big", (2**31 + 7,), [KernelInput("f32")], [unary("exp", X)]),
    "reduce_trailing_max": ReduceSpec("rmax", (64, 1000), [KernelInput("f32")], X, "max", (1,)),
    "reduce_trailing_softmax_sum": ReduceSpec(
        "rsum",
        (64, 1000),
        [KernelInput("f32"), KernelInput.broadcast("f32", (64, 1), (64, 1000))],
        unary("exp", X - Load(1)),
        "add",
        (1,),
    ),
    "reduce_leading_add": ReduceSpec("cadd", (1000, 64), [KernelInput("f64")], X, "add", (0,)),
    "reduce_middle_min": ReduceSpec("mmin", (10, 20, 30), [KernelInput("i32")], X, "min", (1,)),
    "reduce_all_mul": ReduceSpec("all", (10, 20, 30), [KernelInput("f32")], X, "mul", (0, 1, 2)),
    "reduce_bias_gradient": ReduceSpec(
        "bgrad", (8, 6, 5, 4), [KernelInput("f32")], X, "add", (0, 2, 3)
    ),
}


@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_generated_ptx_assembles(name, arch, tmp_path):
    kp = ptx_kernel(SPECS[name], arch)
    assert f".target {arch}" in kp.ptx and f".entry {kp.symbol}" in kp.ptx
    assert ".extern" not in kp.ptx  # polynomial math: nothing to link (no libdevice)
    assemble(kp.ptx, arch, tmp_path)


def test_map_kernel_is_a_grid_stride_loop_with_declared_widths():
    small = ptx_kernel(SPECS["row_broadcast"], "sm_90")
    for reg in ("%ctaid.x", "%ntid.x", "%tid.x", "%nctaid.x"):
        assert reg in small.ptx
    assert (
        small.index_bits == 32
        and ".param .u32" in small.ptx
        and ".param .u64" not in small.ptx.replace(".u64 .ptr", "")
    )
    assert ".ptr .global" in small.ptx  # addrspace(1) pointers
    big = ptx_kernel(SPECS["index_64bit"], "sm_75")
    assert big.index_bits == 64
    assert small.int_args() == [37, 129, 129, 1, 0, 1]  # dims, then each input's strides


def test_arch_choice_and_unavailable_gpu_is_a_clear_error():
    assert arch_for("75") == "sm_75" and arch_for(86) == "sm_86" and arch_for(120) == "sm_90"
    with pytest.raises(GpuUnavailable):
        arch_for(70)
    if not gpu_available():
        with pytest.raises(GpuUnavailable, match="CuPy|CUDA"):
            cupy_module()


# ------------------------------------------------------------------ on a GPU


@pytest.fixture
def cp():
    try:
        return cupy_module()
    except GpuUnavailable as e:
        pytest.skip(str(e))


RNG = np.random.default_rng(7)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name",
    [
        "unary_f32",
        "unary_f64",
        "binary_f32",
        "binary_i32",
        "cast_f32",
        "row_broadcast",
        "3d_broadcast",
        "transposed",
    ],
)
def test_gpu_map_kernels_match_reference(cp, name):
    spec = SPECS[name]
    arrays = []
    for inp in spec.inputs:
        size = inp.min_size(spec.shape)
        a = (
            RNG.uniform(0.1, 4.0, size)
            if inp.dtype in ("f32", "f64")
            else RNG.integers(1, 50, size)
        )
        arrays.append(a.astype(DTYPES[inp.dtype]))
    got = compile_gpu(spec)(*[cp.asarray(a) for a in arrays])
    got = [got] if not isinstance(got, tuple) else list(got)
    for g, want in zip(got, evaluate(spec, arrays, compute="f64")):
        g = cp.asnumpy(g)
        # float results within 2e-6 of float64 (rounded to the output dtype), others exact
        np.testing.assert_allclose(
            g.astype(np.float64),
            want.astype(g.dtype).astype(np.float64),
            rtol=2e-6 if g.dtype == np.float32 else 1e-13,
        )


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name",
    [
        "reduce_trailing_max",
        "reduce_trailing_softmax_sum",
        "reduce_leading_add",
        "reduce_middle_min",
        "reduce_all_mul",
    ],
)
def test_gpu_reductions_match_reference(cp, name):
    spec = SPECS[name]
    arrays = [
        (
            RNG.uniform(0.99, 1.01, inp.min_size(spec.shape)) * (50 if inp.dtype == "i32" else 1)
        ).astype(DTYPES[inp.dtype])
        for inp in spec.inputs
    ]
    got = cp.asnumpy(compile_gpu(spec)(*[cp.asarray(a) for a in arrays]))
    np.testing.assert_allclose(got, evaluate(spec, arrays)[0], rtol=1e-5)


# ------------------------------------------------------------------ GPU logic, emulated on the CPU


def _run_emulated(spec, arrays):
    """Run the GPU kernel's IR on the CPU as one thread of one block (same ABI as the GPU)."""
    import ctypes

    from dlvm_eq.codegen.cpu.llvm_cpu import CpuIR
    from dlvm_eq.codegen.gpu.llvm_ptx import host_emulation_ir
    from dlvm_eq.codegen.runtime.jit import JIT

    text, symbol, layout, bits = host_emulation_ir(spec)
    addr = JIT.address(CpuIR(text, symbol, layout, "emulated"))
    ity = ctypes.c_int32 if bits == 32 else ctypes.c_int64
    tail = [int(v) for v in layout.dims_array()]
    if isinstance(spec, KernelSpec):
        outs = [np.empty(spec.shape, DTYPES[t]) for t in spec.output_dtypes]
        head = [spec.size]
    else:
        outs = [np.empty(spec.out_shape, DTYPES[spec.dtype])]
        n_red = int(np.prod([spec.shape[a] for a in spec.axes]))
        head = [outs[0].size, n_red, n_red]  # one slice: the whole reduction
    ptrs = [a.ctypes.data for a in outs + arrays]
    fn = ctypes.CFUNCTYPE(
        None,
        *[ity] * len(head),
        *[ctypes.c_void_p] * len(ptrs),
        *[ity] * len(tail),
        *[ctypes.c_int32] * 6,
    )(addr)
    fn(*head, *ptrs, *tail, 0, 1, 0, 1, 0, 1)  # one thread of one block
    return outs


@pytest.mark.parametrize(
    "name",
    [
        "unary_f32",
        "binary_f64",
        "row_broadcast",
        "3d_broadcast",
        "transposed",
        "reduce_trailing_softmax_sum",
        "reduce_leading_add",
        "reduce_middle_min",
        "reduce_all_mul",
    ],
)
def test_gpu_kernel_logic_matches_reference_when_emulated_on_cpu(name):
    spec = SPECS[name]
    arrays = [
        (
            RNG.uniform(0.5, 1.5, inp.min_size(spec.shape)) * (50 if inp.dtype == "i32" else 1)
        ).astype(DTYPES[inp.dtype])
        for inp in spec.inputs
    ]
    for got, want in zip(_run_emulated(spec, arrays), evaluate(spec, arrays, compute="f64")):
        rtol = 2e-6 if got.dtype == np.float32 else 1e-13
        np.testing.assert_allclose(
            got.astype(np.float64), want.astype(got.dtype).astype(np.float64), rtol=rtol
        )
