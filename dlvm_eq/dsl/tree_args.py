"""Pytree arguments of a traced function: flattened to leaves (one IR parameter each), checked,
named after their paths, and rebuilt before the user's function sees them.

    args = ({"w1": w1, "b1": b1}, x)                 # loss(params, x)
    leaves, in_tree = flatten_args(args, loss, "jit")  # [b1, w1, x], types checked
    leaf_names(loss, in_tree)                        # ['params_b1', 'params_w1', 'x']
    flat, out_trees = flat_function(loss, in_tree)   # flat(*leaves): loss(*args), flattened

A call that does not fit the function's signature (too few or too many arguments), or passes
None or a dict where the function uses an array, is a DlvmError that names the signature and
the argument: `loss(w, x): argument w is None, used where an array is expected`.
"""

from __future__ import annotations

import inspect
import re

from ..errors import DlvmError
from .context import OperandError, describe
from .pytree import PyTreeDef, leaf_paths, tree_flatten, tree_unflatten
from .tracing import param_names, type_of


def flatten_args(args: tuple, fn, who: str) -> tuple[list, PyTreeDef]:
    """(leaves, structure of the argument tuple); a DlvmError names a leaf that is not an
    array, a scalar or a spec by its path, e.g. `params['w1']`."""
    check_arity(fn, len(args), who)
    leaves, in_tree = tree_flatten(tuple(args))
    leaf_types(leaves, in_tree, fn, who)
    return leaves, in_tree


def signature_text(fn) -> str:
    """`loss(w, x)`: the function's name and Python signature, for errors."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    try:
        return f"{name}{inspect.signature(fn)}"
    except (TypeError, ValueError):  # a builtin or C callable: no signature to show
        return f"{name}(...)"


def check_arity(fn, count: int, who: str) -> None:
    """`fn` takes `count` positional arguments; else a DlvmError naming its signature (Python's
    own TypeError would come from inside the trace, naming neither)."""
    bind_arguments(fn, (None,) * count, {}, who)


def bind_arguments(fn, args: tuple, kwargs: dict, who: str) -> inspect.BoundArguments | None:
    """`fn`'s signature bound to a call's arguments (None: `fn` has no signature to check)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        return sig.bind(*args, **kwargs)
    except TypeError as e:
        given = len(args) + len(kwargs)
        raise DlvmError(
            f"{who}: {signature_text(fn)} called with {given} argument{'s' * (given != 1)}: {e}"
        ) from None


def leaf_types(leaves, in_tree: PyTreeDef, fn, who: str) -> list:
    """The IR type of each leaf (`type_of`), the bad leaf named by its path."""
    types = []
    for i, leaf in enumerate(leaves):
        try:
            types.append(type_of(leaf))
        except DlvmError:
            path = _roots_paths(fn, in_tree)[i]
            raise DlvmError(
                f"{who}: {signature_text(fn)}: argument {path} ({type(leaf).__name__} "
                f"{leaf!r:.60}) is not an array or a scalar; pytrees hold arrays in dicts, "
                "lists, tuples and namedtuples"
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
    check_arity(fn, len(in_tree.children), "trace")

    def flat(*leaves):
        args = tree_unflatten(in_tree, leaves)
        try:
            result = fn(*args)
        except OperandError as e:  # an argument used as an array that is not one?
            path = _path_of(e.value, args, param_names(fn, len(args)))
            if path is None:
                raise  # made inside the function: its own location says where
            raise DlvmError(
                f"{signature_text(fn)}: argument {path} is {describe(e.value)}, used where an "
                f"array is expected\n{e}"
            ) from None
        out_leaves, out_tree = tree_flatten(result)
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


def _path_of(value, args, roots: list[str]) -> str | None:
    """Where `value` (by identity) sits in the arguments: `w`, `params['w1']`, or None."""
    stack = list(zip(args, roots))
    while stack:
        node, path = stack.pop(0)
        if node is value:
            return path
        if isinstance(node, dict):
            stack += [(v, f"{path}[{k!r}]") for k, v in node.items()]
        elif isinstance(node, (list, tuple)):
            fields = getattr(node, "_fields", None)
            steps = [f".{f}" for f in fields] if fields else [f"[{i}]" for i in range(len(node))]
            stack += [(v, path + s) for v, s in zip(node, steps)]
    return None
