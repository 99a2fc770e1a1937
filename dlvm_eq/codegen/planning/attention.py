"""`attention` as a plan step (ir/attention_op.py): the fused kernel on the CPU
(runtime/attention_cpu.py); on the GPU the op's reference semantics through CuPy (no fused
kernel there yet: it writes the scores).

    step = AttentionStep((q_view, k_view, v_view), bias, 0.125, False, out_slot)
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir.attention_op import attention as reference_attention


@dataclass
class AttentionStep:
    """out = softmax(q kᵀ scale + bias) v; bias a View (operand 3) or a float (a constant)."""

    inputs: tuple  # plan.View of q, k, v, and of the bias when it is a tensor
    bias: float
    scale: float
    causal: bool
    out: int
    value: str = ""
    order: int = 0

    def text(self, slots) -> str:
        ins = ", ".join(v.text(slots) for v in self.inputs)
        bias = "" if len(self.inputs) > 3 else f" bias={self.bias:g}"
        causal = " causal" if self.causal else ""
        return (
            f"attention({ins}) scale={self.scale:g}{bias}{causal} -> "
            f"{slots[self.out].label()}    [%{self.value}]"
        )


def attention_run(step: AttentionStep, xp, view_fns):
    """The step as a function of the plan's environment; view_fns[i] applies input i's view
    chain (None: the array as it is)."""
    fns = [f or (lambda a: a) for f in view_fns]
    slots = [v.slot for v in step.inputs]
    out, scale, causal = step.out, step.scale, step.causal

    if xp.__name__ == "numpy":
        from ..runtime.attention_cpu import attention_forward

        def run(env):
            args = [f(env[s]) for f, s in zip(fns, slots)]
            bias = args[3] if len(args) > 3 else step.bias
            attention_forward(*args[:3], bias, scale, causal, env[out])

        return run

    def run_array(env):  # CuPy: the reference formula on the device
        args = [f(env[s]) for f, s in zip(fns, slots)]
        bias = args[3] if len(args) > 3 else xp.asarray(step.bias, args[0].dtype)
        xp.copyto(
            env[out], reference_attention([*args[:3], bias], {"scale": scale, "causal": causal})
        )

    return run_array
