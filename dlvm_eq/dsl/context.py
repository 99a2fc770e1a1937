"""The trace context: which function is being built, and where in the user's code we are.

A `Trace` owns one `FunctionBuilder`. Traces nest (tracing `dq.grad(f)` inside `dq.jit(g)`
traces `f` in an inner trace); the innermost one is current. Every emitted instruction gets
the (file, line, col) of the first stack frame outside the dlvm_eq package, and so does every
`ShapeError`:

    with Trace(FunctionBuilder("f", [tensor(3, F32)])) as t:
        ...                       # dsl ops emit into t.builder
"""

from __future__ import annotations

import contextvars
import functools
import linecache
import os
import sys
from types import FrameType

from ..errors import DlvmError, ShapeError
from ..ir.module import FunctionBuilder, Value

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_inside_cache: dict[str, bool] = {}

# The traces being built, innermost last: per thread and per asyncio task (a context
# variable holding a tuple, so that no two threads ever share or mutate one stack)
_STACK: contextvars.ContextVar[tuple] = contextvars.ContextVar("dlvm_eq_traces", default=())


class TracingError(DlvmError):
    """A traced value was used where a concrete one is needed (Python `if`, `float(x)`, ...),
    or a traced value escaped the trace that made it."""


def _inside_package(filename: str) -> bool:
    hit = _inside_cache.get(filename)
    if hit is None:
        hit = _inside_cache[filename] = os.path.abspath(filename).startswith(_PKG_DIR)
    return hit


def user_location() -> tuple[str, int, int] | None:
    """(file, line, col) of the innermost frame outside dlvm_eq: the user's line (or, inside
    `called_from`, the caller's location it was given: a worker's frames above it are Ray's)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and _inside_package(frame.f_code.co_filename):
        if frame.f_code is _CALLED_FROM:
            return frame.f_locals["location"]
        frame = frame.f_back
    if frame is None:
        return None
    col = 1
    positions = _positions(frame.f_code)
    if frame.f_lasti // 2 < len(positions) and positions[frame.f_lasti // 2][2] is not None:
        col = positions[frame.f_lasti // 2][2] + 1
    return (frame.f_code.co_filename, frame.f_lineno, col)


def called_from(location: tuple[str, int, int] | None, fn, *args):
    """fn(*args), where the code calling it lives in another process (a data-parallel worker
    runs the driver's call): errors and instructions that no frame of fn's own locates (fn is
    a bundled model, say) get `location`, the user's line on the driver, not the worker's."""
    return fn(*args)


_CALLED_FROM = called_from.__code__


@functools.lru_cache(maxsize=512)
def _positions(code) -> tuple:
    """Per-instruction (line, end_line, col, end_col); Python >= 3.11 knows columns."""
    return tuple(code.co_positions()) if hasattr(code, "co_positions") else ()


def located(message: str, loc: tuple[str, int, int] | None = None) -> str:
    """`file:line:col: error: message` plus the source line, as the parser's errors look."""
    loc = loc or user_location()
    if loc is None:
        return message
    text = f"{loc[0]}:{loc[1]}:{loc[2]}: error: {message}"
    source = linecache.getline(loc[0], loc[1])
    if source.strip():
        text += f"\n    {source.strip()}"
    return text


def shape_error(message: str, loc=None) -> ShapeError:
    err = ShapeError(located(message, loc))
    err.location = loc or user_location()
    return err


def tracing_error(message: str) -> TracingError:
    return TracingError(located(message))


class ArgumentError(DlvmError, ValueError):
    """A user's argument with a value the function does not take (a loss's `reduction="avg"`,
    a schedule's non-positive step count): located at the user's line, and a ValueError, as
    JAX and optax raise for the same mistakes."""


def argument_error(message: str) -> ArgumentError:
    return ArgumentError(located(message))


class OperandError(ShapeError):
    """An operand that is no array, number or traced tensor (None, a dict, a string): a
    mistake, not an array of shape (). `value` is the operand, so that the argument handling
    (tree_args.flat_function) can name the argument that held it."""

    value: object


def operand_error(value) -> OperandError:
    err = OperandError(located(f"an operand is {describe(value)}, not an array or a number"))
    err.location, err.value = user_location(), value
    return err


def describe(value) -> str:
    """A short account of a Python value for an error: `None`, `a dict with keys ['w']`."""
    if value is None:
        return "None"
    if isinstance(value, dict):
        return f"a dict with keys {sorted(map(str, value))[:6]}"
    return f"a {type(value).__name__} ({value!r:.40})"


class Trace:
    """One function under construction. `captures` (when allowed) turns values of enclosing
    traces used here into extra trailing parameters (closure conversion)."""

    def __init__(self, builder: FunctionBuilder, allow_captures: bool = False):
        self.builder = builder
        self.parent: Trace | None = None
        self.allow_captures = allow_captures
        self.captured: list = []  # Tensors of the parent trace, in param order
        self._capture_params: dict[int, Value] = {}
        self._literals: dict[tuple, tuple] = {}  # (id(array), dtype) -> (array, Value)
        self.active = False

    def __enter__(self) -> Trace:
        stack = _STACK.get()
        self.parent = stack[-1] if stack else None
        self._token = _STACK.set(stack + (self,))
        self.active = True
        return self

    def __exit__(self, *exc) -> None:
        _STACK.reset(self._token)
        self.active = False

    def capture(self, tensor) -> Value:
        """The value standing for `tensor` (of an enclosing trace) inside this trace."""
        from .tensor import Tensor

        key = id(tensor.value)
        if key in self._capture_params:
            return self._capture_params[key]
        if not self.allow_captures:
            raise tracing_error(
                f"a traced value {tensor.value!r} of an enclosing trace is used inside a nested "
                "trace; pass it as an argument instead of closing over it"
            )
        assert self.parent is not None  # an enclosing trace is active, so this one has a parent
        outer = (
            tensor
            if tensor.trace is self.parent
            else Tensor(self.parent.capture(tensor), self.parent)
        )
        name = tensor.value.name  # the outer value's name reads best (`%w`, not `%capture`)
        param = Value(
            self.builder.fresh(name if name[0].isalpha() else "capture"), tensor.value.type
        )
        self.builder.params.append(param)
        self.captured.append(outer)
        self._capture_params[key] = param
        return param

    def literal(self, array, dtype, loc) -> Value:
        """A `literal` for a concrete array used in the trace, emitted once per array."""
        key = (id(array), dtype)
        hit = self._literals.get(key)
        if hit is None:
            from ..ir.types import TensorType

            value = self.builder.emit(
                "literal",
                [],
                location=loc,
                value=array.astype(dtype.numpy),
                type=TensorType(array.shape, dtype),
            )
            hit = self._literals[key] = (array, value)  # keep the array alive: its id is the key
        return hit[1]


def current_trace() -> Trace | None:
    stack = _STACK.get()
    return stack[-1] if stack else None


def is_tracing() -> bool:
    return bool(_STACK.get())
