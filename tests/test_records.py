"""dlvm_eq/records.py's `dataclass` against the standard one (the oracle): for random classes
(fields with and without defaults and factories, frozen or not, eq, repr, per-field repr and
compare, __post_init__), the same signature, repr, equality, hashing, frozen errors, fields,
replace and asdict; classes outside the plain case are the standard decorator's own."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import re
from typing import ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlvm_eq import records

FIELD = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["plain", "default", "factory"]),
        "repr": st.booleans(),
        "compare": st.booleans(),
    }
)
CLASS = st.fixed_dictionaries(
    {
        "fields": st.lists(FIELD, max_size=6),
        "frozen": st.booleans(),
        "eq": st.booleans(),
        "repr": st.booleans(),
        "post_init": st.booleans(),
    }
)


def _make(spec: dict, decorator):
    """A class named Point built from `spec` and decorated by `decorator`."""
    kinds = sorted((f["kind"] != "plain", i) for i, f in enumerate(spec["fields"]))
    fields = [spec["fields"][i] for _, i in kinds]  # fields without defaults first
    ns: dict = {"__doc__": "A point.", "__annotations__": {}}
    for i, f in enumerate(fields):
        name = f"x{i}"
        ns["__annotations__"][name] = "int" if f["kind"] != "factory" else "list"
        default = 10 + i if f["kind"] == "default" else dataclasses.MISSING
        ns[name] = dataclasses.field(
            default=default,
            default_factory=list if f["kind"] == "factory" else dataclasses.MISSING,
            repr=f["repr"],
            compare=f["compare"],
        )
    if spec["post_init"]:

        def __post_init__(self):
            self.__dict__["seen"] = self.__dict__.get("seen", 0) + 1

        ns["__post_init__"] = __post_init__
    cls = type("Point", (), ns)
    cls.__qualname__ = "Point"
    opts = {k: spec[k] for k in ("frozen", "eq", "repr")}
    return decorator(**opts)(cls), [f["kind"] for f in fields]


def _values(kinds, seed):
    return [[seed, i] if k == "factory" else seed * 10 + i for i, k in enumerate(kinds)]


def _observe(cls, kinds) -> dict:
    """Everything a user of the class can see, as comparable data."""
    out: dict = {"signature": str(inspect.signature(cls))}
    a, b, c = (cls(*_values(kinds, s)) for s in (1, 1, 2))
    out["repr"] = re.sub(r" at 0x[0-9a-f]+", "", repr(a))
    out["eq"] = (a == b, a == c, a == a, a != b, a.__eq__(object()))
    out["hash_none"] = cls.__hash__ is None
    if cls.__hash__ is not None and cls.__dict__.get("__hash__") is not None:
        try:
            out["hash_equal"] = hash(a) == hash(b)
        except TypeError as e:  # a list field hashed
            out["hash_equal"] = str(e)
    out["fields"] = [(f.name, f.default, f.repr, f.compare) for f in dataclasses.fields(cls)]
    out["asdict"] = dataclasses.asdict(a)
    out["replace"] = dataclasses.asdict(dataclasses.replace(a)) if kinds else {}
    out["match_args"] = cls.__match_args__
    out["params"] = [getattr(cls.__dataclass_params__, k) for k in ("init", "repr", "eq", "frozen")]
    out["seen"] = a.__dict__.get("seen")
    if kinds:
        defaults = cls(*_values(kinds, 3)[: kinds.count("plain")])
        out["defaults"] = dataclasses.asdict(defaults)
        fresh = [cls(*_values(kinds, 4)[: kinds.count("plain")]) for _ in range(2)]
        out["factories_fresh"] = [
            getattr(fresh[0], f.name) is not getattr(fresh[1], f.name)
            for f, k in zip(dataclasses.fields(cls), kinds)
            if k == "factory"
        ]
        out["keywords"] = dataclasses.asdict(
            cls(**{f.name: v for f, v in zip(dataclasses.fields(cls), _values(kinds, 5))})
        )
    for target, name in ((a, "x0"), (a, "other")):
        try:
            setattr(target, name, 99)
            delattr(target, name)
            out.setdefault("set", []).append("ok")
        except Exception as e:  # the frozen error, or a missing attribute
            out.setdefault("set", []).append(f"{type(e).__name__}: {e}")
    out["pickled"] = dataclasses.asdict(pickle.loads(pickle.dumps(b))) if kinds else {}
    return out


@settings(max_examples=150, deadline=None)
@given(CLASS)
def test_records_behave_as_standard_dataclasses(spec):
    std, kinds = _make(spec, dataclasses.dataclass)
    ours, _ = _make(spec, records.dataclass)
    globals()["Point"] = std  # pickle finds the class by name
    expected = _observe(std, kinds)
    globals()["Point"] = ours
    assert _observe(ours, kinds) == expected


def test_records_compile_no_source_per_class(monkeypatch):
    # the point of the module: after a shape's template exists, a class costs no exec
    @records.dataclass(frozen=True)
    class First:
        """First."""

        a: int
        b: str = "x"

    calls = []
    real_exec = exec
    monkeypatch.setattr("builtins.exec", lambda *a, **k: calls.append(a) or real_exec(*a, **k))

    @records.dataclass(frozen=True)
    class Second:
        """Second."""

        c: int
        d: str = "y"

    assert calls == []
    assert Second(1) == Second(1, "y") and hash(Second(1)) == hash(Second(1, "y"))
    assert (
        repr(Second(2, "z"))
        == "test_records_compile_no_source_per_class.<locals>.Second(c=2, d='z')"
    )
    assert First(1) != Second(1, "x")


def test_classes_outside_the_plain_case_are_the_standard_ones():
    def undocumented():
        @records.dataclass
        class NoDoc:
            a: int

        return NoDoc

    cls = undocumented()
    assert cls.__doc__ == "NoDoc(a: 'int')"  # the standard decorator's generated docstring
    assert "__create_fn__" in cls.__init__.__code__.co_qualname

    @records.dataclass(order=True)
    class Ordered:
        """Ordered."""

        a: int

    assert Ordered(1) < Ordered(2)

    @records.dataclass
    class Base:
        """Base."""

        a: int

    @records.dataclass
    class Child(Base):
        """Child: a dataclass base."""

        b: int = 2

    assert dataclasses.asdict(Child(1)) == {"a": 1, "b": 2}
    assert "__create_fn__" in Child.__init__.__code__.co_qualname

    with pytest.raises(TypeError, match="non-default argument"):

        @records.dataclass
        class Bad:
            """Bad."""

            a: int = 1
            b: int  # type: ignore[misc]


def test_field_errors_are_the_standard_ones():
    for decorator in (dataclasses.dataclass, records.dataclass):
        with pytest.raises(ValueError, match="mutable default"):

            @decorator
            class Mutable:
                """Mutable."""

                a: list = []

        with pytest.raises(TypeError, match="is a field but has no type annotation"):

            @decorator
            class Unannotated:
                """Unannotated."""

                a = dataclasses.field(default=1)


def test_class_variables_are_not_fields():
    @records.dataclass
    class Counted:
        """Counted."""

        limit: ClassVar[int] = 3
        a: int = 1

    assert [f.name for f in dataclasses.fields(Counted)] == ["a"]
    assert Counted.limit == 3 and Counted(2).a == 2
