"""Least squares written as sum((X - U Vᵀ)²): the sum-product rules of rules/algebra.egg let the
optimizer compute it without materializing the m×n matrix U Vᵀ:

    sum((X - U Vᵀ)²) = sum(X²) - 2 sum((Xᵀ U) * V) + sum((UᵀU) * (VᵀV))

The expansion is only applied in float64: it subtracts large sums, and in float32 it loses every
digit when U Vᵀ fits X closely (the rule is guarded on the dtype; this script shows both).

    python examples/least_squares.py
"""

import numpy as np
from _support import show_optimization

import dlvm_eq as dq

M, N, K = 1000, 800, 8


def loss(X, U, V):
    return dq.sum(dq.square(X - U @ V.T))


def matmul_results(module: dq.Module) -> list[tuple[int, ...]]:
    return [
        i.result.type.shape for fn in module.functions.values() for i in fn.body if i.op == "dot"
    ]


def main():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((M, N))
    U = rng.standard_normal((M, K))
    V = rng.standard_normal((N, K))

    module = dq.make_ir(loss)(X, U, V)
    print(module)
    result = show_optimization(
        f"dq.optimize: X {M}x{N}, U {M}x{K}, V {N}x{K}", module, show_ir=True
    )
    print(
        f"cost before: {result.cost_before * 1e6:.1f} us, cost after: "
        f"{result.cost_after * 1e6:.1f} us (cost model, cpu target)"
    )

    before, after = matmul_results(module), matmul_results(result.module)
    fmt = lambda shapes: ", ".join("x".join(map(str, s)) for s in shapes)
    print(f"matmul results before: {fmt(before)}")
    print(f"matmul results after:  {fmt(after)}")
    materialized = (M, N) in after
    print(f"U Vᵀ ({M}x{N}) materialized after optimization: {'yes' if materialized else 'no'}")

    # The expansion subtracts large sums: compare both forms where U Vᵀ fits X closely.
    print("\nvalues (reference interpreter, float64) against numpy:")
    for label, target in (
        ("random X", X),
        ("X = U Vᵀ + 0.001 noise", U @ V.T + 1e-3 * rng.standard_normal((M, N))),
    ):
        exact = float(np.sum((target - U @ V.T) ** 2))
        as_written = float(dq.interpret(module, "loss", target, U, V))
        optimized = float(dq.interpret(result.module, "loss", target, U, V))
        error = abs(optimized - exact) / exact
        print(
            f"  {label:24s} numpy {exact:.6g}  as written {as_written:.6g}  "
            f"optimized {optimized:.6g} (relative error {error:.1e})"
        )

    f32 = dq.optimize(dq.make_ir(loss)(*(a.astype(np.float32) for a in (X, U, V)))).module
    kept = (M, N) in matmul_results(f32)
    print(
        f"\nfloat32: the expansion is not applied (it would cancel); U Vᵀ materialized: "
        f"{'yes' if kept else 'no'}"
    )


if __name__ == "__main__":
    main()
