"""The staged DSL: Python functions traced on symbolic tensors into DLVM IR (JAX's conventions).

    import dlvm_eq as dq

    def loss(w, x, y):
        return dq.mean(dq.softmax_cross_entropy(x @ w, y))

    print(dq.make_ir(loss)(w, x, y))      # the traced IR
    dq.jit(loss)(w, x, y)                 # traced once per shapes/dtypes, then run (dlvm_eq.pipeline)
    loss(w, x, y)                         # the same ops also run eagerly on numpy arrays

Files: context (trace stack, user locations), tensor (the symbolic Tensor and its operators),
primitive (bind: dtype promotion, trace-or-eager dispatch), ops (primitive ops), linalg
(matmul with numpy rules), indexing
(x[...] and split: slices), nn (stable
composites), tracing (trace / call_function), control_flow (scan, fori_loop, while_loop, cond, switch),
pytree (tree_flatten, tree_map, ...), tree_args
(pytree arguments of traced functions), api (make_ir), optim (sgd, momentum, adam).
Compositions of the ops, one small file each: constants (zeros, ones, full, arange), stack,
stats (var, std), layers (gelu, layer_norm, one_hot), einsum, arrays (argmax, argmin, clip,
cumsum, pad), activations (silu, leaky_relu, elu, log_sigmoid, ...), shapes (squeeze, tile,
flip, triu, take_along_axis, ...), losses (mse, huber, nll: `dq.losses`), norms (batch_norm
with running statistics, group_norm), resample (upsample), sorting (sort, argsort, top_k by
counted ranks), random (`dq.random`: JAX's threefry keys and draws); `dq.nn` gathers jax.nn's
names. `jit`, `grad` and the targets live in dlvm_eq/pipeline (trace + compile).
May import: ir, errors.
"""

# first: tensor.py, primitive.py and indexing.py import each other
from .tensor import Tensor  # isort: skip

# isort: split
from . import losses, nn, optim, random
from .activations import elu, hard_tanh, leaky_relu, log_sigmoid, relu6, silu, swish
from .api import make_ir
from .arrays import argmax, argmin, clip, cumsum, pad
from .checkpoint import checkpoint, remat
from .constants import arange, full, full_like, ones, ones_like, zeros, zeros_like
from .context import TracingError, current_trace, is_tracing
from .control_flow import cond, fori_loop, scan, switch, while_loop
from .conv import avg_pool2d, conv1d, conv2d, conv_transpose2d, max_pool2d
from .einsum import einsum
from .gather import take
from .indexing import split
from .layers import gelu, layer_norm, one_hot
from .linalg import matmul
from .nn import log_softmax, logsumexp, softmax, softmax_cross_entropy
from .norms import BatchNormState, batch_norm, batch_norm_state, group_norm
from .ops import (
    abs,
    add,
    astype,
    ceil,
    concatenate,
    cos,
    cosh,
    divide,
    equal,
    exp,
    expm1,
    floor,
    greater,
    greater_equal,
    less,
    less_equal,
    log,
    log1p,
    logical_and,
    logical_not,
    logical_or,
    max,
    maximum,
    mean,
    min,
    minimum,
    multiply,
    negative,
    not_equal,
    power,
    relu,
    reshape,
    round,
    rsqrt,
    sigmoid,
    sign,
    sin,
    sinh,
    softplus,
    sqrt,
    square,
    stop_gradient,
    subtract,
    sum,
    tan,
    tanh,
    transpose,
    where,
)
from .pytree import PyTreeDef, tree_flatten, tree_leaves, tree_map, tree_structure, tree_unflatten
from .resample import upsample
from .shapes import (
    broadcast_to,
    expand_dims,
    eye,
    flip,
    repeat,
    squeeze,
    take_along_axis,
    tile,
    tril,
    triu,
)
from .sorting import argsort, sort, top_k
from .special import erf
from .stack import stack
from .stats import std, var
from .tracing import ShapeDtypeStruct, call_function, spec, trace, trace_closure, type_of

__all__ = [
    "checkpoint",
    "cond",
    "fori_loop",
    "remat",
    "scan",
    "switch",
    "while_loop",
    # ops
    "avg_pool2d",
    "conv1d",
    "conv2d",
    "conv_transpose2d",
    "max_pool2d",
    "abs",
    "add",
    "argmax",
    "argmin",
    "astype",
    "clip",
    "cumsum",
    "ceil",
    "concatenate",
    "cos",
    "cosh",
    "divide",
    "equal",
    "erf",
    "exp",
    "expm1",
    "floor",
    "greater",
    "greater_equal",
    "less",
    "less_equal",
    "log",
    "log1p",
    "log_softmax",
    "logical_and",
    "logical_not",
    "logical_or",
    "logsumexp",
    "matmul",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "multiply",
    "negative",
    "not_equal",
    "pad",
    "power",
    "relu",
    "reshape",
    "round",
    "rsqrt",
    "sigmoid",
    "sign",
    "sin",
    "sinh",
    "softmax",
    "softmax_cross_entropy",
    "softplus",
    "split",
    "sqrt",
    "stop_gradient",
    "square",
    "subtract",
    "sum",
    "take",
    "tan",
    "tanh",
    "transpose",
    "where",
    # compositions of the ops
    "BatchNormState",
    "batch_norm",
    "batch_norm_state",
    "group_norm",
    "upsample",
    "argsort",
    "sort",
    "top_k",
    "broadcast_to",
    "elu",
    "expand_dims",
    "eye",
    "flip",
    "hard_tanh",
    "leaky_relu",
    "log_sigmoid",
    "relu6",
    "repeat",
    "silu",
    "squeeze",
    "swish",
    "take_along_axis",
    "tile",
    "tril",
    "triu",
    "arange",
    "clip",
    "einsum",
    "full",
    "full_like",
    "gelu",
    "layer_norm",
    "one_hot",
    "ones",
    "ones_like",
    "stack",
    "std",
    "var",
    "zeros",
    "zeros_like",
    # namespaces: jax.nn's names, losses, optimizers over pytrees
    "losses",
    "nn",
    "optim",
    "random",
    "PyTreeDef",
    "tree_flatten",
    "tree_leaves",
    "tree_map",
    "tree_structure",
    "tree_unflatten",
    # tracing and the API
    "ShapeDtypeStruct",
    "Tensor",
    "TracingError",
    "call_function",
    "current_trace",
    "is_tracing",
    "make_ir",
    "spec",
    "trace",
    "trace_closure",
    "type_of",
]
