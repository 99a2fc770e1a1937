"""Prints DLVM textual IR. `parse(print_module(m))` prints identically (tested).

func @f: (<2 x 3 x f32>) -> <2 x 3 x f32> {
'entry(%x: <2 x 3 x f32>):
    %0 = exp %x: <2 x 3 x f32>
    return %0: <2 x 3 x f32>
}
"""

from __future__ import annotations

import math

import numpy as np

from .control_flow import CONTROL_FLOW_OPS, format_control_flow
from .module import AdjointDecl, Const, Function, Instruction, Module
from .ops import transpose_perm
from .types import DType, TensorType
from .window_ops import WINDOW_OPS, attr_names


def format_scalar(value, dtype: DType) -> str:
    if dtype is DType.bool:
        return "true" if value else "false"
    if dtype is DType.i32:
        return str(int(value))
    v = float(value)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if dtype is DType.f32:  # the shortest text that reads back to the same float32
        return str(np.float32(v))
    return repr(v)


def format_operand(o) -> str:
    if isinstance(o, Const):
        return f"{format_scalar(o.value, o.type.dtype)}: {o.type}"
    return f"%{o.name}: {o.type}"


def format_shape(shape) -> str:
    return " x ".join(str(d) for d in shape) if shape else "scalar"


def _array_literal(a: np.ndarray, dtype: DType) -> str:
    if a.ndim == 0:
        return format_scalar(a.item(), dtype)
    return "<" + ", ".join(_array_literal(x, dtype) for x in a) + ">"


def format_instruction(inst: Instruction) -> str:
    ops = inst.operands
    a = inst.attrs
    name = inst.op
    args = ", ".join(format_operand(o) for o in ops)
    if name == "reduce":
        x = ops[0]
        init = format_scalar(a["init"], x.tensor_type.dtype)
        text = f"reduce {args} by {a['combinator']} init {init}: {x.tensor_type.dtype}"
        if a["axes"]:
            text += " along " + ", ".join(str(ax) for ax in a["axes"])
    elif name in ("shapeCast", "broadcast"):
        text = f"{name} {args} to {format_shape(a['shape'])}"
    elif name in ("padShape", "squeezeShape"):
        text = f"{name} {args} at {a['at']}"
    elif name == "dataTypeCast":
        text = f"dataTypeCast {args} to {a['dtype']}"
    elif name == "transpose":
        perm = transpose_perm(ops[0].tensor_type.rank, a)
        text = f"transpose {args}"
        if perm != tuple(reversed(range(ops[0].tensor_type.rank))):
            text += " along " + ", ".join(map(str, perm))
    elif name == "concatenate":
        text = f"concatenate {args} along {a['axis']}"
    elif name == "slice":
        text = f"slice {args} along {a['axis']} from {a['lo']} to {a['hi']}"
        if a.get("step", 1) != 1:
            text += f" by {a['step']}"
    elif name == "sliceScatter":
        text = (
            f"sliceScatter {args} along {a['axis']} from {a['lo']} by {a['step']} into {a['size']}"
        )
    elif name == "cumsum":
        text = f"cumsum {args} along {a['axis']}" + (" reverse" if a["reverse"] else "")
    elif name == "take":
        text = f"take {args} along {a['axis']}"
    elif name == "scatterAdd":
        text = f"scatterAdd {args} along {a['axis']} into {a['size']}"
    elif name == "extract":
        text = f"extract {a['index']} from {args}"
    elif name == "select":
        text = (
            f"select {format_operand(ops[0])}, {format_operand(ops[1])} by {format_operand(ops[2])}"
        )
    elif name == "literal":
        t: TensorType = a["type"]
        v = np.asarray(a["value"])
        body = _array_literal(v, t.dtype) if v.ndim else format_scalar(v.item(), t.dtype)
        text = f"literal {body}: {t}"
    elif name == "tuple":
        text = f"literal ({args}): {inst.result.type}"
    elif name == "apply":
        text = f"apply @{a['callee']}({args})"
    elif name in CONTROL_FLOW_OPS:
        text = format_control_flow(name, ops, a, format_operand)
    elif name == "attention":  # issue 33
        scale = repr(float(a["scale"]))  # float's repr reads back to the same value
        text = f"attention {args} scale {scale}" + (" causal" if a["causal"] else "")
    elif name == "attentionBackward":  # issue 33: one of the fused backward's results
        scale = repr(float(a["scale"]))
        causal = " causal" if a["causal"] else ""
        text = f"attentionBackward {args} scale {scale}{causal} wrt {a['wrt']}"
    elif name in WINDOW_OPS:
        text = f"{name} {args} {format_window_attrs(name, a)}"
    else:
        text = f"{name} {args}"
    return f"%{inst.result.name} = {text}"


def format_window_attrs(op: str, attrs: dict) -> str:
    """`stride [1, 1] padding [1, 1] dilation [1, 1] groups 1`; a padding of equal sides as [ph, pw]."""
    parts = []
    for name in attr_names(op):
        v = attrs[name]
        if name == "padding" and v[0] == v[1] and v[2] == v[3]:
            v = (v[0], v[2])
        parts.append(f"{name} {v}" if isinstance(v, int) else f"{name} [{', '.join(map(str, v))}]")
    return " ".join(parts)


def format_adjoint(d: AdjointDecl) -> str:
    text = f"[adjoint @{d.of}"
    if d.from_index is not None:
        text += f" from {d.from_index}"
    if d.wrt is not None:
        text += " wrt " + ", ".join(map(str, d.wrt))
    if d.keeping is not None:
        text += " keeping " + ", ".join(map(str, d.keeping))
    if d.seedable:
        text += " seedable"
    return text + "]"


def function_lines(fn: Function) -> list[tuple[str, object, str]]:
    """The printed lines of a function, each as (kind, IR object, text); kind is one of
    adjoint, func, entry, inst (object: the Instruction), return, end. `print_function` joins
    the texts; `comments.py` maps them back to source lines."""
    sig = f"func @{fn.name}: ({', '.join(str(t) for t in fn.param_types)}) -> {fn.result_type}"
    lines: list[tuple[str, object, str]] = []
    if fn.adjoint is not None:
        lines.append(("adjoint", fn, format_adjoint(fn.adjoint)))
    if fn.is_declaration:
        lines.append(("func", fn, sig))
        return lines
    lines.append(("func", fn, sig + " {"))
    params = ", ".join(f"%{p.name}: {p.type}" for p in fn.params)
    lines.append(("entry", fn, f"'entry({params}):"))
    for inst in fn.body:
        lines.append(("inst", inst, "    " + format_instruction(inst)))
    lines.append(("return", fn, f"    return {format_operand(fn.ret)}"))
    lines.append(("end", fn, "}"))
    return lines


def module_lines(m: Module) -> list[tuple[str, object, str]]:
    """The printed lines of a module as (kind, object, text): module, stage, blank, then each
    function's `function_lines`, a blank line between functions."""
    out: list[tuple[str, object, str]] = [
        ("module", m, f'module "{m.name}"'),
        ("stage", m, f"stage {m.stage}"),
        ("blank", None, ""),
    ]
    for i, fn in enumerate(m.functions.values()):
        if i:
            out.append(("blank", None, ""))
        out.extend(function_lines(fn))
    return out


def print_function(fn: Function) -> str:
    return "\n".join(text for _, _, text in function_lines(fn))


def print_module(m: Module) -> str:
    return "\n".join(text for _, _, text in module_lines(m)) + "\n"
