"""A mutation corpus of user rule files, and the harness that runs `dlvm-eq opt --rules` on each
(tests/test_rule_fuzz.py runs it in a subprocess, so that a crash is a result, not a dead test).

    cases = corpus(seed=0, n=80)              # [Case(name, data, program)], deterministic
    python tests/rule_fuzz.py cases.json      # one JSON line per case: START, then its result

Seeds: the shipped rules/algebra.egg's rules re-homed in a ruleset of the user's (true identities,
verified in CI) and the README's softplus file. Mutations: truncation, nesting (even towers of
Negate: the same value, up to 100,000 deep), duplicated rules, ill-typed right-hand sides
(of a type no term of the programs has, so that a rule using them is never right by luck),
unknown constructors, huge literals (in left-hand sides, and in a commutation that holds for
any value), bytes that are not UTF-8, and schedules. The programs' terms are all f32 of shapes
<4 x 3> (softplus.dl), or the chain's <30 x 35> ... (matrix_chain.dl) and scalars.

Outcomes: "error" (one message that names the rule file with a line: file:line), "verified"
(the optimized program agrees with the reference interpreter on random inputs); anything else
is a finding: "unlocated" (an error that does not say where), "traceback", "wrong".
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ("softplus.dl", "matrix_chain.dl")
BUDGET = 5.0  # seconds: --budget seconds=5 on every run

# right-hand sides of a type no term of the programs has (v: the rule's first variable)
ILL_TYPED = (
    "(Dot {v} {v})",
    '(DataTypeCast {v} "f64")',
    "(Broadcast {v} (vec-of 7 7 7))",
    "(ShapeCast {v} (vec-of 99999999999 99999999999))",
    '(Const 0.5 "f64")',
    "(LessThan {v} {v})",
    '(Broadcast (Const 1.0 "banana") (vec-of 4 3))',
    '(Var "not-a-parameter")',
)
HUGE = ("1e999", "-1e999", "nan", "99999999999999999999999", "1e308", "-0.0", "4294967297")
SCHEDULES = (
    "(run-schedule (repeat 1000000000 fuzz))",
    "(run 100000000)",
    "(run-schedule (saturate fuzz))",
    "(run fuzz 5)",
)
_ATOM = re.compile(r'"[^"]*"|[()]|[^\s()]+')


@dataclass
class Case:
    name: str
    data: str  # latin-1 text of the file's bytes (JSON-safe)
    program: str

    @property
    def bytes(self) -> bytes:
        return self.data.encode("latin-1")


def _top_forms(text: str) -> list[str]:
    forms, depth, start = [], 0, 0
    for m in _ATOM.finditer(text):
        t = m.group()
        if t == "(":
            depth += 1
            if depth == 1:
                start = m.start()
        elif t == ")":
            depth -= 1
            if depth == 0:
                forms.append(text[start : m.end()])
    return forms


def shipped_rules() -> list[str]:
    """rules/algebra.egg's rules moved to the user's ruleset `fuzz`, their :names prefixed
    (egglog names rules globally: the same name twice is refused as a duplicate)."""
    text = (ROOT / "rules" / "algebra.egg").read_text()
    text = "\n".join(line.split(";", 1)[0] for line in text.splitlines())
    out = []
    for form in _top_forms(text):
        if form.startswith(("(rule ", "(rewrite ")):
            form = re.sub(r":ruleset\s+[^\s()]+", ":ruleset fuzz", form)
            form = form.replace(':name "', ':name "fuzz ')
            out.append(form if ":ruleset fuzz" in form else form[:-1] + " :ruleset fuzz)")
    return out


def _elements(text: str, start: int) -> list[tuple[int, int]]:
    """(start, end) of the elements of the list that opens at text[start]."""
    depth, elems, first = 0, [], 0
    for m in _ATOM.finditer(text, start):
        t = m.group()
        if t == "(":
            depth += 1
            if depth == 2:
                first = m.start()
        elif t == ")":
            depth -= 1
            if depth == 1:
                elems.append((first, m.end()))
            if depth == 0:
                break
        elif depth == 1:
            elems.append((m.start(), m.end()))
    return elems


def _rhs_span(form: str) -> tuple[int, int] | None:
    """(start, end) of what a rule makes: a rewrite's right-hand side, or the second operand
    of a rule's first union."""
    at = 0 if form.startswith("(rewrite ") else form.find("(union ")
    elems = _elements(form, at) if at >= 0 else []
    return elems[2] if len(elems) > 2 else None


def _operand(form: str) -> str:
    """A Term variable the rule binds: a rewrite's first variable, or the term a rule's union
    joins (its first operand)."""
    if not form.startswith("(rewrite "):
        at = form.find("(union ")
        elems = _elements(form, at) if at >= 0 else []
        return form[slice(*elems[1])] if len(elems) > 1 else "e"
    for m in _ATOM.finditer(form, len("(rewrite ")):
        t = m.group()
        if t[0].islower() and t != "vec-of" and not t.startswith(":"):
            return t
    return "x"


def _file(rules: list[str], extra: str = "") -> str:
    return "(ruleset fuzz)\n" + "\n".join(rules) + "\n" + extra


def corpus(seed: int = 0, n: int = 80) -> list[Case]:
    rng = random.Random(seed)
    pool = shipped_rules()
    softplus = (ROOT / "examples" / "rules" / "softplus.egg").read_text()
    mutations = [
        "truncate",
        "nest",
        "duplicate",
        "ill_typed",
        "unknown",
        "huge",
        "not_utf8",
        "schedule",
        "plain",
    ]
    cases = []
    for i in range(n):
        kind = mutations[i % len(mutations)]
        rules = rng.sample(pool, 3) + [
            "(rewrite (Subtract (Softplus x) (Softplus (Negate x))) x :ruleset fuzz)"
        ]
        text = _file(rules)
        if kind == "truncate":
            base = softplus if rng.random() < 0.3 else text
            text = base[: rng.randrange(1, len(base))]
        elif kind == "nest":
            depth = rng.choice((2, 16, 30, 31, 32, 33, 64, 500, 10_000, 100_000))
            t = "(Negate " * (2 * (depth // 2)) + "x" + ")" * (2 * (depth // 2))
            text = _file(rules + [f"(rewrite (Softplus x) (Softplus {t}) :ruleset fuzz)"])
        elif kind == "duplicate":
            j = rng.randrange(len(rules))
            again = rng.choice(
                (
                    rules[j],
                    re.sub(r" ", "  ", rules[j], count=2),  # other spaces
                    re.sub(r"(\d+\.\d+)", r"\g<1>0", rules[j]),  # 1.0 as 1.00: the same value
                )
            )
            text = _file(rules + [again])
        elif kind == "ill_typed":
            j = rng.randrange(len(rules))
            span = _rhs_span(rules[j])
            if span is not None:
                rhs = rng.choice(ILL_TYPED).format(v=_operand(rules[j]))
                rules[j] = rules[j][: span[0]] + rhs + rules[j][span[1] :]
            rules.append(
                f"(rewrite (Softplus x) {rng.choice(ILL_TYPED).format(v='x')} :ruleset fuzz)"
            )
            text = _file(rules)
        elif kind == "unknown":
            j = rng.randrange(len(rules))
            ctors = [m for m in re.finditer(r"\((?=[A-Z])(\w+)", rules[j])]
            m = rng.choice(ctors)
            rules[j] = (
                rules[j][: m.start(1)] + rng.choice(("Frob", "exp", "Dott")) + rules[j][m.end(1) :]
            )
            text = _file(rules)
        elif kind == "huge":
            lit = rng.choice(HUGE)
            if rng.random() < 0.5:  # commutation: true whatever the value
                c = f'(Const {lit} "f32")'
                rules.append(f"(rewrite (Multiply x {c}) (Multiply {c} x) :ruleset fuzz)")
            else:  # only where the rule matches: in a left-hand side
                rules.append(f'(rewrite (Multiply x (Const {lit} "f32")) x :ruleset fuzz)')
            text = _file(rules)
        elif kind == "not_utf8":
            raw = bytearray(text.encode())
            at = rng.randrange(len(raw))
            raw[at:at] = bytes(rng.randrange(0x80, 0x100) for _ in range(rng.randint(1, 3)))
            cases.append(Case(f"{i}-{kind}", raw.decode("latin-1"), rng.choice(PROGRAMS)))
            continue
        elif kind == "schedule":
            text = _file(rules, rng.choice(SCHEDULES) + "\n")
        cases.append(Case(f"{i}-{kind}", text.encode().decode("latin-1"), rng.choice(PROGRAMS)))
    return cases


# ---------------------------------------------------------------- one run


def run_case(case: Case, directory: Path) -> dict:
    import numpy as np

    from dlvm_eq.cli import main
    from dlvm_eq.ir.interp import interpret
    from dlvm_eq.ir.parser import load, parse

    path = directory / f"{case.name}.egg"
    path.write_bytes(case.bytes)
    program = ROOT / "examples" / case.program
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(
                ["opt", str(program), "--rules", str(path), "--budget", f"seconds={BUDGET}"]
            )
    except BaseException as e:  # a traceback is what this harness looks for
        return _result(case, "traceback", f"{type(e).__name__}: {e}", t0)
    if code != 0:
        message = err.getvalue()
        located = re.search(re.escape(str(path)) + r":\d+", message) is not None
        return _result(case, "error" if located else "unlocated", message[:400], t0)
    module, optimized = load(program), parse(out.getvalue(), "<optimized>")
    rng = np.random.default_rng(0)
    for name, fn in module.functions.items():
        args = [rng.standard_normal(p.type.shape).astype(np.float32) for p in fn.params]
        want = interpret(module, name, *args, float64=True)
        got = interpret(optimized, name, *args)
        if not np.allclose(got, want, rtol=1e-3, atol=1e-3):
            return _result(case, "wrong", f"@{name}: {out.getvalue()[:400]}", t0)
    return _result(case, "verified", "", t0)


def _result(case: Case, outcome: str, detail: str, t0: float) -> dict:
    return {
        "name": case.name,
        "outcome": outcome,
        "detail": detail,
        "seconds": time.perf_counter() - t0,
    }


def main(argv: list[str]) -> None:
    cases = [Case(**c) for c in json.loads(Path(argv[0]).read_text())]
    directory = Path(argv[1])
    for case in cases:
        print(json.dumps({"start": case.name}), flush=True)
        print(json.dumps(run_case(case, directory)), flush=True)


def write_cases(cases: list[Case], path: Path) -> None:
    path.write_text(json.dumps([asdict(c) for c in cases]))


if __name__ == "__main__":  # the caller's PYTHONPATH picks the dlvm_eq under test
    main(sys.argv[1:])
