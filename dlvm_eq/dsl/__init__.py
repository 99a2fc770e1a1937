"""The staged DSL: Python functions traced on symbolic tensors into DLVM IR (JAX's conventions).

    import dlvm_eq as dq

    def loss(w, x, y):
        return dq.mean(dq.softmax_cross_entropy(x @ w, y))

    print(dq.make_ir(loss)(w, x, y))      # the traced IR
    dq.jit(loss)(w, x, y)                 # traced once per shapes/dtypes, then run
    loss(w, x, y)                         # the same ops also run eagerly on numpy arrays

Files: context (trace stack, user locations), tensor (the symbolic Tensor and its operators),
primitive (bind: dtype promotion, trace-or-eager dispatch), ops (primitive ops), indexing
(x[...] and split: slices), nn (stable
composites), tracing (trace / call_function), api (make_ir, jit, back ends).
"""
from .api import DEFAULT_TARGET, Jitted, jit, make_ir, register_backend
from .conv import avg_pool2d, conv1d, conv2d, max_pool2d
from .context import TracingError, current_trace, is_tracing
from .indexing import split
from .nn import log_softmax, logsumexp, softmax, softmax_cross_entropy
from .ops import (abs, add, astype, ceil, concatenate, cos, cosh, divide, equal, exp, expm1, floor,
                  greater, greater_equal, less, less_equal, log, log1p, logical_and, logical_not,
                  logical_or, matmul, max, maximum, mean, min, minimum, multiply, negative,
                  not_equal, power, relu, reshape, round, rsqrt, sigmoid, sign, sin, sinh, softplus,
                  sqrt, square, subtract, sum, tan, tanh, transpose, where)
from .tensor import Tensor
from .tracing import ShapeDtypeStruct, call_function, spec, trace, trace_closure, type_of

__all__ = [
    # ops
    "avg_pool2d", "conv1d", "conv2d", "max_pool2d",
    "abs", "add", "astype", "ceil", "concatenate", "cos", "cosh", "divide", "equal", "exp",
    "expm1", "floor", "greater", "greater_equal", "less", "less_equal", "log", "log1p",
    "log_softmax", "logical_and", "logical_not", "logical_or", "logsumexp", "matmul", "max",
    "maximum", "mean", "min", "minimum", "multiply", "negative", "not_equal", "power", "relu",
    "reshape", "round", "rsqrt", "sigmoid", "sign", "sin", "sinh", "softmax",
    "softmax_cross_entropy", "softplus", "split", "sqrt", "square", "subtract", "sum", "tan",
    "tanh", "transpose", "where",
    # tracing and the API
    "DEFAULT_TARGET", "Jitted", "ShapeDtypeStruct", "Tensor", "TracingError", "call_function",
    "current_trace", "is_tracing", "jit", "make_ir", "register_backend", "spec", "trace",
    "trace_closure", "type_of",
]
