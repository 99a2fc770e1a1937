"""The kernel plan: what a compiled function does, as plain data (built by planner.py from IR,
run by execution/executor.py). Printing a plan shows what was fused:

    >>> print(plan_function(fn))          # dlvm_eq.pipeline.plan_function
    plan @f: 2 kernels, 1 BLAS call, 0 copies; temporaries 256 KiB in 1 buffer
      %0 = blas  %x @ %w                              -> t0 <256 x 256 x f32>
      k0_add_relu   map <256 x 256>  (%0, %b[bcast]) -> out0
      ...

Storage: every array the plan touches is a *slot*. Slots are parameters, outputs (fresh for
the caller each call), temporaries (placed in one arena by liveness: two temporaries share
bytes when their lifetimes do not overlap) or constants (array literals, baked in).
A `View` reads a slot through layout ops without copying: kernels follow its element strides,
BLAS calls and copies apply its `chain` (e.g. `.T`) to the array.
"""

from __future__ import annotations

import math
from dataclasses import field

import numpy as np

from ...errors import DlvmError
from ...records import dataclass
from ..kernels.kernel_spec import KernelSpec, ReduceSpec
from ..kernels.spec import DTYPES
from .attention import AttentionStep
from .views import chain_text
from .window import WindowStep

PARAM, OUTPUT, TEMP, CONST, ALIAS = "param", "output", "temp", "const", "alias"


class PlanError(DlvmError):
    """A function the code generator cannot plan (tuple parameters, unsupported ops)."""


@dataclass(frozen=True)
class Slot:
    """A buffer of the plan: index, shape, dtype, role (parameter, output, temp, ...) and value name."""

    index: int
    shape: tuple[int, ...]
    dtype: str  # 'f32', 'f64', 'i32', 'bool'
    role: str  # PARAM, OUTPUT, TEMP, CONST, ALIAS (another slot's memory)
    name: str = ""  # IR value it holds (for printing)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype].itemsize

    def label(self) -> str:
        tag = {PARAM: "%", OUTPUT: "out", TEMP: "t", CONST: "c", ALIAS: "v"}[self.role]
        return f"%{self.name}" if self.role == PARAM else f"{tag}{self.index}"


@dataclass(frozen=True)
class View:
    """A slot seen through layout ops: `chain` for arrays, `strides` (elements) for kernels."""

    slot: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    chain: tuple = ()

    def text(self, slots) -> str:
        return slots[self.slot].label() + chain_text(self.chain)


@dataclass
class KernelStep:
    """A generated kernel: a fused map (KernelSpec, any number of outputs) or a reduction
    with its producer fused into the body (ReduceSpec). inputs[i] is what Load(i) reads."""

    spec: KernelSpec | ReduceSpec
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    values: tuple[str, ...] = ()  # IR values computed (outputs first, then fused ones)
    order: int = 0  # program position of its first IR value (scheduling)

    @property
    def name(self) -> str:
        return self.spec.name

    def text(self, slots) -> str:
        kind = (
            "map"
            if isinstance(self.spec, KernelSpec)
            else f"reduce {self.spec.op} along {list(self.spec.axes)}"
        )
        shape = " x ".join(map(str, self.spec.shape)) or "scalar"
        ins = ", ".join(
            _input_text(slots[s], inp, self.spec.shape)
            for s, inp in zip(self.inputs, self.spec.inputs)
        )
        outs = ", ".join(slots[s].label() for s in self.outputs)
        fused = " ".join("%" + v for v in self.values)
        return f"{self.name}: {kind} <{shape}> ({ins}) -> {outs}    [{fused}]"


@dataclass
class RowStep:
    """A fused reduce-then-map kernel over rows (kernels.rows.RowSpec, CPU): per row, the
    reductions in order, then the map outputs, which read the reductions' results."""

    spec: object  # kernels.rows.RowSpec
    inputs: tuple[int, ...]  # Load(i) for i < len(inputs)
    outputs: tuple[int, ...]  # map outputs (rows x cols, in the slots' own shapes)
    reductions: tuple[int, ...]  # one slot per reduction (rows,), Load(len(inputs) + k)
    values: tuple[str, ...] = ()
    order: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    def text(self, slots) -> str:
        reds = ", ".join(f"{op}" for _, op, _ in self.spec.reductions)
        ins = ", ".join(
            _input_text(slots[s], inp, None) for s, inp in zip(self.inputs, self.spec.inputs)
        )
        outs = ", ".join(slots[s].label() for s in self.outputs + self.reductions)
        fused = " ".join("%" + v for v in self.values)
        return (
            f"{self.name}: rows <{self.spec.rows} rows x {self.spec.cols}> reduce {reds} then map "
            f"({ins}) -> {outs}    [{fused}]"
        )


@dataclass
class MapReduceStep:
    """A map and reductions over the same iteration space in one pass (kernels.map_reduce.
    MapReduceSpec, CPU): the map's outputs written, the reductions (any axes, leading ones
    too) folded as the inputs are read once (planning/map_reduce.py forms it)."""

    spec: object  # kernels.map_reduce.MapReduceSpec
    inputs: tuple[int, ...]  # Load(i)
    outputs: tuple[int, ...]  # map outputs (the spec's shape, in the slots' own shapes)
    reductions: tuple[int, ...]  # one slot per reduction (the spec's out_shape)
    values: tuple[str, ...] = ()
    order: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    def text(self, slots) -> str:
        reds = ", ".join(f"{op} along {list(axes)}" for _, op, axes in self.spec.reductions)
        shape = " x ".join(map(str, self.spec.shape)) or "scalar"
        ins = ", ".join(
            _input_text(slots[s], inp, self.spec.shape)
            for s, inp in zip(self.inputs, self.spec.inputs)
        )
        outs = ", ".join(slots[s].label() for s in self.outputs + self.reductions)
        fused = " ".join("%" + v for v in self.values)
        return f"{self.name}: map + reduce {reds} <{shape}> ({ins}) -> {outs}    [{fused}]"


def _input_text(slot: Slot, inp, shape) -> str:
    if inp.strides is None:
        return slot.label()
    tag = "bcast" if 0 in inp.strides else "strided"
    return f"{slot.label()}[{tag} {inp.strides}]"


@dataclass
class BlasStep:
    """out = a @ b: on the CPU through our GEMM where the operands' layouts allow
    (gemm_runtime), else through BLAS (numpy, CuPy/cuBLAS); a transposed operand is a view (a
    layout our GEMM packs, or a flag to BLAS), not a copy."""

    a: View
    b: View
    out: int
    value: str = ""
    order: int = 0
    # the result written through strides into slot `out` in its reader's layout, or None: a
    # C-ordered result of slot `out`'s shape (planning/product_layout.py)
    out_view: View | None = None

    def out_shape(self, slots) -> tuple[int, ...]:
        """The product's result shape (its slot's, unless written through `out_view`)."""
        return self.out_view.shape if self.out_view is not None else slots[self.out].shape

    def text(self, slots) -> str:
        out = slots[self.out].label()
        if self.out_view is not None:
            out += f" as {self.out_view.shape} strides {self.out_view.strides}"
        return f"blas: {self.a.text(slots)} @ {self.b.text(slots)} -> {out}    [%{self.value}]"


@dataclass
class ConcatStep:
    """out = concatenate(parts) along `axis`."""

    parts: tuple[View, ...]
    axis: int
    out: int
    value: str = ""
    order: int = 0

    def text(self, slots) -> str:
        parts = ", ".join(p.text(slots) for p in self.parts)
        return f"concatenate({parts}, axis={self.axis}) -> {slots[self.out].label()}    [%{self.value}]"


@dataclass
class CopyStep:
    """out = src (a strided copy); for results that are parameters, constants or views."""

    src: View
    out: int
    value: str = ""
    order: int = 0

    def text(self, slots) -> str:
        return f"copy: {self.src.text(slots)} -> {slots[self.out].label()}    [%{self.value}]"


@dataclass
class AliasStep:
    """out = src's memory from element `offset` on, as a flat array (no copy): a slice read in
    place. Kernels read it with the slice's strides; numpy and CuPy through an as_strided view.
    The source stays live as long as the alias is read (schedule.arena)."""

    src: int
    out: int
    offset: int
    value: str = ""
    order: int = 0

    def text(self, slots) -> str:
        return f"alias: {slots[self.src].label()}[{self.offset}:] -> {slots[self.out].label()}    [%{self.value}]"


@dataclass
class GemmStep:
    """A matmul whose elementwise consumer runs as its epilogue (CPU): `epilogue` is applied to
    each tile of `blas.out` as soon as the tile is final, while it is still in cache
    (codegen/cpu/gemm_ir.py). `c_input` is the epilogue input that reads the matmul's result."""

    blas: BlasStep
    epilogue: KernelStep
    c_input: int

    @property
    def order(self) -> int:
        return self.blas.order

    def text(self, slots) -> str:
        outs = ", ".join(slots[o].label() for o in self.epilogue.outputs)
        return (
            f"{self.blas.text(slots)}\n      + epilogue {self.epilogue.name} -> {outs}"
            f"    [{' '.join('%' + v for v in self.epilogue.values)}]"
        )


Step = (
    KernelStep
    | RowStep
    | MapReduceStep
    | BlasStep
    | GemmStep
    | ConcatStep
    | CopyStep
    | AliasStep
    | WindowStep
)


def step_inputs(step: Step) -> tuple[int, ...]:
    if isinstance(step, (KernelStep, RowStep, MapReduceStep)):
        return step.inputs
    if isinstance(step, GemmStep):
        return (step.blas.a.slot, step.blas.b.slot) + tuple(
            s for i, s in enumerate(step.epilogue.inputs) if i != step.c_input
        )
    if isinstance(step, BlasStep):
        return (step.a.slot, step.b.slot)
    if isinstance(step, ConcatStep):
        return tuple(p.slot for p in step.parts)
    if isinstance(step, AliasStep):
        return (step.src,)
    if isinstance(step, (WindowStep, AttentionStep)):
        return tuple(v.slot for v in step.inputs)
    ids = getattr(step, "ids", None)  # gather.IndexStep reads its indices too
    return (step.src.slot,) if ids is None else (step.src.slot, ids.slot)


def step_outputs(step: Step) -> tuple[int, ...]:
    if isinstance(step, (RowStep, MapReduceStep)):
        return step.outputs + step.reductions
    if isinstance(step, GemmStep):
        return (step.blas.out,) + step.epilogue.outputs
    if isinstance(step, AttentionStep):  # a backward's three results; a forward's row lse
        return step.outputs()
    return step.outputs if isinstance(step, KernelStep) else (step.out,)


def arena_aliases(plan: Plan) -> set[int]:
    """Indexes of the AliasSteps whose source is fixed for the life of an arena (a temporary
    placed in it, a constant, or such an alias): the CPU executor makes those views once per
    arena, so they cost nothing per call. Aliases of parameters and outputs are made per call."""
    fixed = {
        s.index
        for s in plan.slots
        if s.role == CONST or (s.role == TEMP and s.index in plan.offsets)
    }
    steps = set()
    for i, step in enumerate(plan.steps):
        if isinstance(step, AliasStep) and step.src in fixed:
            fixed.add(step.out)
            steps.add(i)
    return steps


@dataclass
class Plan:
    """A function planned for execution: slots, steps in order, results, constants and arena layout."""

    name: str
    slots: list[Slot]
    params: list[int]  # slot per function parameter
    steps: list[Step]  # in execution order
    results: list[View]  # one per returned value (views of output slots)
    tuple_result: bool
    constants: dict[int, np.ndarray] = field(default_factory=dict)
    offsets: dict[int, int] = field(default_factory=dict)  # temp slot -> byte offset in the arena
    arena_bytes: int = 0
    fusion: object = None  # the fusion stage's report (egraph/fusion_decision.py)

    @property
    def kernels(self) -> list:
        """Generated kernels (KernelStep, RowStep, MapReduceStep, GEMM epilogues included), in execution order."""
        return [
            s.epilogue if isinstance(s, GemmStep) else s
            for s in self.steps
            if isinstance(s, (KernelStep, RowStep, MapReduceStep, GemmStep))
        ]

    @property
    def blas_calls(self) -> list[BlasStep]:
        """Matmuls (through BLAS or our GEMM), in execution order."""
        return [
            s.blas if isinstance(s, GemmStep) else s
            for s in self.steps
            if isinstance(s, (BlasStep, GemmStep))
        ]

    @property
    def epilogues(self) -> list[GemmStep]:
        return [s for s in self.steps if isinstance(s, GemmStep)]

    def summary(self) -> str:
        n_k, n_b = len(self.kernels), len(self.blas_calls)
        other = len(self.steps) - n_k - n_b
        temps = [s for s in self.slots if s.index in self.offsets]
        return (
            f"{n_k} kernel{'s' * (n_k != 1)}, {n_b} BLAS call{'s' * (n_b != 1)}, "
            f"{other} other step{'s' * (other != 1)}; {len(temps)} temporar{'ies' if len(temps) != 1 else 'y'}"
            f" in {_bytes_text(self.arena_bytes)} (reused by liveness)"
        )

    def __str__(self) -> str:
        lines = [f"plan @{self.name}: {self.summary()}"]
        if self.fusion is not None:
            lines.append(f"  {self.fusion}")
        params = ", ".join(
            f"%{self.slots[s].name}: {_type_text(self.slots[s])}" for s in self.params
        )
        lines.append(f"  params: {params}")
        for i, step in enumerate(self.steps):
            lines.append(f"  {i:>2}  {step.text(self.slots)}")
        res = ", ".join(r.text(self.slots) for r in self.results)
        lines.append(f"  return {'(' + res + ')' if self.tuple_result else res}")
        buffers = [s for s in self.slots if s.role in (OUTPUT, CONST) or s.index in self.offsets]
        if buffers:
            lines.append(
                "  buffers: "
                + ", ".join(
                    f"{s.label()} {_type_text(s)}"
                    + (f" @{self.offsets[s.index]}" if s.index in self.offsets else "")
                    for s in buffers
                )
            )
        return "\n".join(lines)


def _type_text(s: Slot) -> str:
    return "<" + " x ".join([*map(str, s.shape), s.dtype]) + ">" if s.shape else s.dtype


def _bytes_text(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n} B"
