"""The lowering's op vocabulary agrees with the op table (codegen/llvm/vocabulary.py): an
elementwise op added to ir/ops.py without a lowering, or a lowering for an op the table lacks,
or a dtype the kernels accept that the lowering does not handle, is reported."""

from __future__ import annotations

import dataclasses

from dlvm_eq.codegen.kernels import spec as kernel_spec
from dlvm_eq.codegen.llvm import lower_expr
from dlvm_eq.codegen.llvm.vocabulary import lowering_gaps
from dlvm_eq.ir import ops


def test_the_lowering_covers_exactly_the_op_tables_elementwise_ops():
    assert lowering_gaps() == []


def test_an_op_added_to_the_table_alone_is_reported(monkeypatch):
    monkeypatch.setitem(
        ops.OPS, "cbrt", dataclasses.replace(ops.OPS["exp"], name="cbrt", egg="Cbrt")
    )
    gaps = lowering_gaps()
    assert "unary op 'cbrt' of the op table has no lowering" in gaps
    assert "op 'cbrt' of the op table is not a kernel op" in gaps


def test_a_lowering_of_an_op_the_table_lacks_is_reported(monkeypatch):
    monkeypatch.setitem(lower_expr.UNARY_LOWER, "cbrt", lower_expr.UNARY_LOWER["exp"])
    assert lowering_gaps() == ["the lowering names unary op 'cbrt', which the op table lacks"]


def test_binary_lowerings_are_the_registrys_formulas_per_dtype():
    lowered = lower_expr.binary_lowered()
    assert {"add", "div", "pow", "min", "lt", "ne"} <= lowered["float"]
    assert {"add", "div", "xor", "shiftLeft", "lt"} <= lowered["i32"] and "pow" not in lowered[
        "i32"
    ]
    assert lowered["bool"] == {"and", "or", "eq", "ne", "lt", "le", "gt", "ge"}
    assert "xor" not in lowered["float"] and "and" not in lowered["float"]


def test_a_dtype_the_kernels_accept_but_the_lowering_lacks_is_reported(monkeypatch):
    def floats_only(e, a, b, dt):  # a registry formula that lowers division of floats alone
        if dt == "i32":
            raise kernel_spec.KernelError("div: floats only")
        return e.fdiv(a, b)

    monkeypatch.setitem(lower_expr.BINARY_LOWER, "div", floats_only)
    lower_expr.binary_lowered.cache_clear()
    try:
        assert lowering_gaps() == ["binary op 'div' is accepted on i32 but not lowered for it"]
    finally:
        monkeypatch.undo()
        lower_expr.binary_lowered.cache_clear()
    monkeypatch.undo()
    monkeypatch.setitem(kernel_spec.UNARY_OPS, "exp", kernel_spec.UNARY_OPS["exp"] + ("i32",))
    assert lowering_gaps() == ["unary op 'exp' is accepted on i32 but lowered for floats only"]
