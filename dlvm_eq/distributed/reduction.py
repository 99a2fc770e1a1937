"""Combining the shards' outputs into the whole batch's: a weighted sum, leaf by leaf, in shard
order, accumulated in float64 and cast back to each leaf's dtype.

    combine([(v0, (g0,)), (v1, (g1,))], weights=(0.6, 0.4))  # (0.6*v0 + 0.4*v1, (0.6*g0 + 0.4*g1,))

The order is fixed (shard 0 first) and the arithmetic is plain numpy on the driver, so the
same shard outputs always give the same bits. This is the reduction "through the object store": each
worker's output is one object the driver fetches. (Ray's own collectives, `ray.util.collective`,
run their CPU backend on torch.distributed's gloo, which dlvm_eq does not depend on; a driver-side
sum also fixes the order, which a ring all-reduce over a changing worker count would not.)
"""

from __future__ import annotations

import numpy as np

from ..dsl import tree_flatten, tree_unflatten
from ..errors import DlvmError


def combine(outputs, weights):
    """sum_i weights[i] * outputs[i], for outputs that are pytrees of float arrays/scalars of one
    structure (what every worker's copy of the same step returns)."""
    flat = [tree_flatten(out) for out in outputs]
    leaves0, tree = flat[0]
    for leaves, other in flat[1:]:
        if other != tree:  # cannot happen for one step function; a guard against a changed fn
            raise DlvmError("data_parallel: workers returned results of different structure")
    combined = []
    for k, first in enumerate(leaves0):
        dtype = np.asarray(first).dtype
        if dtype.kind != "f":
            raise DlvmError(
                f"data_parallel: output {k} has dtype {dtype}; only float outputs "
                f"(values and gradients) can be combined across shards"
            )
        total = np.zeros(np.shape(first), np.float64)
        for (leaves, _), w in zip(flat, weights):
            total += w * np.asarray(leaves[k], np.float64)
        total = total.astype(dtype)
        # the same kind of object the step returns: an array stays an array, a scalar a scalar
        combined.append(total if isinstance(first, np.ndarray) else total[()])
    return tree_unflatten(tree, combined)
