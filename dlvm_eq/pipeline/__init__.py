"""The pipeline: the one place that sequences the compiler's stages, and the user's entry
points that run them.

    resolve declared adjoints (adjoints.py) -> optimize in the e-graph (native.optimized)
    -> decide fusion and plan (planning.py) -> build kernels and cache (native.py)

    f = dq.compile(module, "f", target="cpu")     # native.py
    step = dq.jit(dq.value_and_grad(loss))        # jit.py (trace + compile), differentiate.py
    dq.interpret(module, "f_grad", x)             # module_calls.py: declared adjoints resolved
    dq.jit(fn, target="interp")                   # targets.py: the table of jit's targets
    compile_loops(module, "rnn", "cpu")           # loops.py: a function cut at its loops and
                                                  # branches, each piece and body compiled once

Owns: trace-then-compile (`jit`), the differentiation API (`grad`, `value_and_grad`, `vjp`,
`check_grads` with dq.grad as default), the transforms (`vmap`, `jvp`, `linearize`, `jacfwd`,
`jacrev`, `hessian`, `custom_vjp`: trace, transform the IR, inline or jit), the compile pipeline and its caches (optimized
programs in memory, plans on disk), the target table, compile timings.
May import: verify, ad, egraph, extract, codegen, dsl, ir, cache, json_records,
config, errors, version, lazy_attributes (never cli, models, distributed, nor the root package).
`import dlvm_eq` loads jit and the differentiation API only; compile and planning (llvmlite,
egglog, the planner) load on first use.
"""

from ..lazy_attributes import lazy_attributes
from .adjoints import resolve_adjoints
from .custom_vjp import custom_vjp
from .differentiate import grad, value_and_grad, vjp
from .forward import hessian, jacfwd, jacrev, jvp, linearize
from .jit import Jitted, jit
from .module_calls import interpret, optimize, verify_adjoint
from .targets import DEFAULT_TARGET, register_backend
from .timing import compile_seconds
from .vmap import vmap

# name -> submodule, imported on first access (PEP 562): the code generator and the planner
# load only when something is compiled
_LAZY = {
    "CompileReport": "native",
    "Compiled": "native",
    "compile": "native",
    "lower": "native",
    "optimized": "native",
    "plan_function": "planning",
    "planned": "planning",
    "check_grads": "gradient_check",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())


__all__ = [
    "CompileReport",
    "Compiled",
    "DEFAULT_TARGET",
    "Jitted",
    "check_grads",
    "compile",
    "custom_vjp",
    "compile_seconds",
    "grad",
    "hessian",
    "interpret",
    "jacfwd",
    "jacrev",
    "jit",
    "jvp",
    "linearize",
    "lower",
    "optimize",
    "optimized",
    "plan_function",
    "planned",
    "register_backend",
    "resolve_adjoints",
    "value_and_grad",
    "verify_adjoint",
    "vjp",
    "vmap",
]
