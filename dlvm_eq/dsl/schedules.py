"""Learning-rate schedules as optax names them: functions of the update count (0 for the first
update) written with DSL ops, so they run eagerly on numpy counts and trace inside a jitted
step on the optimizer state's i32 count. Pass one as an optimizer's `lr`:

    lr = dq.optim.warmup_cosine_decay_schedule(0.0, 1e-3, warmup_steps=100, decay_steps=1000)
    opt = dq.optim.adamw(lr, weight_decay=1e-4)
"""

from __future__ import annotations

import math

from ..ir.types import F32
from . import ops
from .context import argument_error


def _steps(count):
    return ops.astype(count, F32)


def constant_schedule(value):
    """value at every count."""
    return lambda count: ops.add(ops.multiply(_steps(count), 0.0), value)


def linear_schedule(init_value, end_value, transition_steps, transition_begin=0):
    """init_value until transition_begin, then linearly to end_value over transition_steps."""
    if transition_steps <= 0:
        return constant_schedule(init_value)

    def schedule(count):
        t = ops.minimum(
            ops.maximum(ops.subtract(_steps(count), transition_begin), 0), transition_steps
        )
        frac = ops.divide(t, float(transition_steps))
        return ops.add(init_value, ops.multiply(end_value - init_value, frac))

    return schedule


def cosine_decay_schedule(init_value, decay_steps, alpha=0.0, exponent=1.0):
    """init_value * ((1 - alpha) * c**exponent + alpha), c = (1 + cos(pi min(t, T) / T)) / 2."""
    if decay_steps <= 0:
        raise argument_error(
            f"cosine_decay_schedule: decay_steps must be positive, not {decay_steps}"
        )

    def schedule(count):
        t = ops.minimum(_steps(count), float(decay_steps))
        c = ops.multiply(0.5, ops.add(1.0, ops.cos(ops.multiply(math.pi / decay_steps, t))))
        if exponent != 1.0:
            c = ops.power(c, float(exponent))
        return ops.multiply(init_value, ops.add(ops.multiply(1.0 - alpha, c), alpha))

    return schedule


def warmup_cosine_decay_schedule(
    init_value, peak_value, warmup_steps, decay_steps, end_value=0.0, exponent=1.0
):
    """Linear from init_value to peak_value over warmup_steps, then a cosine decay to end_value
    reached at decay_steps (counted from 0, warmup included), as optax's."""
    warmup = linear_schedule(init_value, peak_value, warmup_steps)
    alpha = end_value / peak_value if peak_value else 0.0
    decay = cosine_decay_schedule(peak_value, max(decay_steps - warmup_steps, 1), alpha, exponent)

    def schedule(count):
        after = decay(ops.maximum(ops.subtract(_steps(count), warmup_steps), 0))
        return ops.where(ops.less(_steps(count), warmup_steps), warmup(count), after)

    return schedule


def exponential_decay(
    init_value, transition_steps, decay_rate, transition_begin=0, staircase=False, end_value=None
):
    """init_value until transition_begin, then init_value * decay_rate ** (t / transition_steps)
    with t counted from transition_begin (floored with staircase), bounded by end_value where
    given: optax's arguments, in optax's order."""

    def schedule(count):
        t = ops.maximum(ops.subtract(_steps(count), float(transition_begin)), 0.0)
        p = ops.divide(t, float(transition_steps))
        if staircase:
            p = ops.floor(p)
        value = ops.multiply(init_value, ops.power(float(decay_rate), p))
        if end_value is not None:
            bound = ops.maximum if decay_rate < 1 else ops.minimum
            value = bound(value, end_value)
        return value

    return schedule
