"""Pytrees as JAX has them: nested tuples, lists, dicts (keys sorted), namedtuples, with None
as an empty subtree; anything else is a leaf.

    leaves, tree = tree_flatten({"b": 1, "a": (2, None)})
    # leaves [2, 1]; tree PyTreeDef({'a': (*, None), 'b': *})
    tree_unflatten(tree, [20, 10])                          # {'a': (20, None), 'b': 10}
    tree_map(lambda p, g: p - 0.1 * g, params, grads)       # params' structure, leaf by leaf

A `PyTreeDef` is hashable and compares by structure (dict keys and namedtuple classes
included): the jit cache keys on it. The IR returns flat tuples; `jit` and `grad` flatten
arguments and results through here and rebuild them after a call.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import DlvmError


@dataclass(frozen=True)
class PyTreeDef:
    """`kind` is "leaf", "none", "tuple", "list", "dict" or "namedtuple"; `aux` holds the dict's
    sorted keys or the namedtuple's class; `children` the subtrees, in leaf order."""

    kind: str
    aux: object = None
    children: tuple = ()

    @property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(c.num_leaves for c in self.children)

    def __repr__(self) -> str:
        return f"PyTreeDef({_show(self)})"


LEAF = PyTreeDef("leaf")
_NONE = PyTreeDef("none")


def _show(t: PyTreeDef) -> str:
    if t.kind == "leaf":
        return "*"
    if t.kind == "none":
        return "None"
    inner = [_show(c) for c in t.children]
    if t.kind == "dict":
        return "{" + ", ".join(f"{k!r}: {s}" for k, s in zip(t.aux, inner)) + "}"
    if t.kind == "list":
        return "[" + ", ".join(inner) + "]"
    if t.kind == "namedtuple":
        return f"{t.aux.__name__}(" + ", ".join(
            f"{f}={s}" for f, s in zip(t.aux._fields, inner)) + ")"
    return "(" + ", ".join(inner) + ("," if len(inner) == 1 else "") + ")"


def _is_namedtuple(x) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _sorted_keys(d: dict) -> tuple:
    try:
        return tuple(sorted(d))
    except TypeError:
        raise DlvmError(f"pytree: dict keys must be sortable (as JAX sorts them), got "
                        f"{list(d)!r:.80}") from None


def _node(x):
    """(kind, aux, children) for a container, or None for a leaf."""
    if x is None:
        return "none", None, ()
    if type(x) is tuple:
        return "tuple", None, x
    if type(x) is list:
        return "list", None, x
    if isinstance(x, dict):
        keys = _sorted_keys(x)
        return "dict", keys, [x[k] for k in keys]
    if _is_namedtuple(x):
        return "namedtuple", type(x), x
    return None


def tree_flatten(tree, is_leaf=None) -> tuple[list, PyTreeDef]:
    """(leaves in order, structure); `is_leaf(x)` True stops the descent at x."""
    leaves: list = []
    return leaves, _flatten(tree, leaves, is_leaf)


def _flatten(x, leaves: list, is_leaf) -> PyTreeDef:
    node = None if is_leaf is not None and is_leaf(x) else _node(x)
    if node is None:
        leaves.append(x)
        return LEAF
    kind, aux, children = node
    if kind == "none":
        return _NONE
    return PyTreeDef(kind, aux, tuple(_flatten(c, leaves, is_leaf) for c in children))


def tree_unflatten(treedef: PyTreeDef, leaves):
    """The tree of structure `treedef` holding `leaves` (as many as it has leaves)."""
    leaves = list(leaves)
    if len(leaves) != treedef.num_leaves:
        raise DlvmError(f"tree_unflatten: {treedef} has {treedef.num_leaves} leaves, "
                        f"got {len(leaves)}")
    return _build(treedef, iter(leaves))


def _build(t: PyTreeDef, it):
    # a module-level function, not a recursive closure: a closure that refers to itself is a
    # reference cycle that keeps the leaves alive until the garbage collector runs
    if t.kind == "leaf":
        return next(it)
    if t.kind == "none":
        return None
    items = [_build(c, it) for c in t.children]
    if t.kind == "tuple":
        return tuple(items)
    if t.kind == "list":
        return items
    if t.kind == "dict":
        return dict(zip(t.aux, items))
    return t.aux(*items)


def tree_leaves(tree, is_leaf=None) -> list:
    return tree_flatten(tree, is_leaf)[0]


def tree_structure(tree, is_leaf=None) -> PyTreeDef:
    return tree_flatten(tree, is_leaf)[1]


def tree_map(f, tree, *rest, is_leaf=None):
    """`f` applied leaf by leaf: `tree_map(f, a, b)` calls `f(a_leaf, b_leaf)`; every tree in
    `rest` must have `tree`'s structure."""
    leaves, treedef = tree_flatten(tree, is_leaf)
    others = []
    for i, r in enumerate(rest, 1):
        r_leaves, r_def = tree_flatten(r, is_leaf)
        if r_def != treedef:
            raise DlvmError(f"tree_map: tree {i} has structure {r_def}, but tree 0 has "
                            f"{treedef}")
        others.append(r_leaves)
    return tree_unflatten(treedef, [f(*xs) for xs in zip(leaves, *others)])


def leaf_paths(treedef: PyTreeDef, root: str = "") -> list[str]:
    """Each leaf's path as Python would index it, after `root`: `params['w1']`, `args[0].b`."""
    paths: list[str] = []
    _paths(treedef, root, paths)
    return paths


def _paths(t: PyTreeDef, prefix: str, out: list) -> None:
    if t.kind == "leaf":
        out.append(prefix)
        return
    if t.kind == "dict":
        steps = [f"[{k!r}]" for k in t.aux]
    elif t.kind == "namedtuple":
        steps = [f".{f}" for f in t.aux._fields]
    else:
        steps = [f"[{i}]" for i in range(len(t.children))]
    for step, c in zip(steps, t.children):
        _paths(c, prefix + step, out)


def is_flat(tree: PyTreeDef) -> bool:
    """A bare leaf or a tuple of leaves: what the IR returns as it is."""
    return tree.kind == "leaf" or (tree.kind == "tuple" and tree.children != ()
                                   and all(c.kind == "leaf" for c in tree.children))
