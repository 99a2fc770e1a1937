"""What the compile report says about layout (issue 36): the transposes of the program as
written and as extracted, the cost model's seconds of them (as extract/target_cost.py prices
a transpose: a copy kernel where it moves the innermost axis, a view where it keeps it; one
read only by products is a BLAS flag or a strided read and costs nothing), and which layout
rules fired (rules/layout.egg and algebra.egg's `transpose` and `layout` rulesets: transposes
moved through maps and reductions, cancelled, folded into products). Where the program has
convolutions: how many stayed convolutions (im2col + GEMM in NCHW), how many pointwise ones
became batched products over the (N, C, H*W) view, how many depthwise ones shifted
multiply-adds and how many 1-D ones of width 3 channels-last products (rules/layout.egg), with
the predicted seconds of the convolutions and products (batched and plain: a 1-D convolution
becomes plain products of its shifted taps) before and after (the multiply-adds' maps are in
the plan's own prediction).

    layout_lines(before, after, saturation, "cpu")
    # ["layout: transposes 6 -> 2 (4 moved away, cancelled or folded into products),
    #   predicted copies 0.41 ms -> 0.12 ms;
    #   rules T-exp x2, transpose-transpose x2, gemm-nt x1",
    #  "layout: convolutions 6 -> 2 (2 pointwise as batched products, 2 depthwise as shifted
    #   multiply-adds), predicted convolutions and products 3.2 ms -> 2.1 ms"]
"""

from __future__ import annotations

import functools
import re

from ..extract.target_cost import TargetCost
from ..ir.module import Function
from ..ir.types import TensorType
from ..units import seconds_text
from .rulefiles import rule_file

_LAYOUT_RULE = re.compile(r':ruleset\s+(?:transpose|layout)\s+:name\s+"([^"]+)"')


@functools.cache
def layout_rule_names() -> frozenset[str]:
    """Names of the rules in the `transpose` and `layout` rulesets of the shipped files."""
    names: set[str] = set()
    for f in ("algebra.egg", "layout.egg"):
        names.update(_LAYOUT_RULE.findall(rule_file(f).read_text(encoding="utf-8")))
    return frozenset(names)


def _matmul_read_only(fn: Function) -> set[int]:
    """ids of transposes whose every reader is a `dot` or `batchMatmul` (read through flags
    or strides, never copied)."""
    readers: dict[int, set[str]] = {}
    for ins in fn.body:
        for o in ins.operands:
            readers.setdefault(id(o), set()).add(ins.op)
    return {
        id(ins.result)
        for ins in fn.body
        if ins.op == "transpose"
        and readers.get(id(ins.result))
        and readers[id(ins.result)] <= {"dot", "batchMatmul"}
    }


def transpose_copies(fn: Function, target="cpu") -> tuple[int, float]:
    """(transposes, predicted seconds of those copied) of an IR function."""
    model = TargetCost(target, {})
    free = _matmul_read_only(fn)
    n, seconds = 0, 0.0
    for ins in fn.body:
        if ins.op != "transpose":
            continue
        n += 1
        t = ins.result.type
        if id(ins.result) not in free and isinstance(t, TensorType):
            perm = ins.attrs.get("perm")  # one keeping the innermost axis is priced a view
            seconds += model.term_cost("Transpose", t, None, perm=tuple(perm) if perm else None)
    return n, seconds


CONVS = ("conv2d", "conv2dBackwardInput", "conv2dBackwardWeight")
_EGG = {"conv2d": "Conv2d", "conv2dBackwardInput": "Conv2dBackwardInput"}
_EGG.update(conv2dBackwardWeight="Conv2dBackwardWeight", batchMatmul="BatchMatmul", dot="Dot")


def _kind(ins) -> str:
    """ "pointwise" (1x1 weights, one group), "depthwise" (a group per channel), "1-D" (1x3
    weights, one group) or "other"."""
    w = (ins.result if ins.op == "conv2dBackwardWeight" else ins.operands[1]).type.shape
    groups = ins.attrs.get("groups", 1)
    if groups == 1 and tuple(w[2:]) == (1, 1):
        return "pointwise"
    if groups == 1 and tuple(w[2:]) == (1, 3):
        return "1-D"
    return "depthwise" if groups > 1 and w[1] == 1 else "other"


def conv_costs(fn: Function, target="cpu") -> tuple[dict[str, int], float]:
    """(convolutions by kind, predicted seconds of the convolutions and products) of an IR
    function. Plain products count on both sides, so that the products a convolution became
    are in the after-figure and a product the rules left alone weighs the same in both."""
    model = TargetCost(target, {})
    kinds = {"pointwise": 0, "depthwise": 0, "1-D": 0, "other": 0}
    seconds = 0.0
    for ins in fn.body:
        if ins.op not in _EGG:
            continue
        if ins.op in CONVS:
            kinds[_kind(ins)] += 1
        kids = [o.type for o in ins.operands]
        seconds += model.term_cost(_EGG[ins.op], ins.result.type, kids.__getitem__)
    return kinds, seconds


def conv_line(before: Function, after: Function, target="cpu") -> list[str]:
    """The convolutions' layout decisions: none where the program has no convolution or the
    rules replaced none."""
    k0, s0 = conv_costs(before, target)
    k1, s1 = conv_costs(after, target)
    n0, n1 = sum(k0.values()), sum(k1.values())
    if not n0 or n0 == n1:
        return []
    pw, dw = k0["pointwise"] - k1["pointwise"], k0["depthwise"] - k1["depthwise"]
    taps = k0["1-D"] - k1["1-D"]
    return [
        f"layout: convolutions {n0} -> {n1} ({pw} pointwise as batched products, {dw} depthwise "
        f"as shifted multiply-adds, {taps} 1-D as channels-last products of shifted taps), "
        f"predicted convolutions and products "
        f"{seconds_text(s0)} -> {seconds_text(s1)}"
    ]


def layout_lines(before: Function, after: Function, saturation, target="cpu") -> list[str]:
    """One line: transposes and their predicted copy time before -> after, and the layout
    rules that fired; none when the program has no transpose and no layout rule fired."""
    n0, s0 = transpose_copies(before, target)
    n1, s1 = transpose_copies(after, target)
    fired = getattr(saturation, "rule_matches", None) or {}
    names = layout_rule_names()
    hits = sorted(((r, k) for r, k in fired.items() if r in names), key=lambda rk: (-rk[1], rk[0]))
    convs = conv_line(before, after, target)
    if not (n0 or n1 or hits):
        return convs
    line = f"layout: transposes {n0} -> {n1}"
    if n1 < n0:
        line += f" ({n0 - n1} moved away, cancelled or folded into products)"
    line += f", predicted copies {seconds_text(s0)} -> {seconds_text(s1)}"
    if hits:
        line += "; rules " + ", ".join(f"{r} x{k}" for r, k in hits[:8])
        if len(hits) > 8:
            line += f" (+{len(hits) - 8} more)"
    return [line, *convs]
