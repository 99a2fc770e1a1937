"""E-graph-only constructors: the Term constructors rule files declare that are no op of the
IR, each declared once here with what the layers that meet it need (issue 31). Six roles:

- READ_AS: an op whose operands are read through views, `(Gemm a b ta tb)` (rules/algebra.egg)
  is `dot` of a and b read through `transpose` where a flag is 1 (one BLAS call with transpose
  flags). Extraction may choose it; the unloader writes the reads and the op, the type check and
  the cost model see the op of the read operands.
- IR_FORM: another spelling of an op, `(StridedSlice x axis lo hi step)` (rules/schema.egg) is
  `slice` with a step > 1.
- ADJOINT_HELPER: the adjoint rules' helpers (rules/adjoint.egg), rewritten into ops before
  extraction (ad/driver.py names any left); verify/helpers.py gives their meaning.
- FUSION: the fusion sub-language's tensors (rules/fusion.egg), priced by extract/fusion_cost.py.
- LOOP_MOTION: in a scan body, `(Once s n v)` is v computed once before the loop and
  `(StepOf s n v)` a row of it (rules/loops.egg); the unloader makes each a new parameter of
  the body (egraph/unload.py), the cost model prices v at 1/n of a step.
- CONTROL: a cond's, a switch's or a one-step scan's results in its caller's e-graph,
  `(Cond c a b)`, `(Case k i a b)`, `(ScanOf n r x)` (rules/loops.egg) over leaves that stand
  for its bodies' results; never extracted (egraph/control_regions.py reads what the rules
  proved them equal to).

    >>> g = EGRAPH_ONLY["Gemm"]
    >>> g.op, g.through, g.attrs((1, 0)), g.reads(g.attrs((1, 0)))
    ('dot', 'transpose', {'transpose': (1, 0)}, (True, False))

tests/test_registry.py checks the rule files against this table both ways (registry_check).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...records import dataclass

READ_AS, IR_FORM, ADJOINT_HELPER, FUSION = "read_as", "ir_form", "adjoint_helper", "fusion"
LOOP_MOTION = "loop_motion"
CONTROL = "control"


@dataclass(frozen=True)
class EggOnlySpec:
    """One e-graph-only constructor.

    - egg: its name; rule_file: the file that declares it; role: READ_AS, IR_FORM, ...
    - op: the IR op it stands for (READ_AS, IR_FORM); terms: its leading Term arguments, the
      op's operands.
    - attrs(prims): the e-node's attributes from its `prims` other (primitive) arguments.
    - through: READ_AS only: the IR op (with its default attributes) operands are read
      through; reads(attrs): per operand, whether it is (else it is read as is). The op itself
      takes its default attributes.
    """

    egg: str
    rule_file: str
    role: str
    op: str | None = None
    terms: int = 0
    attrs: Callable[[tuple], dict[str, Any]] | None = None
    through: str | None = None
    reads: Callable[[dict[str, Any]], tuple[bool, ...]] | None = None
    prims: int = 0


def _gemm_attrs(prims: tuple) -> dict[str, Any]:
    return {"transpose": (int(prims[0]), int(prims[1]))}


def _gemm_reads(attrs: dict[str, Any]) -> tuple[bool, ...]:
    return tuple(bool(f) for f in attrs["transpose"])


def _strided_slice_attrs(prims: tuple) -> dict[str, Any]:
    axis, lo, hi, step = (int(p) for p in prims)
    return {"axis": axis, "lo": lo, "hi": hi, **({"step": step} if step != 1 else {})}


_ADJOINT_HELPERS = ("Like", "Fill", "SumTo", "SumAxes", "TransposeBack", "PadFront", "PadBack")


def specs() -> list[EggOnlySpec]:
    return [
        EggOnlySpec(
            "Gemm", "algebra.egg", READ_AS, "dot", 2, _gemm_attrs, "transpose", _gemm_reads, 2
        ),
        EggOnlySpec(
            "StridedSlice", "schema.egg", IR_FORM, "slice", 1, _strided_slice_attrs, prims=4
        ),
        EggOnlySpec("Adjoint", "adjoint.egg", ADJOINT_HELPER),
        *(EggOnlySpec(h, "adjoint.egg", ADJOINT_HELPER) for h in _ADJOINT_HELPERS),
        EggOnlySpec("TieShare", "adjoint.egg", ADJOINT_HELPER),
        EggOnlySpec("Map", "fusion.egg", FUSION),
        EggOnlySpec("ReduceMap", "fusion.egg", FUSION),
        EggOnlySpec("Once", "loops.egg", LOOP_MOTION),
        EggOnlySpec("StepOf", "loops.egg", LOOP_MOTION),
        *(EggOnlySpec(c, "loops.egg", CONTROL) for c in ("Cond", "Case", "ScanOf")),
    ]


EGRAPH_ONLY: dict[str, EggOnlySpec] = {s.egg: s for s in specs()}
# the constructors the IR ops stand for: (egg, op) of the READ_AS and IR_FORM entries
STANDS_FOR: dict[str, str] = {
    s.egg: s.op for s in EGRAPH_ONLY.values() if s.role in (READ_AS, IR_FORM) and s.op
}
ADJOINT_HELPERS = tuple(s.egg for s in EGRAPH_ONLY.values() if s.role == ADJOINT_HELPER)

__all__ = [
    "ADJOINT_HELPER",
    "ADJOINT_HELPERS",
    "CONTROL",
    "EGRAPH_ONLY",
    "FUSION",
    "IR_FORM",
    "LOOP_MOTION",
    "READ_AS",
    "STANDS_FOR",
    "EggOnlySpec",
]
