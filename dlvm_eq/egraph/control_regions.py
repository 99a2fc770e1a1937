"""A function's conds, switches and one-step scans as terms of its one e-graph
(rules/loops.egg: Cond, Case, ScanOf), so that the rules there decide which of them run a
body in place of the op: a cond or switch whose selector the caller's e-graph proves a
constant runs its taken branch; a scan of one step runs its body once.

    regions = control_regions(plans)                 # the regions of a planned function
    session.run_text(region_facts(r, roots), ...)     # before saturation
    r.decision = decided(session, r)                  # after: a branch index, 0 (one step), None

Each result of a region is a term over leaves named after the region (`r2.b0.0`: result 0
of branch 0; `r2.once.0`: result 0 of the body run once); the selector is the caller's own
term, the root of the straight piece that computes it. A region whose result the rules prove
equal to one of those leaves is decided; egraph/optimize_loops.py then rebuilds the function
with that branch's (that body's) optimized program in place of the op.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import DlvmError
from ..ir.control_flow import COND, SCAN, SWITCH
from ..ir.module import Const
from ..ir.types import TensorType
from .lets import egg_float, egg_string, egg_vec


@dataclass
class ControlRegion:
    """A cond, switch or scan of one step of a planned function, and what the rules decided."""

    label: str  # "r2": its leaves' prefix
    piece: object  # its Piece (ir/regions.py)
    selector: object  # a Const, (unit, root index) of the piece computing it, or None
    decision: int | None = None  # the branch taken (0 for a one-step scan), None: runs as an op

    @property
    def inst(self):
        return self.piece.region.inst

    @property
    def rule(self) -> str:
        """The rule that decided it (rules/loops.egg)."""
        op = self.inst.op
        if op == SCAN:
            return "scan-one-step"
        if op == COND:
            return "cond-true" if self.decision == 0 else "cond-false"
        n = len(self.inst.attrs["branches"])
        if n == 1:
            return "switch-taken or switch-passed"
        return "switch-taken" if self.decision < n - 1 else "switch-passed"

    def report(self) -> str:
        """`%r = cond: runs branch 0 in place (cond-true, rules/loops.egg)`."""
        inst = self.inst
        what = "its body once" if inst.op == SCAN else f"branch {self.decision}"
        return (
            f"%{inst.result.name} = {inst.op}: runs {what} in place ({self.rule}, rules/loops.egg)"
        )

    def signature(self, units: list) -> tuple:
        """What the decision depends on besides the text of `units`, the straight units in
        load order (a cache key): the op, its length or branches, where the selector is."""
        a = self.inst.attrs
        sel = self.selector
        if isinstance(sel, Const):
            sel = ("const", float(sel.value))
        elif sel is not None:
            sel = ("root", [id(u) for u in units].index(id(sel[0])), sel[1])
        return (self.inst.op, a.get("length"), len(a.get("branches", ())), sel)


def control_regions(plans) -> list[ControlRegion]:
    """The conds, switches and one-step scans of planned functions (optimize_loops' plans:
    each with `pieces` and `units`, id(piece) -> Unit), in plan order."""
    out: list[ControlRegion] = []
    for p in plans:
        made = {}  # id(Value) -> (unit, index) of the straight piece computing it
        for piece in p.pieces:
            if piece.region is None:
                unit = p.units.get(id(piece))
                if unit is not None:
                    made.update((id(v), (unit, j)) for j, v in enumerate(piece.outputs))
                continue
            inst = piece.region.inst
            if inst.op == SCAN and int(inst.attrs["length"]) != 1:
                continue
            if inst.op not in (COND, SWITCH, SCAN):
                continue
            sel = None
            if inst.op != SCAN:
                o = inst.operands[0]
                sel = o if isinstance(o, Const) else made.get(id(o))
                if sel is None:  # a parameter's or another region's: not known here
                    continue
            out.append(ControlRegion(f"r{len(out)}", piece, sel))
    return out


def _leaf(name: str, t: TensorType) -> tuple[str, list[str]]:
    leaf = f"(Var {egg_string(name)})"
    return leaf, [
        f"(set (shape {leaf}) {egg_vec(t.shape)})",
        f"(set (dtype {leaf}) {egg_string(str(t.dtype))})",
    ]


def _selector_term(r: ControlRegion, roots) -> str:
    sel = r.selector
    if isinstance(sel, Const):
        return f"(Const {egg_float(float(sel.value))} {egg_string(str(sel.type.dtype))})"
    unit, j = sel
    return roots(unit)[j]


def region_terms(r: ControlRegion, roots) -> tuple[list[str], list[str], list[str]]:
    """(the region's result terms, the leaves each may equal, facts), result 0's only: the
    results of one region share their selector. `roots(unit)`: its program's root names."""
    inst = r.inst
    t = r.piece.outputs[0].type
    facts: list[str] = []
    if inst.op == SCAN:
        leaf, fs = _leaf(f"{r.label}.once.0", t)
        facts += fs
        rev = 1 if inst.attrs["reverse"] else 0
        return [f"(ScanOf {int(inst.attrs['length'])} {rev} {leaf})"], [leaf], facts
    n = len(inst.attrs["branches"])
    leaves = []
    for k in range(n):
        leaf, fs = _leaf(f"{r.label}.b{k}.0", t)
        leaves.append(leaf)
        facts += fs
    sel = _selector_term(r, roots)
    if inst.op == COND:
        term = f"(Cond {sel} {leaves[0]} {leaves[1]})"
    else:  # (one branch: (Case k 0 b0 b0), decided once k is known, as any switch)
        term = leaves[-1] if n > 1 else f"(Case {sel} 0 {leaves[0]} {leaves[0]})"
        for k in range(n - 2, -1, -1):
            term = f"(Case {sel} {k} {leaves[k]} {term})"
    return [term], leaves, facts


def region_facts(regions: list[ControlRegion], roots) -> str:
    """The regions' terms and their leaves' types, as egglog commands (before saturation)."""
    out = []
    for r in regions:
        terms, _, facts = region_terms(r, roots)
        out += facts
        out += terms
    return "\n".join(out) + "\n"


def decided(session, r: ControlRegion, roots) -> int | None:
    """The leaf the rules proved region r's result equal to (after saturation), or None."""
    (term,), leaves, _ = region_terms(r, roots)
    for k, leaf in enumerate(leaves):
        try:
            session.run_text(f"(check (= {term} {leaf}))\n", "<control regions>")
        except DlvmError:
            continue
        return k
    return None


__all__ = ["ControlRegion", "control_regions", "decided", "region_facts", "region_terms"]
