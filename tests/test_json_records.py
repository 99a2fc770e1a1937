"""json_records: what a document holds reads back with its types and sharing, through a
schema's classes only; classes named lazily are imported when a document (or an object being
written) first needs one, never from a name the schema does not list; the plan schema reads a
plan without loading the step modules it does not hold (issue 32's warm path)."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlvm_eq.json_records import RecordError, Schema


@dataclasses.dataclass(frozen=True)
class Pair:
    """Two values: a class a test schema holds."""

    left: object
    right: object = None


@dataclasses.dataclass
class Named:
    """A value and a keyword-only label: built by keywords when read."""

    value: object
    label: str = dataclasses.field(default="", kw_only=True)


SCHEMA = Schema("test.records", 1, [Pair, Named])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**62), 2**62),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.sampled_from([np.float32(1.5), np.int32(-3), np.float64("nan"), np.bool_(True)]),
)
values = st.recursive(
    scalars | st.builds(lambda n: np.arange(n, dtype=np.float32).reshape(n, 1), st.integers(0, 4)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.one_of(st.integers(-5, 5), st.text(max_size=3)), inner, max_size=3),
        st.builds(Pair, inner, inner),
        st.builds(Named, inner, label=st.text(max_size=3)),
    ),
    max_leaves=12,
)


def same(a, b) -> bool:
    """Equal with the same types all the way down (bool is not int, tuple is not list), NaN
    equal to NaN, arrays by dtype, shape and bits: the oracle of the round trip."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, (float, np.floating)):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (Pair, Named)):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return a == b


@settings(max_examples=40, deadline=None)
@given(values)
def test_random_values_read_back_with_their_types(v):
    assert same(SCHEMA.loads(SCHEMA.dumps(v)), v)


def test_shared_objects_stay_shared_and_keyword_only_fields_are_kept():
    leaf = Pair(1.0, (2, "x"))
    got = SCHEMA.loads(SCHEMA.dumps([Named(leaf, label="a"), Pair(leaf, leaf)]))
    assert got[0].label == "a" and got[0].value is got[1].left is got[1].right
    assert got[1].left == leaf


def test_malformed_values_are_record_errors():
    text = SCHEMA.dumps(Pair(1, 2))
    doc = json.loads(text)
    for root in ({"$": True}, {"$": 5}, {"$": -1}, {"t": 3}, {"x": 1}, {"$": 0, "t": []}):
        with pytest.raises(RecordError):
            SCHEMA.loads(json.dumps(dict(doc, root=root)))
    with pytest.raises(RecordError):  # positional arguments of the wrong count
        SCHEMA.loads(text.replace('"Pair",[1,2]', '"Pair",[1]'))


def test_a_lazy_class_is_imported_only_by_its_listed_name_and_module():
    lazy = Schema("test.lazy", 1, [], lazy={"Fraction": "fractions", "Pair": "os"})
    # the listed class of the listed module: read through its constructor (fields given)
    lazy._given[__import__("fractions").Fraction] = ("numerator", "denominator")
    doc = {"schema": "test.lazy", "version": 1, "objects": [["Fraction", [3, 4]]]}
    assert lazy.loads(json.dumps(dict(doc, root={"$": 0}))) == __import__("fractions").Fraction(
        3, 4
    )
    # a name outside the table is refused, not imported
    for name in ("Decimal", "os.system", "fractions.Fraction"):
        bad = {**doc, "objects": [[name, [3, 4]]], "root": {"$": 0}}
        with pytest.raises(RecordError):
            lazy.loads(json.dumps(bad))
    # a class of the same name from another module is not the listed one
    with pytest.raises(RecordError):
        lazy.dumps(Pair(1, 2))
    with pytest.raises(RecordError):  # listed under "os", which has no Pair
        lazy.loads(json.dumps({**doc, "objects": [["Pair", [1, 2]]], "root": {"$": 0}}))


CHILD = textwrap.dedent("""
    import json, sys
    from dlvm_eq.codegen import plan_schema
    schema = plan_schema()
    steps = ("dlvm_eq.codegen.planning.gather", "dlvm_eq.codegen.planning.scan")
    before = [m for m in steps if m in sys.modules]
    plan = schema.loads(sys.stdin.read())
    print(json.dumps({"before": before, "after": [m for m in steps if m in sys.modules],
                      "text": str(plan)}))
""")


def test_the_plan_schema_imports_step_modules_only_for_a_plan_that_holds_them():
    import dlvm_eq as dq
    from dlvm_eq.codegen import plan_schema
    from dlvm_eq.pipeline import plan_function

    def f(e, ids):
        return dq.cumsum(dq.take(e, ids, axis=0), axis=1)

    args = (np.ones((6, 4), np.float32), np.array([1, 5], np.int32))
    ir = dq.make_ir(f)(*args)
    plan = plan_function(ir[next(iter(ir.functions))], ir)
    kinds = {type(s).__name__ for s in plan.steps}
    assert {"IndexStep", "ScanStep"} <= kinds, kinds
    r = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=plan_schema().dumps(plan),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["before"] == []
    assert sorted(got["after"]) == [
        "dlvm_eq.codegen.planning.gather",
        "dlvm_eq.codegen.planning.scan",
    ]
    assert got["text"] == str(plan)
