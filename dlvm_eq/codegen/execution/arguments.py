"""What a compiled function accepts for a parameter declared with a dtype: no silent casts.

- An array (numpy, or CuPy on the GPU) of the declared dtype: as it is.
- An array of another dtype: a `DlvmError` naming the argument, the declared and the given
  dtype; `dq.compile(..., cast=True)` casts it instead (numpy's `astype`). Complex and object
  arrays are never cast: no declared dtype holds them.
- Python numbers (and lists of them) are weakly typed, as in JAX: they take the declared dtype
  where their kind fits (a float for f32/f64, an int for any number type, a bool for bool), so
  `f(x, 0.5)` works for an f32 scalar parameter; an int too large for i32, a float for i32 or
  bool, a number for bool are errors (or casts with cast=True).

    check_argument("f", 0, "x", np.zeros(3), (3,), np.dtype("float32"), cast=False)
    # DlvmError: @f: argument 0 (%x) is float64, declared f32; ...
"""

from __future__ import annotations

import numpy as np

from ...errors import DlvmError
from ...ir.types import DType

# Python numbers: which declared kinds each may stand for without a cast
_WEAK = {"f": "f", "i": "fi", "u": "fi", "b": "b"}


def check_argument(
    func: str,
    i: int,
    name: str,
    a,
    shape,
    dt: np.dtype,
    cast: bool,
    hint: str = "compile with cast=True",
):
    """`a` as an array of dtype `dt` (numpy, or the array itself when it has a dtype
    already, e.g. CuPy), or a DlvmError saying why not (`hint`: how to ask for a cast).
    Shapes are checked by the caller."""
    declared = _ir_name(dt)
    where = f"@{func}: argument {i} (%{name})"
    given = getattr(a, "dtype", None)
    weak = given is None
    if weak:
        if isinstance(a, complex) or (isinstance(a, (list, tuple)) and _has_complex(a)):
            raise DlvmError(
                f"{where} is a complex number; declared {declared}: complex values are never cast"
            )
        try:
            arr = np.asarray(a)
        except (ValueError, TypeError) as e:
            raise DlvmError(
                f"{where} is not an array ({type(a).__name__}: {e}); declared {declared}"
            ) from None
        given = arr.dtype
    else:
        arr = a
    given = np.dtype(given)
    if given == dt:
        return arr
    if given.kind in "cOVSUM":
        raise DlvmError(
            f"{where} is a {given} array; declared {declared}: "
            f"{'complex' if given.kind == 'c' else 'non-numeric'} arrays are never cast"
        )
    if weak and dt.kind in _WEAK.get(given.kind, ""):
        if (
            dt.kind == "i"
            and arr.size
            and not (np.iinfo(dt).min <= arr.min() and arr.max() <= np.iinfo(dt).max)
        ):
            if not cast:
                raise DlvmError(f"{where}: the Python int {_short(a)} does not fit {declared}")
        return arr.astype(dt)
    if cast:
        return arr.astype(dt)
    what = f"a Python {type(a).__name__}" if weak else f"{given}"
    raise DlvmError(
        f"{where} is {what}, declared {declared}; pass a {declared} array "
        f"(x.astype(np.{dt.name})) or {hint}"
    )


def argument_shape_error(func: str, i: int, a, shape, dtype) -> DlvmError:
    """The error for argument i of @func whose shape is not the declared one."""
    got = getattr(a, "shape", None)
    return DlvmError(f"@{func}: argument {i} has shape {got}, expected {shape} ({dtype})")


def _ir_name(dt: np.dtype) -> str:
    """The IR's name of a numpy dtype ("f32"; exactly, not DType.from_numpy's nearest kind),
    numpy's where the IR has none."""
    return next((str(d) for d in DType if d.numpy == dt), str(dt))


def _has_complex(a) -> bool:
    stack = [a]
    while stack:
        v = stack.pop()
        if isinstance(v, complex):
            return True
        if isinstance(v, (list, tuple)):
            stack.extend(v)
    return False


def _short(a) -> str:
    text = repr(a)
    return text if len(text) <= 40 else text[:37] + "..."
