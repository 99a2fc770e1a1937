"""`attention` and `attentionBackward` as plan steps (ir/attention_op.py): the fused kernels on
the CPU (runtime/attention_cpu.py, runtime/attention_backward.py); on the GPU the PTX kernels
(gpu/attention_ptx.py, gpu/attention_backward_ptx.py, launched by gpu/attention_gpu.py), or the
ops' reference semantics through CuPy where they do not apply (more than two batch dims).

The three `attentionBackward` values of one attention (dQ, dK, dV: same operands, scale and
causal mode, save that dV's reads g in o's place) are one step with three outputs: one kernel
computes them together. Where its
output o is an `attention` step's, that step also writes each score row's log-sum-exp to a
slot of its own, and the backward reads it instead of recomputing it.

    step = AttentionStep((q_view, k_view, v_view), bias, 0.125, False, out_slot)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...ir.attention_op import attention as reference_attention
from ...ir.attention_op import attention_backward as reference_backward
from ...ir.attention_op import forward_tile_blocks, tile_blocks
from ...records import dataclass
from ..kernels.kernel_spec import c_strides

if TYPE_CHECKING:
    from .values import Mat


@dataclass
class AttentionStep:
    """out = softmax(q kᵀ scale + bias) v; bias a View (operand 3) or a float (a constant).
    A backward step (grads not empty) reads q, k, v, [bias], o, g[, lse] and writes the slots
    in grads (dQ, dK, dV; -1 where not wanted); out is one of them. lse: a forward step's
    second output slot, or the backward's last input (-1: none)."""

    inputs: tuple  # plan.View of q, k, v, and of the bias when it is a tensor
    bias: float
    scale: float
    causal: bool
    out: int
    value: str = ""
    order: int = 0
    grads: tuple = ()
    lse: int = -1
    tiles: tuple = ()  # (query block, key block); () : the shipped ones (attention_op.py)

    def outputs(self) -> tuple:
        if self.grads:
            return tuple(s for s in self.grads if s >= 0)
        return (self.out,) + ((self.lse,) if self.lse >= 0 else ())

    def text(self, slots) -> str:
        n = len(self.inputs) - (1 if self.grads and self.lse >= 0 else 0)
        ins = ", ".join(v.text(slots) for v in self.inputs)
        bias = "" if n in (4, 6) else f" bias={self.bias:g}"
        causal = " causal" if self.causal else ""
        outs = ", ".join(slots[s].label() for s in self.outputs())
        name = "attentionBackward" if self.grads else "attention"
        tiles = " tiles={}x{}".format(*self.tiles) if self.tiles else ""
        return (
            f"{name}({ins}) scale={self.scale:g}{bias}{causal}{tiles} -> {outs}    [%{self.value}]"
        )


def _sibling_key(inst) -> tuple:
    """What the three attentionBackward nodes of one attention share: q, k, v, bias, g, scale
    and causal mode (dV's fused node reads g in o's place: dV does not depend on o,
    rules/attention_adjoint.egg)."""
    ops = tuple(id(o) for i, o in enumerate(inst.operands) if i != 4)
    return ops, inst.attrs["scale"], inst.attrs["causal"]


def _group(pl, inst, planned: dict) -> list:
    """inst's siblings that its step computes: dV's, and dQ's and dK's that read the o the
    step reads (theirs where it is computed already, else inst's own)."""
    key = _sibling_key(inst)
    sibs: dict = {}
    for sib in pl.flat.body:
        if sib.op != "attentionBackward" or sib.attrs["wrt"] in sibs or id(sib) in planned:
            continue
        if _sibling_key(sib) == key:
            sibs[sib.attrs["wrt"]] = sib
    o = inst.operands[4]
    for sib in sibs.values():
        if sib.attrs["wrt"] != 2 and id(sib.operands[4]) in pl.refs:
            o = sib.operands[4]
            break
    # dV reads no o (its node has g there): it joins whichever o the step reads
    return [s for s in sibs.values() if s is inst or s.attrs["wrt"] == 2 or s.operands[4] is o]


def plan_attention(pl, inst, order: int, name: str, t, temp: str) -> Mat:
    """The planner's step for an `attention` or `attentionBackward` instruction (pl: the
    Planner; temp: its temporary slot role)."""
    from .plan_queries import operand_name, view_of  # late: plan_queries imports plan, this
    from .values import Konst, Mat  # the planner's: a plan read from the cache needs neither

    a = inst.attrs
    planned = pl.__dict__.setdefault("attention_groups", {})  # id(instruction) -> its Mat
    if id(inst) in planned:  # a sibling's step computes it
        return planned[id(inst)]
    group = _group(pl, inst, planned) if inst.op == "attentionBackward" else [inst]
    lead = next((s for s in group if s.attrs.get("wrt") != 2), inst)  # its o is the step's
    refs = [pl.ref_of(o) for o in lead.operands]
    scalar = isinstance(refs[3], Konst) and not refs[3].shape
    bias = float(refs[3].value) if scalar else 0.0
    keep = [i for i in range(len(refs)) if not (i == 3 and scalar)]
    views = [view_of(pl.materialize(refs[i], operand_name(lead.operands[i]), order)) for i in keep]
    forwards = pl.__dict__.setdefault("attention_forwards", {})
    if inst.op == "attention":
        out = pl.new_slot(t.shape, str(t.dtype), temp, name)
        step = AttentionStep(tuple(views), bias, a["scale"], bool(a["causal"]), out, name, order)
        step.tiles = forward_tile_blocks()  # the profile's (pipeline/native.py), fixed at planning
        pl.steps.append(step)
        forwards[out] = step
        return Mat(out, t.shape, str(t.dtype), c_strides(t.shape))
    grads = [-1, -1, -1]
    for sib in group:  # one step for the group: one kernel computes them together
        st = sib.result.type
        slot = pl.new_slot(st.shape, str(st.dtype), temp, sib.result.name)
        grads[sib.attrs["wrt"]] = slot
        planned[id(sib)] = Mat(slot, st.shape, str(st.dtype), c_strides(st.shape))
    fwd = forwards.get(views[-2].slot)
    lse = -1
    if (
        fwd is not None
        and fwd.inputs == tuple(views[:-2])
        and (fwd.scale, fwd.causal, fwd.bias) == (a["scale"], bool(a["causal"]), bias)
    ):
        if fwd.lse < 0:  # the forward writes each row's log-sum-exp too
            shape = tuple(inst.operands[0].type.shape[:-1])
            fwd.lse = pl.new_slot(shape, str(t.dtype), temp, f"{fwd.value}_lse")
        lse = fwd.lse
        shape = pl.slots[lse].shape
        views.append(view_of(Mat(lse, shape, str(t.dtype), c_strides(shape))))
    step = AttentionStep(
        tuple(views), bias, a["scale"], bool(a["causal"]), grads[a["wrt"]], name, order
    )
    step.grads, step.lse, step.tiles = tuple(grads), lse, tile_blocks()
    pl.steps.append(step)
    return planned[id(inst)]


def attention_run(step: AttentionStep, xp, view_fns):
    """The step as a function of the plan's environment; view_fns[i] applies input i's view
    chain (None: the array as it is)."""
    fns = [f or (lambda a: a) for f in view_fns]
    slots = [v.slot for v in step.inputs]
    out, scale, causal, lse_slot = step.out, step.scale, step.causal, step.lse
    tiles = tuple(step.tiles) or (tile_blocks() if step.grads else forward_tile_blocks())
    backward = bool(step.grads)
    has_lse = backward and lse_slot >= 0

    def operands(env):
        args = [f(env[s]) for f, s in zip(fns, slots)]
        lse = args.pop() if has_lse else None
        dense = len(args) == (6 if backward else 4)  # else a scalar bias, in step.bias
        bias = args[3] if dense else step.bias
        rest = args[3 + dense :] if backward else []  # o, g
        return args[:3], bias, rest, lse

    if xp.__name__ == "numpy":
        from ..runtime.attention_backward import attention_backward
        from ..runtime.attention_cpu import attention_forward

        def run(env):
            qkv, bias, rest, lse = operands(env)
            if backward:
                grads = [env[s] if s >= 0 else None for s in step.grads]
                attention_backward(*qkv, bias, scale, causal, *rest, *grads, lse=lse, blocks=tiles)
                return
            keep = env[lse_slot] if lse_slot >= 0 else None
            attention_forward(*qkv, bias, scale, causal, env[out], blocks=tiles, lse=keep)

        return run

    def run_array(env):  # CuPy: the reference formulas on the device
        qkv, bias, rest, _ = operands(env)
        if not isinstance(bias, xp.ndarray):
            bias = xp.asarray(bias, qkv[0].dtype)
        attrs = {"scale": scale, "causal": causal}
        if backward:
            for wrt, s in enumerate(step.grads):
                if s >= 0:
                    xp.copyto(
                        env[s], reference_backward([*qkv, bias, *rest], {**attrs, "wrt": wrt})
                    )
            return
        xp.copyto(env[out], reference_attention([*qkv, bias], attrs))
        if lse_slot >= 0:
            x = xp.matmul(qkv[0], xp.swapaxes(qkv[1], -1, -2)) * scale + bias
            if causal:
                x = xp.where(xp.asarray(np.triu(np.ones(x.shape[-2:], bool), 1)), -np.inf, x)
            top = x.max(axis=-1, keepdims=True)
            xp.copyto(env[lse_slot], (top + xp.log(xp.exp(x - top).sum(-1, keepdims=True)))[..., 0])

    return run_array
