"""Reading the attributes of conv2d and pooling ops from the parse tree, with located errors.

    %y = conv2d %x: <1 x 1 x 5 x 5 x f32>, %w: <2 x 1 x 3 x 3 x f32> stride [1, 1] padding [1, 1] dilation [1, 1] groups 1

Every attribute of the op is written once, in any order; `padding` takes [ph, pw] (both sides
alike) or [top, bottom, left, right]; the others take exactly their number of ints.
"""

from __future__ import annotations

from .window_ops import ATTR_LAYOUT


def read_window_attrs(src, op: str, name_tok, attr_trees, read_int) -> dict:
    """The attrs dict of `op` from its `list_attr`/`int_attr` trees; errors point at the token."""
    layout = dict(ATTR_LAYOUT[op])
    attrs: dict = {}
    for tree in attr_trees:
        key, *values = tree.children
        name = str(key)
        if name not in layout:
            raise src.at(key, f"{op} has no attribute '{name}'; it takes " + ", ".join(layout))
        if name in attrs:
            raise src.at(key, f"attribute '{name}' of {op} is written twice")
        ints = tuple(read_int(src, v, f"a {name} value") for v in values)
        want = layout[name]
        if want == 1:
            if tree.data != "int_attr":
                raise src.at(key, f"{name} of {op} is one integer, like `{name} 1`")
            attrs[name] = ints[0]
            continue
        if tree.data != "list_attr":
            raise src.at(key, f"{name} of {op} is a list of {want} integers, like `{name} [1, 1]`")
        if name == "padding" and len(ints) == 2:
            ints = (ints[0], ints[0], ints[1], ints[1])
        if len(ints) != want:
            counts = (
                "2 (each side alike) or 4 (top, bottom, left, right)"
                if name == "padding"
                else str(want)
            )
            raise src.at(key, f"{name} of {op} takes {counts} integers, got {len(ints)}")
        attrs[name] = ints
    missing = [n for n in layout if n not in attrs]
    if missing:
        raise src.at(
            name_tok, f"{op} needs its attribute{'s' * (len(missing) != 1)} " + ", ".join(missing)
        )
    return attrs
