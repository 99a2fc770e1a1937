"""Nested tuple/list results, flattened for tracing and rebuilt after a call.

The IR returns flat tuples; `value_and_grad(f, argnums=(0, 1))` returns `(value, (g0, g1))`.

    leaves, tree = flatten((a, (b, c)))     # [a, b, c], ("tuple", [LEAF, ("tuple", [LEAF, LEAF])])
    unflatten(tree, [1, 2, 3])              # (1, (2, 3))
"""
from __future__ import annotations

LEAF = None


def flatten(x):
    if isinstance(x, (tuple, list)):
        leaves, subtrees = [], []
        for e in x:
            sub_leaves, sub_tree = flatten(e)
            leaves.extend(sub_leaves)
            subtrees.append(sub_tree)
        return leaves, (type(x).__name__, subtrees)
    return [x], LEAF


def unflatten(tree, leaves):
    return _build(tree, iter(leaves))


def _build(t, it):
    # a module-level function, not a recursive closure: a closure that refers to itself is a
    # reference cycle that keeps the leaves alive until the garbage collector runs
    if t is LEAF:
        return next(it)
    kind, subtrees = t
    items = [_build(s, it) for s in subtrees]
    return tuple(items) if kind == "tuple" else list(items)


def is_flat(tree) -> bool:
    """A bare leaf or a tuple of leaves: what the IR returns as it is."""
    return tree is LEAF or (tree[0] == "tuple" and all(s is LEAF for s in tree[1]))
