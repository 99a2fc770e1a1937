"""The IR: types, the op table, SSA modules, the verifier, printer, parser and interpreter."""

from .interp import interpret, run_function
from .module import (
    AdjointDecl,
    Const,
    Function,
    FunctionBuilder,
    Instruction,
    Module,
    Operand,
    Value,
)
from .ops import OPS, OpSpec, lookup
from .printer import print_function, print_module
from .types import (
    BOOL,
    F32,
    F64,
    I32,
    DType,
    TensorType,
    TupleType,
    Type,
    broadcast_shapes,
    scalar,
    tensor,
)
from .verifier import verify, verify_function

__all__ = [
    "AdjointDecl",
    "BOOL",
    "Const",
    "DType",
    "F32",
    "F64",
    "Function",
    "FunctionBuilder",
    "I32",
    "Instruction",
    "Module",
    "OPS",
    "OpSpec",
    "Operand",
    "TensorType",
    "TupleType",
    "Type",
    "Value",
    "broadcast_shapes",
    "interpret",
    "lookup",
    "print_function",
    "print_module",
    "run_function",
    "scalar",
    "tensor",
    "verify",
    "verify_function",
]
