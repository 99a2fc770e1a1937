"""A user's argument of the wrong value (a loss's reduction, a schedule's step count) is a
located error naming this file and line, and a ValueError as in JAX and optax; never a bare
traceback from inside the package."""

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.errors import DlvmError


def _raised_here(excinfo, line: int) -> None:
    err = excinfo.value
    assert isinstance(err, DlvmError) and isinstance(err, ValueError)
    assert f"{__file__}:{line}:" in str(err)


def test_a_loss_reduction_it_does_not_take_names_the_users_line():
    x = np.ones((3, 2), np.float32)
    with pytest.raises(ValueError) as excinfo:
        line = _line() + 1
        dq.losses.mse(x, x, reduction="avg")
    _raised_here(excinfo, line)
    assert "reduction must be 'mean', 'sum' or 'none', not 'avg'" in str(excinfo.value)


def test_a_cosine_schedule_without_steps_names_the_users_line():
    with pytest.raises(ValueError) as excinfo:
        line = _line() + 1
        dq.optim.cosine_decay_schedule(0.1, 0)
    _raised_here(excinfo, line)
    assert "decay_steps must be positive, not 0" in str(excinfo.value)


def _line() -> int:
    import sys

    return sys._getframe(1).f_lineno
