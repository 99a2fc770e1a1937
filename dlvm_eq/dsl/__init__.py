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
composites), tracing (trace / call_function), pytree (tree_flatten, tree_map, ...), tree_args
(pytree arguments of traced functions), api (make_ir, jit, back ends), optim (sgd, momentum,
adam). Compositions of the ops, one small file each: constants (zeros, ones, full, arange),
stack, stats (var, std), layers (gelu, layer_norm, one_hot), einsum, clip.
"""
from .api import DEFAULT_TARGET, Jitted, jit, make_ir, register_backend
from .clip import clip
from .constants import arange, full, full_like, ones, ones_like, zeros, zeros_like
from .context import TracingError, current_trace, is_tracing
from .einsum import einsum
from .indexing import split
from .layers import gelu, layer_norm, one_hot
from .nn import log_softmax, logsumexp, softmax, softmax_cross_entropy
from .ops import (abs, add, astype, ceil, concatenate, cos, cosh, divide, equal, exp, expm1, floor,
                  greater, greater_equal, less, less_equal, log, log1p, logical_and, logical_not,
                  logical_or, matmul, max, maximum, mean, min, minimum, multiply, negative,
                  not_equal, power, relu, reshape, round, rsqrt, sigmoid, sign, sin, sinh, softplus,
                  sqrt, square, subtract, sum, tan, tanh, transpose, where)
from .pytree import PyTreeDef, tree_flatten, tree_leaves, tree_map, tree_structure, tree_unflatten
from .stack import stack
from .stats import std, var
from .tensor import Tensor
from .tracing import ShapeDtypeStruct, call_function, spec, trace, trace_closure, type_of
from . import optim  # noqa: E402 (last: it is written with the ops above)

__all__ = [
    # ops
    "abs", "add", "astype", "ceil", "concatenate", "cos", "cosh", "divide", "equal", "exp",
    "expm1", "floor", "greater", "greater_equal", "less", "less_equal", "log", "log1p",
    "log_softmax", "logical_and", "logical_not", "logical_or", "logsumexp", "matmul", "max",
    "maximum", "mean", "min", "minimum", "multiply", "negative", "not_equal", "power", "relu",
    "reshape", "round", "rsqrt", "sigmoid", "sign", "sin", "sinh", "softmax",
    "softmax_cross_entropy", "softplus", "split", "sqrt", "square", "subtract", "sum", "tan",
    "tanh", "transpose", "where",
    # compositions of the ops
    "arange", "clip", "einsum", "full", "full_like", "gelu", "layer_norm", "one_hot", "ones",
    "ones_like", "stack", "std", "var", "zeros", "zeros_like",
    # pytrees and optimizers over them
    "optim", "PyTreeDef", "tree_flatten", "tree_leaves", "tree_map", "tree_structure",
    "tree_unflatten",
    # tracing and the API
    "DEFAULT_TARGET", "Jitted", "ShapeDtypeStruct", "Tensor", "TracingError", "call_function",
    "current_trace", "is_tracing", "jit", "make_ir", "register_backend", "spec", "trace",
    "trace_closure", "type_of",
]
