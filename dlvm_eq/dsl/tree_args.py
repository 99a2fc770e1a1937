"""Pytree arguments of a traced function: flattened to leaves (one IR parameter each), checked,
named after their paths, and rebuilt before the user's function sees them.

    args = ({"w1": w1, "b1": b1}, x)                 # loss(params, x)
    leaves, in_tree = flatten_args(args, loss, "jit")  # [b1, w1, x], types checked
    leaf_names(loss, in_tree)                        # ['params_b1', 'params_w1', 'x']
    flat, out_trees = flat_function(loss, in_tree)   # flat(*leaves): loss(*args), flattened
"""

from __future__ import annotations

import re

from ..errors import DlvmError
from .pytree import PyTreeDef, leaf_paths, tree_flatten, tree_unflatten
from .tracing import param_names, type_of


def flatten_args(args: tuple, fn, who: str) -> tuple[list, PyTreeDef]:
    """(leaves, structure of the argument tuple); a DlvmError names a leaf that is not an
    array, a scalar or a spec by its path, e.g. `params['w1']`."""
    leaves, in_tree = tree_flatten(tuple(args))
    leaf_types(leaves, in_tree, fn, who)
    return leaves, in_tree


def leaf_types(leaves, in_tree: PyTreeDef, fn, who: str) -> list:
    """The IR type of each leaf (`type_of`), the bad leaf named by its path."""
    types = []
    for i, leaf in enumerate(leaves):
        try:
            types.append(type_of(leaf))
        except DlvmError:
            path = _roots_paths(fn, in_tree)[i]
            raise DlvmError(
                f"{who}: argument {path} ({type(leaf).__name__} {leaf!r:.60}) is "
                "not an array or a scalar; pytrees hold arrays in dicts, lists, "
                "tuples and namedtuples"
            ) from None
    return types


def _roots_paths(fn, in_tree: PyTreeDef) -> list[str]:
    """Each leaf's path, rooted at the Python parameter it belongs to."""
    roots = param_names(fn, len(in_tree.children))
    return [p for root, sub in zip(roots, in_tree.children) for p in leaf_paths(sub, root)]


def leaf_names(fn, in_tree: PyTreeDef) -> list[str]:
    """IR parameter names from the leaves' paths: `params['w1']` -> `params_w1`, unique."""
    names, used = [], set()
    for path in _roots_paths(fn, in_tree):
        base = re.sub(r"[^A-Za-z0-9_]+", "_", path).strip("_") or "arg"
        name, n = base, 1
        while name in used:
            name, n = f"{base}_{n}", n + 1
        used.add(name)
        names.append(name)
    return names


def flat_function(fn, in_tree: PyTreeDef):
    """(flat, out_trees): `flat(*leaves)` rebuilds the arguments, calls `fn`, and returns its
    result's leaves (one leaf alone, else a tuple); the result's structure is appended to
    `out_trees` on each call."""
    out_trees: list[PyTreeDef] = []

    def flat(*leaves):
        out_leaves, out_tree = tree_flatten(fn(*tree_unflatten(in_tree, leaves)))
        out_trees.append(out_tree)
        if out_tree.kind == "leaf":
            return out_leaves[0]
        if not out_leaves:
            raise DlvmError(
                f"{getattr(fn, '__name__', 'the function')} returned {out_tree}, "
                "which holds no array; return an array or a pytree of arrays"
            )
        return tuple(out_leaves)

    flat.__name__ = getattr(fn, "__name__", "f")
    return flat, out_trees
