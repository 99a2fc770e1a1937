"""SSA IR: Module -> Function -> Instruction, values with types.

b = FunctionBuilder("f", [tensor(2, 3, F32)])
(x,) = b.params
y = b.emit("exp", [x])
f = b.finish(y)          # func @f: (<2 x 3 x f32>) -> <2 x 3 x f32>
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import field
from typing import Any

import numpy as np

from ..errors import IRError
from ..records import dataclass
from .ops import OPS, lookup
from .types import DType, TensorType, TupleType, Type


class Value:
    """An SSA value: a function parameter or an instruction's result. Identity is the object."""

    __slots__ = ("name", "type")

    def __init__(self, name: str, type: Type):
        self.name, self.type = name, type

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"

    @property
    def tensor_type(self) -> TensorType:
        """The type of a value that must be a tensor (a call's or loop's tuple result is not)."""
        if isinstance(self.type, TupleType):
            raise IRError(f"%{self.name} is the tuple {self.type} where a tensor belongs")
        return self.type


@dataclass(frozen=True)
class Const:
    """A scalar literal operand, `1: f32` in DLVM (broadcast like any scalar)."""

    value: float | int | bool
    type: TensorType

    @property
    def tensor_type(self) -> TensorType:
        return self.type

    @staticmethod
    def of(value, dtype: DType) -> Const:
        v = np.asarray(value, dtype=dtype.numpy)[()]
        return Const(v.item(), TensorType((), dtype))


Operand = Value | Const


@dataclass
class Instruction:
    """One IR instruction: `%result = op operands attrs`, with where it was written."""

    result: Value
    op: str
    operands: list[Operand]
    attrs: dict[str, Any] = field(default_factory=dict)
    location: tuple[str, int, int] | None = None  # (file, line, col) where it was written

    @property
    def spec(self):
        return OPS[self.op]


@dataclass
class AdjointDecl:
    """`[adjoint @f from i wrt 1, 2 keeping 0 seedable]`: the function's body is synthesized."""

    of: str
    from_index: int | None = None
    wrt: tuple[int, ...] | None = None  # parameter indices; None = all
    keeping: tuple[int, ...] | None = None  # original outputs also returned
    seedable: bool = False


@dataclass
class Function:
    """An IR function: parameters, result type, body and returned operand (or a declared adjoint)."""

    name: str
    params: list[Value]
    result_type: Type
    body: list[Instruction] = field(default_factory=list)
    ret: Operand | None = None  # None only for declared adjoints before synthesis
    adjoint: AdjointDecl | None = None
    location: tuple[str, int, int] | None = None

    @property
    def param_types(self) -> list[Type]:
        return [p.type for p in self.params]

    @property
    def is_declaration(self) -> bool:
        return self.ret is None

    def instructions(self) -> Iterator[Instruction]:
        return iter(self.body)

    def __str__(self) -> str:
        from .printer import print_function

        return print_function(self)


@dataclass
class Module:
    """A named set of IR functions at one stage of the pipeline (raw, optimized, ...)."""

    name: str = "main"
    stage: str = "raw"
    functions: dict[str, Function] = field(default_factory=dict)

    def add(self, fn: Function) -> Function:
        if fn.name in self.functions:
            raise IRError(f"function @{fn.name} is defined twice")
        self.functions[fn.name] = fn
        return fn

    def __getitem__(self, name: str) -> Function:
        try:
            return self.functions[name.lstrip("@")]
        except KeyError:
            known = ", ".join("@" + n for n in self.functions) or "none"
            raise IRError(
                f'no function @{name.lstrip("@")} in module "{self.name}" (functions: {known})'
            ) from None

    def __contains__(self, name: str) -> bool:
        return name.lstrip("@") in self.functions

    def __str__(self) -> str:
        from .printer import print_module

        return print_module(self)


def operand_type(x: Operand) -> Type:
    return x.type


class FunctionBuilder:
    """Builds a function instruction by instruction; each `emit` type-checks via the op table."""

    def __init__(self, name: str, param_types: list[Type], param_names: list[str] | None = None):
        names = param_names or [f"arg{i}" for i in range(len(param_types))]
        self.name = name
        self.params = [Value(n, t) for n, t in zip(names, param_types)]
        self.body: list[Instruction] = []
        self._used = set(names)
        self._counter = 0

    def fresh(self, hint: str | None = None) -> str:
        if hint and hint not in self._used:
            self._used.add(hint)
            return hint
        while str(self._counter) in self._used:
            self._counter += 1
        name = str(self._counter)
        self._used.add(name)
        self._counter += 1
        return name

    def emit(
        self, op: str, operands: list[Operand], name: str | None = None, location=None, **attrs
    ) -> Value:
        spec = lookup(op)
        if spec.arity is not None and len(operands) != spec.arity:
            raise IRError(f"{op}: expected {spec.arity} operands, got {len(operands)}")
        rtype = spec.result_type([operand_type(o) for o in operands], attrs)
        result = Value(self.fresh(name), rtype)
        self.body.append(Instruction(result, op, list(operands), dict(attrs), location))
        return result

    def const(self, value, dtype: DType) -> Const:
        return Const.of(value, dtype)

    def finish(self, ret: Operand | list[Operand]) -> Function:
        if isinstance(ret, (list, tuple)):
            ret = self.emit("tuple", list(ret))
        return Function(self.name, self.params, ret.type, self.body, ret)
