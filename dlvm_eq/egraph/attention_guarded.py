"""rules/attention.egg in an adjoint's e-graph, behind the never-slower guard (issue 32: a
jitted gradient of attention saturates once, with its adjoint, and skips the module's pass).

The attention ruleset's forms (the fused op, the FlashAttention-2 row term rowsum(dO * O) for
rowsum(dP * P)) are priced by extraction without the fusion that planning does: in the joint
e-graph of the transformer step, the flash row term planned 28 kernels instead of 26 (a
permuting copy of O and one more pass), which the module's own pass used to refuse through
the guard. So here the program is extracted as the rest of the schedule leaves it (A), the
attention rules then run on the same e-graph, and where they changed the program (B), the
guard compares the two planned programs as the module's pass did, and keeps A unless B is
predicted faster by more than the cost model's error. Where extraction's own model predicts B
no faster than that error (`guard.error`), neither is planned and A is kept: on every attention
gradient measured (seq 16 to 256, rank 3 and 4, the transformer step) the flash row term was
0.03-1.4% cheaper to extraction and 0.85-1.00x after fusion (planned), never faster.

    res, note = optimize_attention_guarded(session, grad, schedule, guard, module,
                                           budget=budget, target="cpu", deadline=deadline)
"""

from __future__ import annotations

import dataclasses

from ..ir.module import Function
from ..ir.printer import print_function
from .ruleset_schedule import Schedule

ATTENTION = "attention"  # the ruleset of rules/attention.egg


def has_batched_products(fn: Function) -> bool:
    """Whether fn holds a product of two rank >= 3 operands (q kᵀ, P v) or a fused attention:
    where the attention rules can act. Elsewhere they are not run (no e-graph work)."""
    for inst in fn.body:
        if inst.op in ("attention", "attentionBackward"):
            return True
        if inst.op in ("batchMatmul", "dot") and len(inst.operands) == 2:
            if min(o.type.rank for o in inst.operands) >= 3:
                return True
    return False


def _merged(first, second):
    """One SaturationReport for two saturations of the same e-graph, one after the other."""
    if first is None or second is None:
        return second or first
    matches = dict(first.rule_matches)
    for rule, n in second.rule_matches.items():
        matches[rule] = matches.get(rule, 0) + n
    seconds = dict(first.ruleset_seconds)
    for name, s in second.ruleset_seconds.items():
        seconds[name] = seconds.get(name, 0.0) + s
    return dataclasses.replace(
        second,
        iterations=first.iterations + second.iterations,
        nodes_before=first.nodes_before,
        seconds=first.seconds + second.seconds,
        rule_matches=matches,
        ruleset_seconds=seconds,
    )


def optimize_attention_guarded(
    session, grad, schedule: Schedule, guard, module, *, budget, target, deadline
):
    """(optimize_session's result for the program `grad` (a LoadedProgram) in `session`, a
    note for the report or ""): `schedule` saturated first, then the attention ruleset alone
    (its forms need nothing more: the same program as after the whole schedule again, on
    every program above), whose form is kept only where `guard(old, new, module, stable)`
    keeps the optimized one."""
    from .optimize import ShortOfTime, optimize_session

    first = optimize_session(
        session, [grad], schedule=schedule, budget=budget, target=target, deadline=deadline
    )
    then = Schedule((ATTENTION,), schedule.step)
    try:
        second = optimize_session(
            session, [grad], schedule=then, budget=budget, target=target, deadline=deadline
        )
    except ShortOfTime:  # no time left for the attention forms: the program without them
        return first, "attention rules: no time left to extract their forms"
    both = {  # the report's seconds: both saturations and extractions
        "saturation": _merged(first.saturation, second.saturation),
        "seconds": {k: v + second.seconds.get(k, 0.0) for k, v in first.seconds.items()},
    }
    old, new = first.functions[0], second.functions[0]
    if print_function(old) == print_function(new):
        return dataclasses.replace(second, **both), ""
    gain = first.extraction.dag_cost / max(second.extraction.dag_cost, 1e-30)
    error = getattr(guard, "error", 0.0)
    if gain <= 1.0 + error:  # not worth planning both: extraction's own gain is within error
        note = (
            f"attention rules' form not taken: extraction predicts {gain:.4f}x, within the "
            f"cost model's error ({error:.1%}); the guard was not asked"
        )
        return dataclasses.replace(first, **both), note
    choice = guard(old, new, module, ())
    kept = second if choice.kept == "optimized" else first
    return dataclasses.replace(kept, **both), f"attention rules' form: {choice}"
