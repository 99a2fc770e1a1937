"""Op counts and flops of the MLP loss gradient extracted from the e-graph, against the
hand-written numpy forward + backward pass (dlvm_eq.models.mlp.numpy_value_and_grad).

    .venv/bin/python benchmarks/mlp_grad_flops.py            # prints a markdown table

Batch 256, 784 -> 256 -> 10, ReLU, mean softmax cross-entropy; gradients with respect to the
weights and biases (not x, y). Flops: a matmul 2·m·k·n, an elementwise op one per output
element, a reduction one per input element, layout ops (transpose, reshape, broadcast) none.
"""

from __future__ import annotations

import time

import numpy as np

import dlvm_eq as dq
from dlvm_eq.ad import adjoint_function
from dlvm_eq.ad.flops import program_flops
from dlvm_eq.ir.interp import run_function
from dlvm_eq.models.mlp import init_params, loss, numpy_value_and_grad

N, D, H, C = 256, 784, 256, 10


def hand_written() -> list[tuple[str, float]]:
    """The numpy pass of numpy_value_and_grad, op by op: (op, flops)."""
    mm = lambda m, k, n: ("dot", 2.0 * m * k * n)
    ew = lambda op, n: (op, float(n))
    return [
        mm(N, D, H),
        ew("add", N * H),
        ew("max", N * H),  # z1 = x@w1 + b1; relu
        mm(N, H, C),
        ew("add", N * C),  # z2 = h@w2 + b2
        ew("reduce", N * C),
        ew("subtract", N * C),
        ew("exp", N * C),  # z2 - max; exp
        ew("reduce", N * C),
        ew("log", N),
        ew("multiply", N * C),  # s; log s; z2*y
        ew("reduce", N * C),
        ew("subtract", N),
        ew("reduce", N),
        ew("divide", 1),  # the mean loss
        ew("divide", N * C),
        ew("subtract", N * C),
        ew("multiply", N * C),  # dz2 = (e/s - y)/n
        mm(H, N, C),
        ew("reduce", N * C),  # dw2 = h.T@dz2; db2
        mm(N, C, H),
        ew("greaterThan", N * H),
        ew("multiply", N * H),  # dh = dz2@w2.T * (h>0)
        mm(D, N, H),
        ew("reduce", N * H),  # dw1 = x.T@dh; db1
    ]


def summarize(name: str, ops: list[tuple[str, float]]) -> dict:
    dots = [f for op, f in ops if op == "dot"]
    return {
        "program": name,
        "ops": len(ops),
        "matmuls": len(dots),
        "matmul": sum(dots),
        "other": sum(f for op, f in ops if op != "dot"),
        "total": sum(f for _, f in ops),
    }


def extracted_ops(fn) -> list[tuple[str, float]]:
    from dlvm_eq.ad.flops import op_flops
    from dlvm_eq.ir.types import TensorType

    return [
        (i.op, op_flops(i.op, i.result.type, [o.type for o in i.operands]))
        for i in fn.body
        if i.op not in ("literal", "tuple") and isinstance(i.result.type, TensorType)
    ]


def main() -> None:
    specs = [
        dq.spec((D, H)),
        dq.spec((H,)),
        dq.spec((H, C)),
        dq.spec((C,)),
        dq.spec((N, D)),
        dq.spec((N, C)),
    ]
    forward = dq.trace(loss, specs)
    rows, programs = [summarize("numpy, hand-written", hand_written())], {}
    for optimize in (True, False):
        t0 = time.perf_counter()
        adj = adjoint_function(None, forward, wrt=(0, 1, 2, 3), keeping=(0,), optimize=optimize)
        seconds = time.perf_counter() - t0
        name = "e-graph, adjoint + algebra rules" if optimize else "e-graph, adjoint rules only"
        rows.append(summarize(name, extracted_ops(adj)) | {"seconds": seconds})
        programs[name] = adj
        assert program_flops(adj)["flops"] == rows[-1]["total"]

    # the extracted gradients are the hand-written ones
    rng = np.random.default_rng(0)
    params = init_params([D, H, C], seed=0)
    x = rng.standard_normal((N, D)).astype(np.float32)
    y = np.eye(C, dtype=np.float32)[rng.integers(0, C, N)]
    ref_value, ref_grads = numpy_value_and_grad(*params, x, y)
    for adj in programs.values():
        value, *grads = run_function(None, adj, params + [x, y])
        assert np.allclose(value, ref_value, rtol=1e-5)
        assert all(np.allclose(g, r, rtol=1e-4, atol=1e-6) for g, r in zip(grads, ref_grads))

    base = rows[0]["total"]
    print(f"MLP loss gradient, batch {N}, {D} -> {H} -> {C}, w.r.t. w1, b1, w2, b2 (loss kept)\n")
    print(
        "| program | ops | matmuls | matmul MFLOP | other MFLOP | total MFLOP | vs hand-written | differentiate s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        secs = f"{r['seconds']:.2f}" if "seconds" in r else "-"
        print(
            f"| {r['program']} | {r['ops']} | {r['matmuls']} | {r['matmul'] / 1e6:.2f} | "
            f"{r['other'] / 1e6:.3f} | {r['total'] / 1e6:.2f} | {r['total'] / base:.4f}x | {secs} |"
        )
    best = programs["e-graph, adjoint + algebra rules"]
    counts = {k: v for k, v in program_flops(best).items() if k not in ("flops", "ops")}
    print(
        "\nops of the optimized gradient program: "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    )


if __name__ == "__main__":
    main()
