"""Errors of the extraction package.

One class, so that the lead can re-parent it onto ``dlvm_eq.DlvmError`` by editing one line.
"""
from __future__ import annotations


class ExtractionError(Exception):
    """A serialized e-graph, a root, a cost or a choice that extraction cannot use.

    >>> raise ExtractionError("e-class 'Math-4' has no extractable e-node")
    Traceback (most recent call last):
    dlvm_eq.extract.errors.ExtractionError: e-class 'Math-4' has no extractable e-node
    """
