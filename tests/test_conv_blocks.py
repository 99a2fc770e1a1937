"""Convolution blocking from the profile (issue 36): the column matrix's chunk of images and the
largest group product run one per image (runtime/conv_cpu.py) come from the calibrated profile
(`conv_blocks`, timed by `calibration.measure.conv_blocks` over alternatives), the shipped
constants where there is none. Other blocks take the other strategy; the results stay PyTorch's
(float64) and the interpreter's."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_calibration import cache_dir, sample_profile  # noqa: F401  (a fixture)

import dlvm_eq as dq
from dlvm_eq.calibration import measure
from dlvm_eq.codegen.runtime import conv_blocks, conv_cpu
from dlvm_eq.extract.profile import Profile, ProfileError, write_profile

PER_IMAGE = {"chunk_bytes": 64 << 20, "per_image_macs": 1 << 30}  # every product per image
CHUNKED = {"chunk_bytes": 1 << 12, "per_image_macs": 1 << 10}  # chunks, one image apiece


@pytest.fixture
def shipped_blocks_after():
    yield
    conv_blocks.use_blocks(None)
    assert conv_blocks.BLOCKS == conv_blocks.SHIPPED


def test_profile_keeps_its_conv_blocks():
    p = sample_profile(conv_blocks=CHUNKED)
    assert Profile.from_json(p.to_json()) == p
    assert Profile.from_json(sample_profile().to_json()).conv_blocks == {}


@pytest.mark.parametrize(
    "blocks",
    [
        {"chunk_bytes": 0, "per_image_macs": 1 << 18},
        {"chunk_bytes": 1 << 20},
        {"chunk_bytes": 1 << 20, "per_image_macs": 262144.5},
        {"chunk_bytes": 1 << 40, "per_image_macs": 1 << 18},
    ],
)
def test_malformed_conv_blocks_are_refused(blocks):
    data = json.loads(sample_profile().to_json())
    data["conv_blocks"] = blocks
    with pytest.raises(ProfileError):
        Profile.from_json(json.dumps(data))


def _torch(op, x, w, dy, attrs):
    import torch

    x, w, dy = (torch.from_numpy(a.astype(np.float64)).requires_grad_() for a in (x, w, dy))
    y = torch.nn.functional.conv2d(x, w, padding=attrs["padding"][0], groups=attrs["groups"])
    if op == "conv2d":
        return y.detach().numpy()
    (y * dy).sum().backward()
    return (x if op == "conv2dBackwardInput" else w).grad.numpy()


@pytest.mark.parametrize("groups", [1, 4])
def test_every_blocking_gives_torchs_results(groups, shipped_blocks_after):
    pytest.importorskip("torch")
    rng = np.random.default_rng(groups)
    x = rng.standard_normal((3, 8, 6, 6), dtype=np.float32)
    w = rng.standard_normal((8, 8 // groups, 3, 3), dtype=np.float32)
    dy = rng.standard_normal((3, 8, 6, 6), dtype=np.float32)
    attrs = dict(stride=(1, 1), padding=(1, 1, 1, 1), dilation=(1, 1), groups=groups)
    g = conv_cpu.geometry_for("conv2d", x.shape, w.shape, x.dtype, attrs)

    def matmul(a, b, out):
        np.matmul(a, b, out=out)

    cases = [
        ("conv2d", (x, w), attrs),
        ("conv2dBackwardInput", (dy, w), {**attrs, "size": (6, 6)}),
        ("conv2dBackwardWeight", (x, dy), {**attrs, "size": (3, 3)}),
    ]
    for blocks, small, per_chunk in ((PER_IMAGE, True, 3), (CHUNKED, False, 1)):
        assert conv_blocks.use_blocks(blocks)
        assert conv_cpu.per_image(g, 8, groups) is small
        assert conv_cpu.chunk_images(g, 3) == per_chunk
        for op, args, a in cases:
            want = _torch(op, x, w, dy, attrs)
            got = conv_cpu.evaluate(op, args, a, matmul)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert not conv_blocks.use_blocks(CHUNKED)  # the same blocks again change nothing


def test_a_profiles_conv_blocks_reach_the_compiled_program(cache_dir, shipped_blocks_after):
    write_profile(sample_profile(conv_blocks=CHUNKED))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, 5, 5), dtype=np.float32)
    w = rng.standard_normal((4, 4, 3, 3), dtype=np.float32)

    def f(x, w):
        return dq.sum(dq.tanh(dq.conv2d(x, w, padding=1)))

    got = dq.jit(dq.grad(f, argnums=(0, 1)))(x, w)
    assert conv_blocks.BLOCKS == CHUNKED
    want = dq.jit(dq.grad(f, argnums=(0, 1)), target="interp")(x, w)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b).max())


def test_calibration_prices_the_blockings_and_keeps_the_fastest(monkeypatch):
    seconds = {1 << 16: 1.0, 1 << 18: 2.0, 1 << 20: 3.0}  # per-image products measured slower

    def timed(fn, repeats, cap_s):
        return seconds[conv_blocks.BLOCKS["per_image_macs"]]

    monkeypatch.setattr(measure, "fastest_seconds", timed)
    got = measure.conv_blocks(shapes=(((2, 1, 4, 4), (2, 1, 3, 3), 1, 1),))
    assert got == {"chunk_bytes": 64 << 20, "per_image_macs": 1 << 16}
    assert conv_blocks.BLOCKS == conv_blocks.SHIPPED  # calibrating leaves the blocks as they were
