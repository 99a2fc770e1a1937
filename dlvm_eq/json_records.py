"""Compiler objects as JSON data, for the disk cache: what a file may hold is data, never code.

A `Schema` names the classes a document may contain (a whitelist, each with the fields its
constructor takes); decoding builds only those, through their own constructors, from plain
values. Nothing is imported or called by name from the file, unlike pickle.

    schema = Schema("ir", 1, [TensorType, TupleType], enums=[DType])
    text = schema.dumps(TensorType((2, 3), DType.f32))     # '{"schema":"ir","version":1,...}'
    schema.loads(text)                                      # TensorType((2, 3), DType.f32)

Objects are written once each, in a table, and referred to by index: shared sub-objects (an
expression DAG, an SSA value used by many instructions) stay shared and keep their identity
after loading, and neither writing nor reading recurses along a chain of objects. Tuples,
non-string dict keys, numpy arrays and scalars keep their types. A document that does not
match its schema raises `RecordError`: the cache treats it as a miss.
"""

from __future__ import annotations

import base64
import dataclasses
import importlib
import json
from enum import Enum

import numpy as np

# numpy dtypes a document may hold (never object or void: those are not data)
_ARRAY_KINDS = "biuf"
# what json.loads gives for JSON's scalars: read as they are
_PLAIN = frozenset((type(None), bool, int, float, str))


class RecordError(ValueError):
    """A document that this schema cannot read (or an object it cannot write)."""


class Schema:
    """A named, versioned set of classes. `fields` overrides the constructor arguments of a
    class that is not a dataclass: {cls: ("name", "type")}, built as cls(*values)."""

    def __init__(self, name: str, version: int, classes, enums=(), fields=None, lazy=None):
        self.name, self.version = name, int(version)
        self._given = dict(fields or {})
        self._fields: dict[type, tuple[str, ...]] = {}
        self._keywords: set[type] = set()  # built as cls(**fields): keyword-only fields
        self._by_name: dict[str, type] = {}
        # qualname -> module: classes imported when a document (or an object) first needs one,
        # so that reading a plan loads only the step modules it holds; a name outside this
        # table (and `classes`) is refused, never imported
        self._lazy: dict[str, str] = dict(lazy or {})
        for cls in classes:
            self._add(cls)
        self._enums = {e.__qualname__: e for e in enums}

    def _add(self, cls: type) -> tuple[str, ...]:
        if cls in self._given:
            names = tuple(self._given[cls])
        elif dataclasses.is_dataclass(cls):
            fs = dataclasses.fields(cls)
            if any(not f.init for f in fs):
                raise RecordError(f"{cls.__name__} has fields its constructor does not take")
            names = tuple(f.name for f in fs)
            if any(f.kw_only for f in fs):
                self._keywords.add(cls)
        else:
            raise RecordError(f"{cls.__name__}: not a dataclass; say which fields it has")
        self._fields[cls] = names
        self._by_name[cls.__qualname__] = cls
        return names

    def _named(self, name) -> type | None:
        """The class a document names: one of `classes`, or a lazy one (imported now)."""
        cls = self._by_name.get(name) if isinstance(name, str) else None
        if cls is None and isinstance(name, str) and name in self._lazy:
            try:
                found = importlib.import_module(self._lazy[name])
                for part in name.split("."):
                    found = getattr(found, part)
            except (ImportError, AttributeError):
                return None  # the table names a class its module lacks: nothing to build
            self._add(found)  # a race adds an equal entry
            cls = found
        return cls

    def _names_of(self, cls: type) -> tuple[str, ...] | None:
        """The fields of an object's class, or None when the schema holds no such class."""
        names = self._fields.get(cls)
        if names is None and self._lazy.get(cls.__qualname__) == cls.__module__:
            names = self._add(cls)
        return names

    # ---------------------------------------------------------------- writing

    def dumps(self, root) -> str:
        """The JSON text of `root`; RecordError if it holds an object outside the schema."""
        writer = _Writer(self)
        value = writer.value(root)
        return json.dumps(
            {
                "schema": self.name,
                "version": self.version,
                "objects": writer.objects,
                "root": value,
            },
            separators=(",", ":"),
        )

    # ---------------------------------------------------------------- reading

    def loads(self, text: str | bytes):
        """The object `dumps` wrote; RecordError for anything else (another schema or
        version, an unknown class, a reference forward, a constructor that refuses)."""
        try:
            return self._loads(text)
        except RecursionError:  # lists nested thousands deep: never written by dumps
            raise RecordError("nested too deeply") from None

    def _loads(self, text: str | bytes):
        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError) as e:
            raise RecordError(f"not JSON: {e}") from None
        if (
            not isinstance(doc, dict)
            or doc.get("schema") != self.name
            or doc.get("version") != self.version
        ):
            raise RecordError("another schema or version")
        objects = doc.get("objects")
        if not isinstance(objects, list):
            raise RecordError("no object table")
        built: list = []
        reader = _Reader(self, built)
        value, plain, keywords = reader.value, _PLAIN, self._keywords
        for entry in objects:
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list)):
                raise RecordError("malformed object entry")
            cls = self._named(entry[0])
            names = self._fields.get(cls) if cls is not None else None
            if names is None or len(entry[1]) != len(names):
                raise RecordError(f"class {entry[0]!r} is not in schema {self.name}")
            # most fields are plain JSON values: no call for them (thousands per plan)
            args = [v if type(v) in plain else value(v) for v in entry[1]]
            try:
                obj = cls(**dict(zip(names, args))) if cls in keywords else cls(*args)
            except Exception as e:
                raise RecordError(f"{entry[0]}: {type(e).__name__}: {e}") from None
            built.append(obj)
        return reader.value(doc.get("root"))


class _Writer:
    def __init__(self, schema: Schema):
        self.schema = schema
        self.objects: list = []
        self.index: dict[int, int] = {}
        self.keep: list = []  # ids stay valid while the objects live

    def value(self, v):
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int) and not isinstance(v, Enum):
            return v
        if isinstance(v, float) and not isinstance(v, np.generic):  # np.float64 is a float
            return v if v == v and v not in (float("inf"), float("-inf")) else {"f": repr(v)}
        if isinstance(v, Enum):
            if type(v).__qualname__ not in self.schema._enums:
                raise RecordError(f"enum {type(v).__name__} is not in schema {self.schema.name}")
            return {"e": [type(v).__qualname__, v.value]}
        if isinstance(v, tuple):
            return {"t": [self.value(x) for x in v]}
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, dict):
            return {"d": [[self.value(k), self.value(x)] for k, x in v.items()]}
        if isinstance(v, np.ndarray):
            return {
                "a": [
                    _dtype_text(v.dtype),
                    list(v.shape),
                    base64.b64encode(np.ascontiguousarray(v).tobytes()).decode(),
                ]
            }
        if isinstance(v, np.generic):
            return {
                "n": [
                    _dtype_text(v.dtype),
                    v.item() if not isinstance(v.item(), float) else repr(v.item()),
                ]
            }
        if self.schema._names_of(type(v)) is not None:
            return {"$": self.ref(v)}
        raise RecordError(f"{type(v).__name__} is not in schema {self.schema.name}")

    def ref(self, obj) -> int:
        """The table index of `obj`, writing it and every object it holds first (iteratively:
        an expression chain may be thousands of objects deep)."""
        if id(obj) in self.index:
            return self.index[id(obj)]
        stack, busy = [obj], set()
        while stack:
            o = stack[-1]
            if id(o) in self.index:
                stack.pop()
                continue
            names = self.schema._names_of(type(o)) or ()
            fields = [getattr(o, n) for n in names]
            pending = [
                c for c in _objects_in(fields, self.schema._names_of) if id(c) not in self.index
            ]
            if pending:
                if id(o) in busy:
                    raise RecordError(f"{type(o).__name__} holds itself (a cycle)")
                busy.add(id(o))
                stack.extend(pending)
                continue
            self.index[id(o)] = len(self.objects)
            self.keep.append(o)
            self.objects.append([type(o).__qualname__, [self.value(f) for f in fields]])
            stack.pop()
        return self.index[id(obj)]


def _objects_in(value, names_of) -> list:
    """Schema objects directly inside `value` (through tuples, lists and dicts, not objects);
    names_of(cls): the class's fields, None outside the schema."""
    out, stack = [], [value]
    while stack:
        v = stack.pop()
        if type(v) in _PLAIN:
            continue
        if names_of(type(v)) is not None:
            out.append(v)
        elif isinstance(v, (tuple, list)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
    return out


class _Reader:
    def __init__(self, schema: Schema, built: list):
        self.schema, self.built = schema, built

    def value(self, v):
        t = type(v)
        if t in _PLAIN:
            return v
        if t is list:
            value = self.value
            return [x if type(x) in _PLAIN else value(x) for x in v]
        if t is not dict or len(v) != 1:
            raise RecordError("malformed value")
        ((tag, body),) = v.items()
        if tag == "$":  # type(body) is int: no bool
            if type(body) is not int or not 0 <= body < len(self.built):
                raise RecordError("reference to an object not yet read")
            return self.built[body]
        if tag == "t" and type(body) is list:
            value = self.value
            return tuple([x if type(x) in _PLAIN else value(x) for x in body])
        if tag == "d" and isinstance(body, list):
            try:
                return {_hashable(self.value(k)): self.value(x) for k, x in body}
            except (TypeError, ValueError):
                raise RecordError("malformed dict") from None
        if tag == "f" and body in ("inf", "-inf", "nan"):
            return float(body)
        if tag == "e" and isinstance(body, list) and len(body) == 2:
            enum = self.schema._enums.get(body[0])
            try:
                return enum(body[1])
            except (TypeError, ValueError):
                raise RecordError(f"enum {body[0]!r} is not in schema {self.schema.name}") from None
        if tag == "a" and isinstance(body, list) and len(body) == 3:
            dt = _dtype(body[0])
            try:
                shape = tuple(int(d) for d in body[1])
                raw = base64.b64decode(body[2], validate=True)
                return np.frombuffer(raw, dtype=dt).reshape(shape).copy()
            except (TypeError, ValueError):
                raise RecordError("malformed array") from None
        if tag == "n" and isinstance(body, list) and len(body) == 2:
            dt = _dtype(body[0])
            try:
                return dt.type(float(body[1]) if isinstance(body[1], str) else body[1])
            except (TypeError, ValueError, OverflowError):
                raise RecordError("malformed scalar") from None
        raise RecordError(f"unknown value tag {tag!r}")


def _hashable(k):
    hash(k)  # a list key (malformed) raises TypeError here
    return k


def _dtype_text(dt: np.dtype) -> str:
    if dt.kind not in _ARRAY_KINDS:
        raise RecordError(f"arrays of dtype {dt} are not data")
    return dt.str


def _dtype(text) -> np.dtype:
    try:
        dt = np.dtype(str(text))
    except TypeError:
        raise RecordError(f"unknown dtype {text!r}") from None
    if dt.kind not in _ARRAY_KINDS:
        raise RecordError(f"arrays of dtype {dt} are not data")
    return dt
