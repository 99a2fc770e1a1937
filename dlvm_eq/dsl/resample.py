"""Upsampling of NCHW images by integer factors, with adjoints from the ops it is made of:

    dq.upsample(x, 2)                     # nearest: each pixel repeated (a broadcast + reshape)
    dq.upsample(x, 2, mode="bilinear")    # a constant interpolation matrix per axis (two dots)

bilinear is torch's interpolate(mode="bilinear", align_corners=False), which for upsampling is
jax.image.resize(method="linear"): half-pixel centres, the edges clamped.
"""

from __future__ import annotations

import numpy as np

from . import ops
from .context import shape_error
from .linalg import matmul
from .ops import shape_of
from .primitive import dtype_of
from .shapes import repeat


def _factors(scale_factor) -> tuple[int, int]:
    f = (scale_factor,) * 2 if isinstance(scale_factor, (int, np.integer)) else tuple(scale_factor)
    if len(f) != 2 or any(not isinstance(v, (int, np.integer)) or v < 1 for v in f):
        raise shape_error(
            f"upsample: scale_factor must be a positive int or two, got {scale_factor!r}"
        )
    return int(f[0]), int(f[1])


def linear_weights(n: int, factor: int) -> np.ndarray:
    """(n * factor, n): row o interpolates input positions at (o + 0.5) / factor - 0.5."""
    out = np.zeros((n * factor, n))
    for o in range(n * factor):
        src = max((o + 0.5) / factor - 0.5, 0.0)
        i0 = min(int(np.floor(src)), n - 1)
        i1 = min(i0 + 1, n - 1)
        frac = src - i0
        out[o, i0] += 1.0 - frac
        out[o, i1] += frac
    return out


def upsample(x, scale_factor, mode="nearest"):
    """x (N, C, H, W) -> (N, C, H * sh, W * sw)."""
    shape = tuple(shape_of(x))
    if len(shape) != 4:
        raise shape_error(f"upsample: the input must be NCHW (rank 4), got shape {shape}")
    sh, sw = _factors(scale_factor)
    if mode == "nearest":
        return repeat(repeat(x, sh, axis=2), sw, axis=3)
    if mode != "bilinear":
        raise shape_error(f"upsample: mode must be 'nearest' or 'bilinear', not {mode!r}")
    n, c, h, w = shape
    dt = dtype_of(x).numpy
    along_w = matmul(x, linear_weights(w, sw).T.astype(dt))  # (N, C, H, W')
    swapped = ops.transpose(along_w, (0, 1, 3, 2))  # (N, C, W', H)
    along_h = matmul(swapped, linear_weights(h, sh).T.astype(dt))  # (N, C, W', H')
    return ops.transpose(along_h, (0, 1, 3, 2))
