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

from ..errors import DlvmError


class PyTreeDef:
    """`kind` is "leaf", "none", "tuple", "list", "dict" or "namedtuple"; `aux` holds the dict's
    sorted keys or the namedtuple's class; `children` the subtrees, in leaf order. Immutable;
    its hash and leaf count are computed once (a jit call hashes it on every dispatch)."""

    __slots__ = ("kind", "aux", "children", "num_leaves", "_hash")

    def __init__(self, kind: str, aux=None, children: tuple = ()):
        self.kind, self.aux, self.children = kind, aux, children
        self.num_leaves = 1 if kind == "leaf" else sum(c.num_leaves for c in children)
        self._hash = hash((kind, aux, children))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return self is other or (
            isinstance(other, PyTreeDef)
            and self._hash == other._hash
            and self.kind == other.kind
            and self.aux == other.aux
            and self.children == other.children
        )

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
        return (
            f"{t.aux.__name__}(" + ", ".join(f"{f}={s}" for f, s in zip(t.aux._fields, inner)) + ")"
        )
    return "(" + ", ".join(inner) + ("," if len(inner) == 1 else "") + ")"


def _sorted_keys(d: dict) -> tuple:
    try:
        return tuple(sorted(d))
    except TypeError:
        raise DlvmError(
            f"pytree: dict keys must be sortable (as JAX sorts them), got {list(d)!r:.80}"
        ) from None


def tree_flatten(tree, is_leaf=None) -> tuple[list, PyTreeDef]:
    """(leaves in order, structure); `is_leaf(x)` True stops the descent at x."""
    leaves: list = []
    return leaves, _flatten(tree, leaves, is_leaf)


def _flatten(x, leaves: list, is_leaf) -> PyTreeDef:
    # type checks in the order a jit call meets them (arguments are mostly tuples and dicts of
    # arrays): this runs on every call of a jitted function that takes a pytree
    if is_leaf is not None and is_leaf(x):
        leaves.append(x)
        return LEAF
    t = type(x)
    if t is tuple or t is list:
        return PyTreeDef(
            "tuple" if t is tuple else "list",
            None,
            tuple([_flatten(c, leaves, is_leaf) for c in x]),
        )
    if isinstance(x, dict):
        keys = _sorted_keys(x)
        return PyTreeDef("dict", keys, tuple([_flatten(x[k], leaves, is_leaf) for k in keys]))
    if x is None:
        return _NONE
    if isinstance(x, tuple) and hasattr(t, "_fields"):  # a namedtuple
        return PyTreeDef("namedtuple", t, tuple([_flatten(c, leaves, is_leaf) for c in x]))
    leaves.append(x)
    return LEAF


def tree_unflatten(treedef: PyTreeDef, leaves):
    """The tree of structure `treedef` holding `leaves` (as many as it has leaves)."""
    leaves = list(leaves)
    if len(leaves) != treedef.num_leaves:
        raise DlvmError(
            f"tree_unflatten: {treedef} has {treedef.num_leaves} leaves, got {len(leaves)}"
        )
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
            raise DlvmError(f"tree_map: tree {i} has structure {r_def}, but tree 0 has {treedef}")
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
    return tree.kind == "leaf" or (
        tree.kind == "tuple"
        and tree.children != ()
        and all(c.kind == "leaf" for c in tree.children)
    )
