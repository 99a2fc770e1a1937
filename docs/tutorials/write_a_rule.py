"""Tutorial: write a rule, verify it, see it fire, measure what it bought.

Run from the repository root: `python docs/tutorials/write_a_rule.py`. Every claim the page
(docs/tutorials/write-a-rule.md) makes is an assert below; tests/test_tutorials.py runs it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import dlvm_eq as dq
from dlvm_eq.pipeline.measure_time import measure_compiled

# 1. A program with a redundancy the shipped rules do not remove: softplus(x) - softplus(-x) is
#    x, but rules/algebra.egg has no rule that says so.
PROGRAM = """
module "tutorial"
stage raw

func @f: (<512 x 512 x f32>) -> <512 x 512 x f32> {
'entry(%x: <512 x 512 x f32>):
    %a = softplus %x: <512 x 512 x f32>
    %n = negate %x: <512 x 512 x f32>
    %b = softplus %n: <512 x 512 x f32>
    %d = subtract %a: <512 x 512 x f32>, %b: <512 x 512 x f32>
    %y = multiply %d: <512 x 512 x f32>, 2: f32
    return %y: <512 x 512 x f32>
}
"""

# 2. The rule: a ruleset of our own and one rewrite in it (plain egglog over the constructors of
#    rules/schema.egg). And a wrong one, to see verify-rules catch it.
RULE = """(ruleset softplus-identities)
(rewrite (Subtract (Softplus x) (Softplus (Negate x))) x :ruleset softplus-identities)
"""
WRONG = """(ruleset wrong)
(rewrite (Add (Softplus x) (Softplus (Negate x))) x :ruleset wrong)
"""


def dlvm_eq_command(*args: str) -> subprocess.CompletedProcess:
    """`dlvm-eq ARGS` in a fresh process, as a user types it."""
    return subprocess.run(
        [sys.executable, "-m", "dlvm_eq.cli", *args], capture_output=True, text=True, timeout=300
    )


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="dlvm-eq-tutorial-"))
    program, rules, wrong = work / "tutorial.dl", work / "softplus.egg", work / "wrong.egg"
    program.write_text(PROGRAM)
    rules.write_text(RULE)
    wrong.write_text(WRONG)

    # 3. Verify: every rewrite, on small symbolic tensors, proven with sympy.
    ok = dlvm_eq_command("verify-rules", str(rules))
    print("$ dlvm-eq verify-rules softplus.egg\n" + ok.stdout)
    assert ok.returncode == 0 and "1 proven" in ok.stdout and "0 failed" in ok.stdout

    bad = dlvm_eq_command("verify-rules", str(wrong))
    print(f"$ dlvm-eq verify-rules wrong.egg   (exit status {bad.returncode})\n" + bad.stdout)
    assert bad.returncode == 1 and "1 failed" in bad.stdout
    assert "wrong.egg:2" in bad.stdout + bad.stderr  # the failing rule's file:line

    # 4. See it fire: `opt --explain` writes what changed and which rules matched to stderr.
    explain = dlvm_eq_command(
        "opt", str(program), "--rules", str(rules), "--explain", "--budget", "seconds=60"
    )
    print("$ dlvm-eq opt tutorial.dl --rules softplus.egg --explain\n" + explain.stderr)
    assert explain.returncode == 0
    assert "5 -> 1 instructions" in explain.stderr
    assert "(rewrite (Subtract (Softplus x) (Softplus (Negate x))) x" in explain.stderr

    # 5. The same from Python: dq.optimize takes rule files; its report is the one a jitted
    #    function's report starts with (e-graph size, rules fired, cost before and after).
    module = dq.parse(PROGRAM)
    without = dq.optimize(module, "f", budget={"seconds": 60})
    result = dq.optimize(module, "f", rules=[rules], budget={"seconds": 60})
    fired = result.report["f"].saturation.rule_matches
    print("rules fired:", {str(rule)[:60]: n for rule, n in fired.items()})
    assert without.report["f"].ops_after == 5  # the shipped rules alone leave five instructions
    assert result.report["f"].ops_after == 1  # ours leaves one: x * 2
    assert result.report["f"].speedup > 3  # the cost model's estimate

    # 6. Measure what it bought: both programs compiled for the CPU, timed on the same input.
    x = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    before = dq.compile(without.module, "f")
    after = dq.compile(result.module, "f")
    np.testing.assert_allclose(after(x), before(x), rtol=1e-4, atol=1e-4)  # the same function
    t_before = measure_compiled(before, [x], repeats=20).median
    t_after = measure_compiled(after, [x], repeats=20).median
    print(after.report)
    print(f"measured: {t_before * 1e6:.0f} us -> {t_after * 1e6:.0f} us per call")
    print(f"the rule bought x{t_before / t_after:.1f}")
    assert "kernels: 1" in str(after.report)  # one fused multiply
    assert t_before / t_after > 1.5


if __name__ == "__main__":
    main()
