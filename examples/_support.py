"""What the example scripts share: compile a training step, and say what the optimizer changed.

    step, target = jit_value_and_grad(loss, (0, 1), args)     # dq.jit(dq.value_and_grad(...))
    show_optimization("forward", dq.make_ir(loss)(*args))    # ops and estimated cost, before/after

Not part of the package: the examples import it from their own folder.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

import dlvm_eq as dq


def jit_value_and_grad(loss, argnums, args, target: str = "cpu"):
    """`dq.jit(dq.value_and_grad(loss, argnums), target=target)`, compiled on `args`.

    Returns (step, the target that ran). Falls back to the reference interpreter ("interp")
    only where `target` raises, and says so."""
    try:
        step = _compiled(loss, argnums, args, target)
    except dq.DlvmError as e:
        if target == "interp":
            raise
        print(
            f"note: dq.jit(..., target={target!r}) failed ({first_line(e)}); "
            "running on target 'interp' instead"
        )
        return _compiled(loss, argnums, args, "interp"), "interp"
    report = step.report(*args) if hasattr(step, "report") else None
    if report is not None:  # the code generator's account: kernels, BLAS calls, times
        print("\n" + str(report))
    return step, target


def _compiled(loss, argnums, args, target):
    step = dq.jit(dq.value_and_grad(loss, argnums=argnums), target=target)
    step(*args)  # trace, differentiate, optimize, compile: errors show here
    return step


def first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def op_counts(module: dq.Module) -> Counter:
    return Counter(i.op for fn in module.functions.values() for i in fn.body)


def show_optimization(title: str, module: dq.Module, show_ir: bool = False, rules: int = 6):
    """Run `dq.optimize(module)` and print what changed: instruction counts by op, the cost
    model's estimate before and after, the rules that fired most. Returns the result."""
    result = dq.optimize(module)
    before, after = op_counts(module), op_counts(result.module)
    print(f"== {title} ==")
    print(f"  instructions: {sum(before.values())} -> {sum(after.values())}")
    print(
        f"  estimated cost (cpu model): {seconds(result.cost_before)} -> "
        f"{seconds(result.cost_after)} (x{result.cost_before / result.cost_after:.2f})"
    )
    changed = [
        f"{op} {before[op]} -> {after[op]}"
        for op in sorted(before | after)
        if before[op] != after[op]
    ]
    print("  ops changed: " + (", ".join(changed) if changed else "none"))
    for fr in result.report:
        if fr.kept_original:
            print(f"  kept the original: {fr.note}")
        if fr.saturation is not None and fr.saturation.rule_matches:
            top = ", ".join(f"{r} x{n}" for r, n in fr.saturation.top_rules(rules))
            print(f"  rules fired most: {top}")
    if show_ir:
        print("  optimized IR:")
        print("\n".join("    " + line for line in str(result.module).splitlines()))
    return result


def seconds(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.3f} ms"


def raw_gradient(loss, argnums, args) -> dq.Module:
    """The value-and-gradient program as the adjoint rules alone write it (no algebra rules):
    what `dq.optimize` starts from when it optimizes a gradient."""
    from dlvm_eq.ad import adjoint_function

    forward = dq.trace(loss, list(args))
    fn = adjoint_function(
        None, forward, wrt=tuple(argnums), keeping=(0,), tuple_result=True, optimize=False
    )
    module = dq.Module(fn.name)
    module.add(fn)
    return module


def sequence_task(rng, batch: int, features: int, steps: int):
    """(xs, y): `steps` random input batches and the target to learn, the mean of feature 0
    over time (the recurrent examples' task)."""
    xs = [(0.4 * rng.standard_normal((batch, features))).astype(np.float32) for _ in range(steps)]
    return xs, np.sum([x[:, :1] for x in xs], axis=0) / steps


def central_difference(f, args, i, direction, eps=1e-3):
    """d/dt f(args[i] + t*direction) at 0, in float64."""
    args64 = [np.asarray(a, np.float64) for a in args]
    plus, minus = list(args64), list(args64)
    plus[i] = args64[i] + eps * direction
    minus[i] = args64[i] - eps * direction
    return (f(*plus) - f(*minus)) / (2 * eps)


def check_gradients(names, grads, numpy_loss, args, rng) -> None:
    """Each compiled gradient's directional derivative against central differences of the
    numpy loss in float64 (asserts agreement within 1e-3)."""
    print("\ngradient check (directional derivative, central differences in float64):")
    for i, (name, g) in enumerate(zip(names, grads)):
        direction = rng.standard_normal(g.shape)
        expected = central_difference(numpy_loss, args, i, direction)
        got = float(np.sum(g * direction))
        print(f"  d loss / d {name:2s}: compiled {got:+.6f}  finite differences {expected:+.6f}")
        assert abs(got - expected) <= 1e-3 * max(1.0, abs(expected)), name


def train(step, params, data, train_steps: int, lr: float, target: str) -> None:
    """Plain SGD on `params` (updated in place) with the compiled value-and-grad `step`."""
    print(f"training {train_steps} SGD steps on target {target!r}")
    for i in range(train_steps):
        value, grads = step(*params, *data)
        for p, g in zip(params, grads):
            p -= lr * g
        if i % 10 == 0 or i == train_steps - 1:
            print(f"  step {i:3d}  loss {float(value):.5f}")
