"""dlvm_eq: DLVM's linear-algebra IR, adjoint code generation and domain-specific optimization
as declarative rules in one e-graph, with fused llvmlite kernels for CPU and NVIDIA GPUs.

    import dlvm_eq as dq
    step = dq.jit(dq.value_and_grad(loss, argnums=(0, 1)))
    print(dq.make_ir(loss)(w, x))

`import dlvm_eq` loads the IR, the DSL and the differentiation API only; the heavy layers load
on first use: the parser (lark) with `dq.parse`/`dq.load`, the e-graph (egglog, scipy) with
`dq.optimize` or the first e-graph built, the code generator (llvmlite) with the first `dq.jit`
or `dq.compile` for a native target. A warm-cache compile never imports egglog or scipy.
"""

# first: in the dlvm-eq script, Ctrl-C during the imports below ends it without a traceback
from . import console_script

# The public API, assembled from the layers (left to right in the data flow).
from .dsl import *  # noqa: F403
from .errors import DlvmError, IRError, ShapeError, SourceError
from .ir import Module
from .lazy_attributes import lazy_attributes
from .pipeline import (
    DEFAULT_TARGET,
    Jitted,
    custom_vjp,
    grad,
    hessian,
    interpret,
    jacfwd,
    jacrev,
    jit,
    jvp,
    linearize,
    register_backend,
    value_and_grad,
    vjp,
    vmap,
)
from .version import __version__

# name -> submodule that defines it, imported on first access (PEP 562)
_LAZY = {
    "load": "ir.parser",
    "parse": "ir.parser",
    "optimize": "pipeline.module_calls",
    "check_grads": "pipeline.gradient_check",
}
_lazy_attribute, __dir__ = lazy_attributes(__name__, _LAZY, globals())


def __getattr__(name):
    if name == "distributed":  # `dq.distributed.data_parallel`: Ray loads on this first use only
        import importlib

        return importlib.import_module("dlvm_eq.distributed")
    return _lazy_attribute(name)


def compile(module, name, target="cpu", optimize=True, cast=False, rules=(), verify_rules=False):
    """`dq.compile(module, "f", target="cpu"|"gpu")`: a callable running function `f` of a
    `.dl` module (declared adjoints included) as native kernels; `.report` and `.plan` say
    what was optimized and fused. The code generator loads on first use (llvmlite).
    Arguments must have the declared dtypes (a DlvmError names the one that does not), or
    `cast=True` casts them (never complex or object arrays); Python numbers are weakly typed.
    rules: the user's rule files, added to the shipped ones (as `dlvm-eq opt --rules`);
    verify_rules=True refuses a rule verify-rules cannot prove (VerificationError, file:line)."""
    from .pipeline.native import compile as _compile

    if verify_rules:
        from .pipeline.verified_rules import check_user_rules

        check_user_rules(rules, "compile")

    return _compile(module, name, target, optimize, cast, rules)
