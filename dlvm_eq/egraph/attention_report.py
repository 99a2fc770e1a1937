"""What the compile report says about attention (issue 33): where rules/attention.egg put a
fused `Attention` e-node beside the plain softmax(q kᵀ s) v, which of the two extraction chose
and the predicted cost of each (the cost model's seconds of the sub-program that computes the
attention's value, each e-class once).

    attention_lines(extraction, cost)   # ["attention %c12: fused chosen, predicted 1.2 ms; plain 3.4 ms"]
"""

from __future__ import annotations

import math

from ..units import seconds_text


def _sub_cost(g, cost, choice: dict, root_node: str) -> float:
    """DAG cost of the sub-program from root_node: chosen e-nodes below it (the cheapest e-node
    by itself where the extraction did not reach a class), each class once."""
    total, seen, stack = 0.0, set(), [root_node]
    while stack:
        nid = stack.pop()
        cls = g.raw_nodes[nid]["eclass"]
        if cls in seen:
            continue
        seen.add(cls)
        total += cost.node_cost(g, nid)
        for kid in g.raw_nodes[nid]["children"]:
            kc = g.raw_nodes[kid]["eclass"]
            if kc in seen:
                continue
            pick = choice.get(kc)
            if pick is None:
                members = [n for n, d in g.raw_nodes.items() if d["eclass"] == kc]
                pick = min(members, key=lambda n: cost.node_cost(g, n))
            stack.append(pick)
    return total


def attention_lines(extraction, cost) -> list[str]:
    g = extraction.graph
    if g is None:
        return []
    choice = extraction.choice
    by_class: dict[str, list[str]] = {}
    for nid, node in g.raw_nodes.items():
        if node["eclass"] in choice:
            by_class.setdefault(node["eclass"], []).append(nid)
    lines = []
    for cls, members in by_class.items():
        if any(g.raw_nodes[n]["op"] == "AttentionBackward" for n in members):
            lines.append(_backward_line(g, cost, choice, cls, members))
            continue
        fused_nodes = [n for n in members if g.raw_nodes[n]["op"] == "Attention"]
        if not fused_nodes:
            continue
        chosen = g.raw_nodes[choice[cls]]["op"] == "Attention"
        # the cheapest fused form (with a causal mask: its causal mode and its bias form)
        best = min(fused_nodes, key=lambda n: _sub_cost(g, cost, choice, n))
        fused = _sub_cost(g, cost, choice, choice[cls] if chosen else best)
        causal = g.raw_nodes[g.raw_nodes[choice[cls] if chosen else best]["children"][5]]["op"]
        plain_nodes = [n for n in members if g.raw_nodes[n]["op"] != "Attention"]
        plain = min((_sub_cost(g, cost, choice, n) for n in plain_nodes), default=float("inf"))
        if plain == math.inf:  # fused before differentiation: the naive formula priced apart
            plain = _priced_apart(g, cost, best, backward=False)
        lines.append(
            f"attention e-class {cls}: {'fused' if chosen else 'plain'} chosen; predicted fused "
            f"kernel{' (causal mode)' if causal == '1' else ''} {seconds_text(fused)}, "
            f"plain program {_plain_text(plain, apart=not plain_nodes)}"
        )
    return sorted(lines)


def _plain_text(seconds: float, apart: bool = False) -> str:
    if seconds == float("inf"):
        return "none in the e-graph"
    return seconds_text(seconds) + (" (priced apart)" if apart else "")


def _priced_apart(g, cost, node: str, backward: bool, fused: bool = False) -> float:
    """The cost model's seconds of the naive formula for a fused node that has no plain
    e-node beside it (attention_forward.py fused it before differentiation; no plain adjoint
    rule covers rank 4 or causal): the forward's program, or for a backward the program of
    the forward and dQ, dK, dV together (the plain backward reads the forward's
    probabilities: it is the alternative to both fused kernels, not to the backward's alone).
    Built by attention_plain.py, priced as written; fused: the same program of the fused ops."""
    from ..ir.types import TensorType
    from .attention_plain import priced_as_written

    kids = g.raw_nodes[node]["children"]
    types = [cost.types.get(g.raw_nodes[k]["eclass"]) for k in kids[:4]]
    if any(not isinstance(t, TensorType) for t in types):
        return math.inf
    scale_node, causal_node = (kids[6], kids[7]) if backward else (kids[4], kids[5])
    try:
        attrs = {
            "scale": float(g.raw_nodes[scale_node]["op"]),
            "causal": int(float(g.raw_nodes[causal_node]["op"])),
        }
    except ValueError:
        return math.inf
    try:
        return priced_as_written(types, attrs, fused, backward, cost.machine)
    except Exception:  # a type the naive formula does not cover: no price to show
        return math.inf


def _backward_line(g, cost, choice, cls, members) -> str:
    """One of dQ, dK, dV: the fused backward's share (a third of its kernel) against the plain
    adjoint's sub-program."""
    fused_nodes = [n for n in members if g.raw_nodes[n]["op"] == "AttentionBackward"]
    chosen = g.raw_nodes[choice[cls]]["op"] == "AttentionBackward"
    best = choice[cls] if chosen else min(fused_nodes, key=lambda n: _sub_cost(g, cost, choice, n))
    kids = g.raw_nodes[best]["children"]
    wrt = "QKV"[int(g.raw_nodes[kids[8]]["op"])]
    # the fused node's own price: its operands (the forward) are the plain side's too
    fused = cost.node_cost(g, best)
    plain_nodes = [n for n in members if g.raw_nodes[n]["op"] != "AttentionBackward"]
    plain = min((_sub_cost(g, cost, choice, n) for n in plain_nodes), default=float("inf"))
    if plain < math.inf:
        return (
            f"attention backward d{wrt} e-class {cls}: {'fused' if chosen else 'plain'} backward "
            f"chosen; predicted fused kernel (a third of dQ, dK, dV) {seconds_text(fused)}, "
            f"plain program {_plain_text(plain)}"
        )
    plain = _priced_apart(g, cost, best, backward=True)
    both = _priced_apart(g, cost, best, backward=True, fused=True)
    return (
        f"attention backward d{wrt} e-class {cls}: {'fused' if chosen else 'plain'} backward "
        f"chosen; predicted fused kernel (dQ, dK, dV together) {seconds_text(3 * fused)}; "
        f"forward and backward: fused {_plain_text(both)}, plain program "
        f"{_plain_text(plain, apart=True)}"
    )
