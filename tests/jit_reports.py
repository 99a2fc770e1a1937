"""What a jitted step's report says about its program, whichever e-graph optimized it: the
module's own pass where it ran, else the adjoint's e-graph (issue 32: a jitted gradient
saturates once, with its adjoint, and the traced program is planned as it is)."""

from __future__ import annotations


def planned_ops(step, name: str, *args) -> list[str]:
    """The ops of function `name` in the program the jitted `step` planned for `args`."""
    report = step.report(*args)
    module = report.optimize.module if report.optimize is not None else step.lower(*args)
    return [inst.op for inst in module[name].body]


def attention_lines(report, name: str) -> list[str]:
    """The report's attention lines (fused or plain, and why) for function `name`."""
    if report.optimize is not None:
        return report.optimize.report[name].attention
    return [line for adjoint in report.adjoints for line in adjoint.attention]


def rules_fired(report, name: str) -> dict[str, int]:
    """Rule -> matches in the e-graph that optimized function `name`."""
    if report.optimize is not None:
        return report.optimize.report[name].saturation.rule_matches
    fired: dict[str, int] = {}
    for adjoint in report.adjoints:
        for rule, n in adjoint.saturation.rule_matches.items():
            fired[rule] = fired.get(rule, 0) + n
    return fired
