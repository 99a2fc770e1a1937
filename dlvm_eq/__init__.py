"""dlvm_eq: DLVM's linear-algebra IR, adjoint code generation and domain-specific optimization
as declarative rules in one e-graph, with fused llvmlite kernels for CPU and NVIDIA GPUs.

    import dlvm_eq as dq
    step = dq.jit(dq.value_and_grad(loss, argnums=(0, 1)))
    print(dq.make_ir(loss)(w, x))
"""
from .errors import DlvmError, IRError, ShapeError, SourceError
from .ir import Module, interpret

__version__ = "0.1.0"

# The public API, assembled from the layers (left to right in the data flow).
from .ir.parser import load, parse  # noqa: E402,F401
from .dsl import *  # noqa: E402,F401,F403
from .egraph.optimize import optimize  # noqa: E402,F401
from .ad.api import grad, value_and_grad, vjp  # noqa: E402,F401


def compile(module, name, target="cpu", optimize=True):  # noqa: A001 - the user's word for it
    """`dq.compile(module, "f", target="cpu"|"gpu")`: a callable running function `f` of a
    `.dl` module (declared adjoints included) as native kernels; `.report` and `.plan` say
    what was optimized and fused. The code generator loads on first use (llvmlite)."""
    from .codegen.backend import compile as _compile
    return _compile(module, name, target, optimize)
