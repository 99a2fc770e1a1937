"""Random well-typed IR programs for property tests (hypothesis), shared by every test suite.

    from hypothesis import given, strategies as st
    from ir_programs import functions, random_function, random_inputs

    @given(functions(n_ops=10))                  # a strategy of Functions
    def test_something(fn): ...

    @st.composite
    def programs(draw):                          # or inside your own composite strategy
        return random_function(draw, n_ops=30, kinds=("binary", "reduce"))

    args = random_inputs(fn, np.random.default_rng(0))   # one array per parameter

Programs mix elementwise ops (with numpy broadcasting: scalars, (1,n) vs (m,1), rank extension,
scalar literal operands), reductions, dot, transposes, layout ops, casts, compare/logic and
select. Operand shapes are made to fit: an op takes existing values where one fits and new
parameters otherwise. With `safe=True` (default) operands of ops with a restricted domain are
guarded (log(|x| + 1), exp(tanh x), ...; see GUARDS) so results are finite for inputs ~ N(0, 1),
which is what differential tests need. Which ops exist is read from the op table: a new op of
an elementwise kind is generated without changes here.
"""

from __future__ import annotations

import math
from itertools import permutations

import numpy as np
from hypothesis import strategies as st

from dlvm_eq.ir import Const, Function, Instruction, Module, Value
from dlvm_eq.ir.ops import (
    BINARY,
    BIT_OPS,
    CAST,
    COMPARE,
    DOT,
    LAYOUT,
    LITERAL,
    LOGIC,
    OPS,
    REDUCE,
    REDUCE_COMBINATORS,
    SELECT,
    SLICE,
    UNARY,
)
from dlvm_eq.ir.sample import sample_array
from dlvm_eq.ir.types import BOOL, F32, F64, I32, DType, TensorType, broadcast_shapes
from dlvm_eq.ir.verifier import verify_function

DEFAULT_KINDS = (UNARY, BINARY, COMPARE, LOGIC, SELECT, REDUCE, DOT, LAYOUT, SLICE, CAST, LITERAL)

# op -> operand guards: "positive" makes x into |x| + 1, "bounded" into tanh(x) (safe=True only)
GUARDS: dict[str, tuple[str | None, ...]] = {
    "log": ("positive",),
    "sqrt": ("positive",),
    "rsqrt": ("positive",),
    "log1p": ("positive",),
    "exp": ("bounded",),
    "expm1": ("bounded",),
    "sinh": ("bounded",),
    "cosh": ("bounded",),
    "tan": ("bounded",),
    "divide": (None, "positive"),
    "power": ("positive", "bounded"),
}

REDUCE_IDENTITY = {"add": 0.0, "multiply": 1.0, "max": -math.inf, "min": math.inf}


def random_function(
    draw,
    n_ops: int = 20,
    *,
    name: str = "f",
    dtype: DType = F32,
    kinds=DEFAULT_KINDS,
    max_rank: int = 3,
    max_dim: int = 4,
    safe: bool = True,
    tuple_result: bool | None = None,
) -> Function:
    """A random well-typed function of about `n_ops` instructions (guards add a few).

    dtype: the element type of the parameters (F32, F64 or I32; I32 uses only integer ops).
    kinds: op kinds to draw from (ops.UNARY, ops.REDUCE, ...). tuple_result: None = draw it.
    """
    gen = _Generator(draw, dtype, tuple(kinds), max_rank, max_dim, safe)
    gen.new_param(gen.draw_shape())
    for _ in range(n_ops):
        gen.step()
    ret = gen.result(tuple_result)
    used = {id(o) for inst in gen.body for o in inst.operands}
    params = [p for p in gen.params if id(p) in used]  # an op may have passed over the first one
    fn = Function(name, params, ret.type, gen.body, ret)
    verify_function(fn)
    return fn


def random_module(draw, n_ops: int = 20, **kwargs) -> Module:
    """A module holding one random function (named kwargs.get("name", "f"))."""
    fn = random_function(draw, n_ops, **kwargs)
    m = Module("random")
    m.add(fn)
    return m


functions = st.composite(random_function)  # functions(n_ops=10, kinds=...) -> strategy
modules = st.composite(random_module)


def random_inputs(
    fn: Function, rng: np.random.Generator, float64: bool = False
) -> list[np.ndarray]:
    """One array per parameter: floats ~ N(0, 1), i32 in [-5, 5], random bools."""
    out = []
    for p in fn.params:
        a = sample_array(p.type, rng)
        out.append(a.astype(np.float64) if float64 and p.type.dtype.is_float else a)
    return out


# ---------------------------------------------------------------- the generator


class _Generator:
    def __init__(
        self, draw, dtype: DType, kinds: tuple[str, ...], max_rank: int, max_dim: int, safe: bool
    ):
        self.draw, self.dtype, self.max_rank, self.max_dim, self.safe = (
            draw,
            dtype,
            max_rank,
            max_dim,
            safe,
        )
        self.params: list[Value] = []
        self.body: list[Instruction] = []
        self.values: list[Value] = []  # tensor values usable as operands
        self.n = 0
        self.ops: dict[str, list[str]] = {}
        for kind in kinds:
            names = [
                n
                for n, s in OPS.items()
                if s.kind == kind
                and n in self._supported(kind)
                and (dtype.is_float or not s.float_only)
                and n not in BIT_OPS  # i32 words only, tested in test_random.py
            ]
            if names:
                self.ops[kind] = sorted(names)
        if not self.ops:
            raise ValueError(f"no ops of kinds {kinds} can be generated")

    def _supported(self, kind: str) -> set[str]:
        if kind in (UNARY, BINARY, COMPARE, LOGIC, SELECT):
            return set(OPS)
        return set(_BUILDERS)

    # -- values
    def draw_shape(self, min_rank: int = 0) -> tuple[int, ...]:
        rank = self.draw(st.integers(min_rank, self.max_rank))
        return tuple(self.draw(st.integers(1, self.max_dim)) for _ in range(rank))

    def new_param(self, shape, dtype: DType | None = None) -> Value:
        v = Value(f"x{len(self.params)}", TensorType(tuple(shape), dtype or self.dtype))
        self.params.append(v)
        self.values.append(v)
        return v

    def emit(self, op: str, operands: list, **attrs) -> Value:
        t = OPS[op].result_type([o.type for o in operands], attrs)
        v = Value(str(self.n), t)
        self.n += 1
        self.body.append(Instruction(v, op, list(operands), attrs))
        if isinstance(t, TensorType):
            self.values.append(v)
        return v

    def pick(self, dtype: DType | None = None, where=lambda t: True) -> Value | None:
        dtype = dtype or self.dtype
        fits = [v for v in self.values if v.type.dtype == dtype and where(v.type)]
        if not fits:
            return None
        # prefer recent values so that programs are deep rather than wide
        recent = fits[-4:]
        return self.draw(st.sampled_from(recent if self.draw(st.booleans()) else fits))

    def value(self, shape, dtype: DType | None = None, allow_const: bool = True):
        """An operand of exactly `shape`: an existing value, a scalar literal or a new parameter."""
        dtype = dtype or self.dtype
        shape = tuple(shape)
        if shape == () and allow_const and self.draw(st.integers(0, 2)) == 0:
            return self.const(dtype)
        same = [v for v in self.values if v.type == TensorType(shape, dtype)]
        if same and self.draw(st.booleans()):
            return self.draw(st.sampled_from(same))
        return self.new_param(shape, dtype)

    def const(self, dtype: DType) -> Const:
        if dtype is BOOL:
            return Const.of(self.draw(st.booleans()), BOOL)
        if dtype is I32:
            return Const.of(self.draw(st.integers(-4, 4)), I32)
        return Const.of(self.draw(st.floats(-3, 3, allow_nan=False, width=32)), dtype)

    def partner_shape(self, shape: tuple[int, ...], grow: bool = True) -> tuple[int, ...]:
        """A shape that broadcasts with `shape`: same, some dims 1, a suffix, scalar, or (if
        `grow`) with more leading dims."""
        how = self.draw(st.sampled_from(["same", "ones", "suffix", "scalar"] + ["extend"] * grow))
        if how == "same":
            return shape
        if how == "ones":
            return tuple(1 if self.draw(st.booleans()) else d for d in shape)
        if how == "suffix":
            return shape[self.draw(st.integers(0, len(shape))) :]
        if how == "scalar":
            return ()
        extra = self.draw(st.integers(0, max(0, self.max_rank - len(shape))))
        return tuple(self.draw(st.integers(1, self.max_dim)) for _ in range(extra)) + shape

    def guard(self, op: str, operands: list) -> list:
        if not self.safe or op not in GUARDS:
            return operands
        out = []
        for o, g in zip(operands, GUARDS[op] + (None,) * len(operands)):
            if g is None or not o.type.dtype.is_float:
                out.append(o)
            elif g == "positive":
                out.append(self.emit("add", [self.emit("abs", [o]), Const.of(1.0, o.type.dtype)]))
            else:
                out.append(self.emit("tanh", [o]))
        return out

    def main_value(self) -> Value:
        """A value of the function's dtype (a new parameter when there is none)."""
        v = self.pick()
        return v if v is not None else self.new_param(self.draw_shape())

    # -- one step
    def step(self) -> None:
        kind = self.draw(st.sampled_from(sorted(self.ops)))
        op = self.draw(st.sampled_from(self.ops[kind]))
        if kind in _BY_KIND:
            _BY_KIND[kind](self, op)
        else:
            _BUILDERS[op](self, op)

    def result(self, tuple_result: bool | None) -> Value:
        mine = [v for v in self.values if v.type.dtype == self.dtype and v not in self.params]
        last = (
            mine[-1]
            if mine
            else self.emit("negate" if self.dtype is not BOOL else "not", [self.params[0]])
        )
        if tuple_result is None:
            tuple_result = self.draw(st.integers(0, 3)) == 0
        others = [v for v in self.values if v is not last and v not in self.params]
        if not tuple_result or not others:
            return last
        extra = self.draw(st.lists(st.sampled_from(others), min_size=1, max_size=2, unique_by=id))
        return self.emit("tuple", [last] + extra)


# ---------------------------------------------------------------- per kind / per op


def _unary(g: _Generator, op: str) -> None:
    x = g.main_value()
    g.emit(op, g.guard(op, [x]))


def _binary_operands(g: _Generator, dtype: DType | None = None) -> list:
    a = g.pick(dtype) if dtype else g.main_value()
    if a is None:
        a = g.new_param(g.draw_shape(), dtype)
    b = g.value(g.partner_shape(a.type.shape), a.type.dtype)
    return [a, b] if g.draw(st.booleans()) else [b, a]


def _binary(g: _Generator, op: str) -> None:
    g.emit(op, g.guard(op, _binary_operands(g)))


def _compare(g: _Generator, op: str) -> Value:
    return g.emit(op, _binary_operands(g))


def _mask(g: _Generator, shape) -> Value:
    """A bool value that broadcasts to `shape`: an existing one or a new comparison."""
    m = g.pick(BOOL, lambda t: broadcast_shapes(t.shape, shape) == shape)
    if m is None or g.draw(st.booleans()):
        a = g.value(shape, allow_const=False)
        compare = g.draw(st.sampled_from(g.ops.get(COMPARE, ["greaterThan"])))
        m = g.emit(compare, [a, g.value(g.partner_shape(shape, grow=False))])
    return m


def _logic(g: _Generator, op: str) -> None:
    a = _mask(g, g.main_value().type.shape)
    if OPS[op].arity == 1:
        g.emit(op, [a])
        return
    b = g.value(g.partner_shape(a.type.shape), BOOL)
    g.emit(op, [a, b] if g.draw(st.booleans()) else [b, a])


def _select(g: _Generator, op: str) -> None:
    a, b = _binary_operands(g)
    shape = broadcast_shapes(a.type.shape, b.type.shape)
    g.emit(op, [a, b, _mask(g, shape)])


def _reduce(g: _Generator, op: str) -> None:
    x = g.pick(where=lambda t: t.rank >= 1) or g.new_param(g.draw_shape(min_rank=1))
    axes = g.draw(st.lists(st.integers(0, x.type.rank - 1), min_size=1, unique=True))
    comb = g.draw(st.sampled_from(sorted(REDUCE_COMBINATORS)))
    init = REDUCE_IDENTITY[comb] if g.draw(st.booleans()) else g.const(x.type.dtype).value
    if x.type.dtype is I32 and math.isinf(init):
        init = {"max": -(2**31), "min": 2**31 - 1}[comb]
    init = Const.of(init, x.type.dtype).value
    g.emit(
        op,
        [x],
        combinator=comb,
        init=init,
        axes=tuple(sorted(axes) if g.draw(st.booleans()) else axes),
    )


def _dot(g: _Generator, op: str) -> None:
    a = g.pick(where=lambda t: t.rank in (1, 2))
    if a is None:
        a = g.new_param(
            tuple(g.draw(st.integers(1, g.max_dim)) for _ in range(g.draw(st.integers(1, 2))))
        )
    k = a.type.shape[-1]
    b_shape = (k,) if g.draw(st.booleans()) else (k, g.draw(st.integers(1, g.max_dim)))
    b = g.value(b_shape, allow_const=False)
    g.emit(op, [a, b])


def _transpose(g: _Generator, op: str) -> None:
    x = g.main_value()
    if g.draw(st.booleans()) or x.type.rank < 2:
        g.emit(op, [x])
    else:
        g.emit(op, [x], perm=g.draw(st.sampled_from(list(permutations(range(x.type.rank))))))


def _shape_cast(g: _Generator, op: str) -> None:
    x = g.main_value()
    factors = _prime_factors(x.type.size)
    rank = g.draw(st.integers(0 if not factors else 1, g.max_rank))
    dims = [1] * rank
    for f in factors:
        dims[g.draw(st.integers(0, rank - 1))] *= f
    g.emit(op, [x], shape=tuple(dims))


def _pad_shape(g: _Generator, op: str) -> None:
    x = g.pick(where=lambda t: t.rank < g.max_rank + 1) or g.new_param(g.draw_shape())
    g.emit(op, [x], at=g.draw(st.integers(0, x.type.rank)))


def _squeeze_shape(g: _Generator, op: str) -> None:
    x = g.pick(where=lambda t: 1 in t.shape)
    if x is None:
        x = g.emit("padShape", [g.main_value()], at=0)
    at = g.draw(st.sampled_from([i for i, d in enumerate(x.type.shape) if d == 1]))
    g.emit(op, [x], at=at)


def _broadcast(g: _Generator, op: str) -> None:
    x = g.main_value()
    extra = g.draw(st.integers(0, max(0, g.max_rank - x.type.rank)))
    lead = tuple(g.draw(st.integers(1, g.max_dim)) for _ in range(extra))
    shape = lead + tuple(g.draw(st.integers(1, g.max_dim)) if d == 1 else d for d in x.type.shape)
    g.emit(op, [x], shape=shape)


def _concatenate(g: _Generator, op: str) -> None:
    x = g.pick(where=lambda t: t.rank >= 1) or g.new_param(g.draw_shape(min_rank=1))
    axis = g.draw(st.integers(0, x.type.rank - 1))
    parts = [x]
    for _ in range(g.draw(st.integers(1, 2))):
        shape = list(x.type.shape)
        shape[axis] = g.draw(st.integers(1, g.max_dim))
        parts.append(x if g.draw(st.integers(0, 3)) == 0 else g.value(shape, allow_const=False))
    g.emit(op, parts, axis=axis)


def _slice(g: _Generator, op: str) -> None:
    # an axis longer than 1 (so that the slice drops something); may slice the last value again
    x = g.pick(where=lambda t: any(d > 1 for d in t.shape)) or g.new_param(
        (g.draw(st.integers(2, max(2, g.max_dim))),) + g.draw_shape()[1:]
    )
    axis = g.draw(st.sampled_from([i for i, d in enumerate(x.type.shape) if d > 1]))
    n = x.type.shape[axis]
    lo = g.draw(st.integers(0, n - 1))
    hi = g.draw(st.integers(lo + 1, n))
    g.emit(op, [x], axis=axis, lo=lo, hi=hi)


def _data_type_cast(g: _Generator, op: str) -> None:
    x = g.main_value()
    bools = g.pick(BOOL)
    if bools is not None and g.draw(st.booleans()):
        g.emit(op, [bools], dtype=g.dtype)
        return
    # through i32 only when unguarded: float -> int of inf/nan is undefined in LLVM
    choices = (F32, F64) if g.safe else (F32, F64, I32)
    other = g.draw(st.sampled_from([d for d in choices if d != g.dtype]))
    g.emit(op, [g.emit(op, [x], dtype=other)], dtype=g.dtype)


def _literal(g: _Generator, op: str) -> None:
    shape = g.main_value().type.shape if g.draw(st.booleans()) else g.draw_shape()
    t = TensorType(shape, g.dtype)
    if g.draw(st.booleans()) and 0 < t.size <= 16 and shape:
        values = [g.const(g.dtype).value for _ in range(t.size)]
        value = np.array(values, dtype=g.dtype.numpy).reshape(shape)
    else:
        value = g.const(g.dtype).value
    g.emit(op, [], value=value, type=t)


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


_BY_KIND = {UNARY: _unary, BINARY: _binary, COMPARE: _compare, LOGIC: _logic, SELECT: _select}
_BUILDERS = {
    "reduce": _reduce,
    "dot": _dot,
    "transpose": _transpose,
    "shapeCast": _shape_cast,
    "padShape": _pad_shape,
    "squeezeShape": _squeeze_shape,
    "broadcast": _broadcast,
    "concatenate": _concatenate,
    "slice": _slice,
    "dataTypeCast": _data_type_cast,
    "literal": _literal,
}
