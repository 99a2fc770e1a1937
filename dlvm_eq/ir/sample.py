"""Random arguments for an IR function: standard-normal floats, small ints, random bools.

rng = np.random.default_rng(0)
args = sample_inputs(module["mlp"], rng)     # one array per parameter, in its declared type
"""

from __future__ import annotations

import numpy as np

from ..errors import DlvmError
from .module import Function
from .types import DType, TensorType


def sample_array(t: TensorType, rng: np.random.Generator) -> np.ndarray:
    """An array of type `t`: floats ~ N(0, 1), i32 in [-5, 5], bools fair coin flips."""
    a: np.ndarray
    if t.dtype.is_float:
        a = rng.standard_normal(t.shape)
    elif t.dtype is DType.i32:
        a = rng.integers(-5, 6, size=t.shape)
    else:
        a = rng.random(t.shape) < 0.5
    return np.asarray(a, dtype=t.dtype.numpy)


def sample_inputs(fn: Function, rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for i, p in enumerate(fn.params):
        if not isinstance(p.type, TensorType):
            raise DlvmError(f"@{fn.name}: parameter {i} (%{p.name}) has tuple type {p.type}")
        out.append(sample_array(p.type, rng))
    return out
