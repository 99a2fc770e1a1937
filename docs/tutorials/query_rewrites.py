"""Tutorial: query the cheapest form of an expression and read the alternatives.

Run from the repository root: `python docs/tutorials/query_rewrites.py`. Every claim the page
(docs/tutorials/query.md) makes is an assert below; tests/test_tutorials.py runs it.
"""

from __future__ import annotations

import subprocess
import sys

from dlvm_eq.egraph.query import query

BUDGET = {"seconds": 60}  # enough to saturate on a loaded machine (the default is 3 s)


def main() -> None:
    # 1. A matrix chain: which product first? The e-graph holds every bracketing; the cost
    #    model (bytes moved, flops, launches) prices each one.
    chain = query("A @ B @ C", {"A": (30, 35), "B": (35, 15), "C": (15, 5)}, budget=BUDGET)
    print(chain, end="\n\n")
    assert chain.best.text == "A @ (B @ C)"
    assert (chain.original.multiplies, chain.best.multiplies) == (18000, 7875)
    # the alternatives: one per way the e-graph can finish the root, dearer than the best
    assert "A @ B @ C" in [a.text for a in chain.alternatives]
    assert all(a.cost >= chain.best.cost for a in chain.alternatives)

    # 2. A least-squares loss, in float64: sum((X - U V^T)^2) expanded (rules/algebra.egg,
    #    ruleset sumproduct) never builds the 1000 x 800 matrix U V^T. The expansion is an
    #    alternative for every shape; it is the best only where it is cheaper.
    shapes = {"X": (1000, 800), "U": (1000, 5), "V": (800, 5)}
    big = query("sum((X - U @ V.T) ** 2)", shapes, dtype="f64", budget=BUDGET)
    print(big, end="\n\n")
    assert "U @ V.T" not in big.best.text and "(U.T @ U) * (V.T @ V)" in big.best.text
    assert big.best.cost < big.original.cost

    small = {"X": (100, 80), "U": (100, 5), "V": (80, 5)}
    near = query("sum((X - U @ V.T) ** 2)", small, dtype="f64", budget=BUDGET)
    print(near, end="\n\n")
    assert near.best.text == "sum(square(X - U @ V.T))"  # x ** 2 is square(x): no pow call
    assert any("2 * sum((X.T @ U) * V)" in a.text for a in near.alternatives)

    # 3. In float32 the expansion is not offered: it cancels catastrophically when U V^T fits X.
    f32 = query("sum((X - U @ V.T) ** 2)", shapes, dtype="f32", budget=BUDGET)
    assert not any("X.T @ U" in f.text for f in [f32.best, *f32.alternatives])

    # 4. The command line prints the same report (s-expressions over the schema's
    #    constructors are accepted as well as infix).
    cli = subprocess.run(
        [sys.executable, "-m", "dlvm_eq.cli", "query", "(Dot (Dot A B) C)"]
        + ["--shape", "A=30x35", "--shape", "B=35x15", "--shape", "C=15x5"]
        + ["--budget", "seconds=60"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    print("$ dlvm-eq query '(Dot (Dot A B) C)' --shape A=30x35 --shape B=35x15 --shape C=15x5")
    print(cli.stdout)
    assert cli.returncode == 0 and "best:   A @ (B @ C)" in cli.stdout


if __name__ == "__main__":
    main()
