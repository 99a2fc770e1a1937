"""The rule-file fuzzer (tests/rule_fuzz.py): every mutated user rule file ends `dlvm-eq opt
--rules` with an error located at file:line, or with a program the reference interpreter
agrees with; never a traceback, a crash, a hang or a wrong program.

The corpus runs in one subprocess (a crash there names the case that was running); each case
under `--budget seconds=5`. DLVM_EQ_FUZZ_CASES=400 runs a longer corpus."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from rule_fuzz import BUDGET, corpus, write_cases

ROOT = Path(__file__).resolve().parents[1]
CASES = int(os.environ.get("DLVM_EQ_FUZZ_CASES", "45"))
HANG = BUDGET + 10.0  # a case's wall time past the budget: a hang (slack for a loaded machine)


def run_corpus(tmp_path, cases) -> tuple[list[dict], str | None, str]:
    """(results, the case running when the process died or None, stderr)."""
    spec = tmp_path / "cases.json"
    write_cases(cases, spec)
    work = tmp_path / "files"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}")
    try:
        p = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "rule_fuzz.py"), str(spec), str(work)],
            capture_output=True,
            text=True,
            timeout=HANG * len(cases),
            cwd=ROOT,
            env=env,
        )
        stdout, stderr, code = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:  # a hang: the case that was running says which
        out = e.stdout or ""
        stdout, stderr, code = out if isinstance(out, str) else out.decode(), "(timed out)", -9
    results, running = [], None
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        rec = json.loads(line)
        if "start" in rec:
            running = rec["start"]
        else:
            results.append(rec)
            running = None
    if code != 0 and running is None:
        running = f"(after the last case: exit {code})"
    return results, running, stderr[-2000:]


def test_every_mutated_rule_file_ends_in_a_located_error_or_a_verified_program(tmp_path):
    cases = corpus(seed=0, n=CASES)
    results, crashed, stderr = run_corpus(tmp_path, cases)
    assert crashed is None, f"the process died while running case {crashed}:\n{stderr}"
    assert len(results) == len(cases)
    bad = [r for r in results if r["outcome"] not in ("error", "verified")]
    assert not bad, "\n".join(f"{r['name']}: {r['outcome']}: {r['detail']}" for r in bad)
    slow = [r for r in results if r["seconds"] > HANG]
    assert not slow, slow
    # the corpus reaches both ends: refusals and programs the rules optimized
    outcomes = Counter(r["outcome"] for r in results)
    assert outcomes["error"] >= len(cases) // 3 and outcomes["verified"] >= 3, outcomes
