"""The globals our loaders bind never trip egglog's confusion of `$p0_1` with `$p0_11`.

egglog 13.2, given globals `$p0_1` (w) and `$p0_11` (a10), both with a shape set, built
`(Multiply $p0_11 $p0_1)` as w * w: `dlvm-eq query "a0*w + ... + a11*w"` answered with
`square(w)` in place of `a10 * w`. The loaders now name globals with a trailing `_`
(egraph/lets.let_name). The first test keeps the trigger itself, so that an egglog upgrade that
fixes it (or a change to our naming that reintroduces it) is noticed.
"""

import subprocess
import sys
from pathlib import Path

from dlvm_eq.egraph.lets import let_name

SCHEMA = (
    "(datatype T (Var String) (Multiply T T))\n(function shape (T) i64 :merge old)\n"
    "(function dtype (T) String :merge old)\n"
)


def _program(name) -> str:
    """The smallest program found that shows it: 12 variables, 11 products with w."""
    lines = [
        f'(let {name(0)} (Var "a0"))',
        f'(let {name(1)} (Var "w"))',
        f"(set (shape {name(1)}) 4)",
        f'(set (dtype {name(1)}) "f32")',
    ]
    lines += [f'(let {name(i + 1)} (Var "a{i}"))' for i in range(1, 11)]
    lines += [f"(set (shape {name(11)}) 4)", f'(set (dtype {name(11)}) "f32")']
    lines.append(f"(let {name(13)} (Multiply {name(0)} {name(1)}))")
    lines += [f"(let {name(12 + 2 * i)} (Multiply {name(i + 1)} {name(1)}))" for i in range(1, 11)]
    return "\n".join(lines)


def _extract(program: str, name: str) -> str:
    from egglog.bindings import EGraph

    eg = EGraph()
    eg.run_program(*eg.parse_program(SCHEMA, filename="schema"))
    eg.run_program(*eg.parse_program(program, filename="program"))
    out = eg.run_program(*eg.parse_program(f"(extract {name})", filename="query"))
    return out[0].termdag.to_string(out[0].term)


def test_our_let_names_are_built_as_written():
    name = lambda n: let_name("p0_", n)
    assert _extract(_program(name), name(32)) == '(Multiply (Var "a10") (Var "w"))'


def test_the_egglog_trigger_is_still_there():
    """Plain `$p0_<n>` names still show the confusion: if this fails, egglog fixed it and the
    trailing `_` of let_name may go."""
    name = lambda n: f"$p0_{n}"
    assert _extract(_program(name), name(32)) == '(Multiply (Var "w") (Var "w"))'


def test_query_keeps_every_product():
    expr = " + ".join(f"a{i}*w" for i in range(12))
    shapes = [a for i in range(12) for a in ("--shape", f"a{i}=4")] + ["--shape", "w=4"]
    cli = Path(sys.executable).parent / "dlvm-eq"
    r = subprocess.run(
        [cli, "query", expr, *shapes, "-k", "0"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert "a10 * w" in r.stdout and "w * w" not in r.stdout and "square" not in r.stdout, r.stdout
