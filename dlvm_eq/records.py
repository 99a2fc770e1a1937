"""`dataclass` without a compile per class: the standard decorator's classes (same fields,
`dataclasses.fields`/`replace`/`asdict`, same __init__ signature, repr, eq, hash and frozen
rules), whose methods are made without generating source text.

    from dlvm_eq.records import dataclass

    @dataclass(frozen=True)
    class Slot:
        '''A buffer of the plan.'''
        index: int
        shape: tuple[int, ...] = ()

Why: Python 3.11's `dataclasses.dataclass` compiles the source of __init__, __repr__, __eq__
(and a frozen class's __setattr__, __delattr__ and __hash__) for every class, about 0.4 ms a
class (0.7 frozen), and a warm compile imports some 35 of them (issue 32). Here __init__ is a
template compiled once per (arity, factory fields, frozen, __post_init__) and renamed with
`CodeType.replace` (its argument and attribute names), so its calls cost what the generated
one's do; repr, eq and hash are shared functions over the class's field names.

Anything beyond the plain case (no docstring, order, unsafe_hash, slots, kw_only, init=False
fields, InitVar, a dataclass base, __setattr__ of a frozen class's own) goes to the standard
decorator unchanged (tests/test_records.py checks the two agree).
"""

from __future__ import annotations

import abc
import dataclasses
import operator
import reprlib
import threading
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, overload

if TYPE_CHECKING:  # typing's own from Python 3.11; at run time only type checkers read it
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_):
        return lambda f: f


_PLAIN_OPTIONS = {"init", "repr", "eq", "frozen", "match_args"}
_TEMPLATES: dict[tuple, types.CodeType] = {}  # shape -> __init__ template code (any thread)
_TEMPLATES_LOCK = threading.Lock()


class _Factory:
    """A default_factory in an __init__'s defaults: the template calls it when it is passed."""

    __slots__ = ("make",)

    def __init__(self, make):
        self.make = make

    def __repr__(self) -> str:
        return "<factory>"


_INIT_GLOBALS = {"_Factory": _Factory, "_setattr": object.__setattr__}


_T = TypeVar("_T")


@overload
def dataclass(cls: type[_T], /) -> type[_T]: ...


@overload
def dataclass(
    *,
    init: bool = True,
    repr: bool = True,
    eq: bool = True,
    frozen: bool = False,
    match_args: bool = True,
    order: bool = False,
    unsafe_hash: bool = False,
    kw_only: bool = False,
    slots: bool = False,
) -> Callable[[type[_T]], type[_T]]: ...


@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def dataclass(cls=None, /, **options):
    """`@dataclass` or `@dataclass(frozen=True, eq=False, repr=False, ...)`, as the standard one."""

    def wrap(c):
        return _process(c, options)

    return wrap if cls is None else wrap(cls)


def _process(cls, options: dict):
    if not _plain(cls, options):
        return dataclasses.dataclass(cls, **options)
    init = options.get("init", True)
    want_repr = options.get("repr", True)
    eq = options.get("eq", True)
    frozen = options.get("frozen", False)
    fields = _collect(cls)
    cls.__dataclass_params__ = _params(init, want_repr, eq, frozen)
    names = tuple(f.name for f in fields)
    own = cls.__dict__
    class_hash = own.get("__hash__", dataclasses.MISSING)
    explicit_hash = not (
        class_hash is dataclasses.MISSING or (class_hash is None and "__eq__" in own)
    )
    if init and "__init__" not in own:
        cls.__init__ = _init(cls, fields, frozen)
    if want_repr and "__repr__" not in own:
        cls.__repr__ = _repr(cls, tuple(f.name for f in fields if f.repr))
    compared = tuple(f.name for f in fields if f.compare)
    if eq and "__eq__" not in own:
        cls.__eq__ = _eq(cls, _getter(compared))
    if frozen:
        cls.__setattr__, cls.__delattr__ = _frozen(cls, frozenset(names))
    if eq and not explicit_hash:  # the standard table, unsafe_hash=False
        if frozen:
            hashed = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
            cls.__hash__ = _hash(cls, _getter(hashed))
        else:
            cls.__hash__ = None
    if options.get("match_args", True) and "__match_args__" not in own:
        cls.__match_args__ = tuple(f.name for f in fields if f.init)
    return cls


def _collect(cls) -> list:
    """cls's fields, as the standard decorator makes them (its `_process_class` checks,
    regular expressions on every annotation, were most of a class's remaining cost)."""
    own = cls.__dict__
    annotations = own.get("__annotations__", {})
    fields: dict[str, dataclasses.Field] = {}
    for name, annotation in annotations.items():
        default = own.get(name, dataclasses.MISSING)
        f = (
            default
            if isinstance(default, dataclasses.Field)
            else dataclasses.field(default=default)
        )
        f.name, f.type = name, annotation
        f._field_type = dataclasses._FIELD  # type: ignore[attr-defined]
        if f.kw_only is dataclasses.MISSING:
            f.kw_only = False
        if f.default is not dataclasses.MISSING and f.default.__class__.__hash__ is None:
            raise ValueError(
                f"mutable default {type(f.default)} for field {name} is not allowed:"
                " use default_factory"
            )
        if isinstance(default, dataclasses.Field):  # the class attribute: the default, or none
            if f.default is dataclasses.MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        fields[name] = f
    for name, value in own.items():
        if isinstance(value, dataclasses.Field) and name not in annotations:
            raise TypeError(f"{name!r} is a field but has no type annotation")
    cls.__dataclass_fields__ = fields
    abc.update_abstractmethods(cls)
    return list(fields.values())


def _params(init: bool, repr: bool, eq: bool, frozen: bool):
    make = dataclasses._DataclassParams  # type: ignore[attr-defined]
    try:  # Python 3.10 and 3.11: init, repr, eq, order, unsafe_hash, frozen
        return make(init, repr, eq, False, False, frozen)
    except TypeError:  # from 3.12, and match_args, kw_only, slots, weakref_slot
        return make(init, repr, eq, False, False, frozen, True, False, False, False)


def _plain(cls, options: dict) -> bool:
    """Whether this module makes `cls`'s methods (else the standard decorator does)."""
    if not set(options) <= _PLAIN_OPTIONS or not cls.__dict__.get("__doc__"):
        return False
    if any(hasattr(b, "__dataclass_fields__") for b in cls.__mro__[1:]):
        return False
    if options.get("frozen") and ("__setattr__" in cls.__dict__ or "__delattr__" in cls.__dict__):
        return False
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        text = annotation if isinstance(annotation, str) else repr(annotation)
        if "InitVar" in text or "KW_ONLY" in text or "ClassVar" in text:
            return False
        value = cls.__dict__.get(name)
        if isinstance(value, dataclasses.Field) and (not value.init or value.kw_only is True):
            return False
    return True


def _template(n: int, factories: tuple[bool, ...], frozen: bool, post_init: bool):
    """__init__(self, a0, ...) setting attributes f0, ...: compiled once per shape."""
    key = (n, factories, frozen, post_init)
    code = _TEMPLATES.get(key)
    if code is None:
        lines = [f"def __init__(self{''.join(f', a{i}' for i in range(n))}):"]
        for i in range(n):
            if factories[i]:
                lines.append(f"    if a{i}.__class__ is _Factory: a{i} = a{i}.make()")
            lines.append(f"    _setattr(self, 'f{i}', a{i})" if frozen else f"    self.f{i} = a{i}")
        lines.append("    self.__post_init__()" if post_init else "    pass")
        namespace: dict = {}
        exec("\n".join(lines), dict(_INIT_GLOBALS), namespace)
        code = namespace["__init__"].__code__
        with _TEMPLATES_LOCK:
            code = _TEMPLATES.setdefault(key, code)
    return code


def _init(cls, fields: list, frozen: bool):
    names = [f.name for f in fields]
    if "self" in names:  # the template's first argument
        raise TypeError(f"{cls.__qualname__}: a field named 'self' is not supported here")
    factories = tuple(f.default_factory is not dataclasses.MISSING for f in fields)
    defaults = []
    for f in fields:
        if f.default_factory is not dataclasses.MISSING:
            defaults.append(_Factory(f.default_factory))
        elif f.default is not dataclasses.MISSING:
            defaults.append(f.default)
        elif defaults:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")
    code = _template(len(fields), factories, frozen, hasattr(cls, "__post_init__"))
    rename = {f"a{i}": n for i, n in enumerate(names)} | {f"f{i}": n for i, n in enumerate(names)}
    if frozen:  # attribute names are string constants of _setattr(self, 'f0', a0)
        code = code.replace(co_consts=tuple(rename.get(c, c) for c in code.co_consts))
    code = code.replace(
        co_varnames=tuple(rename.get(v, v) for v in code.co_varnames),
        co_names=tuple(rename.get(v, v) for v in code.co_names),
    )
    if hasattr(code, "co_qualname"):  # Python 3.11: what tracebacks print
        code = code.replace(co_qualname=f"{cls.__qualname__}.__init__")
    fn = types.FunctionType(code, _INIT_GLOBALS, "__init__", tuple(defaults) or None)
    fn.__qualname__ = f"{cls.__qualname__}.__init__"
    fn.__module__ = cls.__module__
    fn.__annotations__ = {f.name: f.type for f in fields} | {"return": None}
    return fn


def _getter(names: tuple[str, ...]):
    """obj -> the tuple of its attributes `names`."""
    if not names:
        return lambda obj: ()
    if len(names) == 1:
        (name,) = names
        return lambda obj: (getattr(obj, name),)
    return operator.attrgetter(*names)


def _repr(cls, names: tuple[str, ...]):
    @reprlib.recursive_repr()
    def __repr__(self):
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
        return f"{self.__class__.__qualname__}({fields})"

    __repr__.__qualname__ = f"{cls.__qualname__}.__repr__"
    return __repr__


def _eq(cls, values):
    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return values(self) == values(other)
        return NotImplemented

    __eq__.__qualname__ = f"{cls.__qualname__}.__eq__"
    return __eq__


def _hash(cls, values):
    def __hash__(self):
        return hash(values(self))

    __hash__.__qualname__ = f"{cls.__qualname__}.__hash__"
    return __hash__


def _frozen(cls, names: frozenset[str]):
    def __setattr__(self, name, value):
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self, name):
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    __setattr__.__qualname__ = f"{cls.__qualname__}.__setattr__"
    __delattr__.__qualname__ = f"{cls.__qualname__}.__delattr__"
    return __setattr__, __delattr__
