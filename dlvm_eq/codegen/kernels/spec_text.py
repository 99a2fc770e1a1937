"""`spec_text`: a kernel spec (KernelSpec, ReduceSpec, RowSpec) as one complete line of text, the
part of a kernel's cache key that says what the kernel computes.

    >>> spec_text(KernelSpec("axpb", (4,), [KernelInput("f32")], [Load(0) * 2.0]))[:10]
    "KernelSpec"
"""

from __future__ import annotations

import dataclasses

from .spec import Expr, walk

_FIELDS: dict[type, tuple[str, ...] | None] = {}  # class -> its dataclass fields (None: not one)


def _fields_of(cls: type) -> tuple[str, ...] | None:
    # dataclasses.fields() and is_dataclass() per value were most of a warm call's key cost;
    # a race stores the same tuple twice
    names = _FIELDS.get(cls, ())
    if names == ():
        names = (
            tuple(f.name for f in dataclasses.fields(cls))
            if dataclasses.is_dataclass(cls)
            else None
        )
        _FIELDS[cls] = names
    return names


def spec_text(spec) -> str:
    """A complete linear description of a kernel spec (KernelSpec, ReduceSpec, RowSpec): every
    field, Expr DAG nodes numbered once (a shared subexpression is written once, so the text
    grows with the DAG, not with its tree). Two specs with equal texts are equal."""
    nodes: list[str] = []
    ids: dict[int, int] = {}
    walked: set = set()  # nodes numbered: a kernel's outputs share their DAG, walked once

    def number(root: Expr) -> int:
        # iterative (walk: operands before users), so deep expressions need no recursion
        for e in walk([root], walked):
            if id(e) not in ids:
                body = ",".join(enc(getattr(e, n)) for n in _fields_of(type(e)) or ())
                ids[id(e)] = len(nodes)
                nodes.append(f"{type(e).__name__}({body})")
        return ids[id(root)]

    def enc(v) -> str:
        if isinstance(v, Expr):
            i = ids.get(id(v))
            return f"#{number(v) if i is None else i}"
        if v is None or isinstance(v, (bool, int, float, str)):
            return repr(v)  # 1, 1.0 and True stay distinct; floats round-trip exactly
        if isinstance(v, (tuple, list)):
            return "(" + ",".join(enc(x) for x in v) + ",)"
        names = _fields_of(type(v))
        if names is not None:
            return (
                f"{type(v).__name__}(" + ",".join(f"{n}={enc(getattr(v, n))}" for n in names) + ")"
            )
        raise TypeError(f"spec_text: unexpected {type(v).__name__} in a kernel spec")

    top = enc(spec)
    return top + "\n" + "\n".join(nodes)
