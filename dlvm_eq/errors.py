"""The project's own errors: everything a user can cause derives from DlvmError."""

from __future__ import annotations


class DlvmError(Exception):
    """Base class of every error a user can cause (bad IR, bad shapes, bad rules, bad flags)."""


class SourceError(DlvmError):
    """An error at a place in a source file: file:line:col, the line, a caret, what was expected."""

    def __init__(
        self,
        message: str,
        filename: str = "<string>",
        line: int | None = None,
        column: int | None = None,
        source_line: str | None = None,
    ):
        self.message, self.filename, self.line, self.column = message, filename, line, column
        self.source_line = source_line
        super().__init__(self._render())

    def _render(self) -> str:
        if self.line is None:
            return f"{self.filename}: {self.message}"
        where = f"{self.filename}:{self.line}:{self.column or 1}"
        text = f"{where}: error: {self.message}"
        if self.source_line is not None:
            caret = " " * max((self.column or 1) - 1, 0) + "^"
            text += f"\n    {self.source_line.rstrip()}\n    {caret}"
        return text


class IRError(DlvmError):
    """An ill-typed or ill-formed IR program (raised by the verifier and the builders)."""


class ShapeError(DlvmError):
    """A shape or dtype mismatch found while tracing a Python function or building IR."""

    location: tuple[str, int, int] | None  # the user's line, set where the error is made
