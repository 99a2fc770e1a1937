"""Errors of the extraction package.

A user can cause these (a malformed e-graph file, a bad cost model), so they are DlvmErrors.
"""

from __future__ import annotations

from ..errors import DlvmError


class ExtractionError(DlvmError):
    """A serialized e-graph, a root, a cost or a choice that extraction cannot use.

    >>> raise ExtractionError("e-class 'Math-4' has no extractable e-node")
    Traceback (most recent call last):
    dlvm_eq.extract.extraction_error.ExtractionError: e-class 'Math-4' has no extractable e-node
    """
