"""A thin layer over llvmlite's IRBuilder: typed constants, intrinsics, and the project's
fast-math policy in one place, shared by the CPU and NVPTX back ends.

Fast-math policy (why each flag is or is not used):
- elementwise float arithmetic gets `contract` only: FMA contraction changes rounding by at
  most half an ulp and never the NaN/inf/signed-zero behaviour numpy users expect;
- `nnan`/`ninf` are never set: results must keep NaN and inf exactly as numpy does, and with
  them LLVM may delete the NaN checks in the polynomial math;
- `reassoc` only on a reduction's accumulator (`REDUCE_FLAGS`): it lets the vectorizer keep
  several partial sums, which changes rounding like any tree summation, not NaN semantics;
- `afn`/`arcp` are never set: they let LLVM replace sqrt and division by approximations, and
  x86 uses those for vectors only (scalar f32 estimates are off by default, and 8- and
  16-lane vectors use different estimate instructions), so the vector body, the vectorized
  epilogue and the scalar remainder of one loop would compute different bits for the same
  input (sigmoid(25) gave 0.99999994 in the body and 1.0 in the remainder). Every flag here
  must lower to the same arithmetic at every width: `contract` does (FMA in both), `reassoc`
  on an accumulator changes only the combine order, which depends on the loop's trip count,
  not on an element's position or the thread count.

    >>> e = Emitter(builder)
    >>> y = e.fmul(x, e.const_like(x, 2.0))
"""

from __future__ import annotations

from llvmlite import ir

FLAGS = ("contract",)
REDUCE_FLAGS = ("reassoc", "contract")
# Divisions inside polymath whose operands and result are provably finite. No `arcp`: its
# reciprocal estimate is used for vectors only, so results depended on an element's position
# (see above). Exact division measured no slower on the sigmoid chain (medians, 2-core AMD EPYC
# with AVX2: 1M f32 1.42 -> 1.30 ms, 10M 12.3 -> 11.9 ms; it is bound by memory and polynomials).
BOUNDED_DIV_FLAGS = ("ninf", "contract")

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
F32, F64 = ir.FloatType(), ir.DoubleType()
VALUE_TYPES = {"f32": F32, "f64": F64, "i32": I32, "bool": I1}
STORAGE_TYPES = {"f32": F32, "f64": F64, "i32": I32, "bool": I8}  # numpy bools are bytes


def _suffix(t: ir.Type) -> str:
    if isinstance(t, ir.FloatType):
        return "f32"
    if isinstance(t, ir.DoubleType):
        return "f64"
    if isinstance(t, ir.IntType):
        return f"i{t.width}"
    raise TypeError(t)


class Emitter:
    """Instruction helpers on one IRBuilder; the builder's position is where code goes."""

    def __init__(self, builder: ir.IRBuilder, fast_ldexp: bool = False, outline: bool = False):
        self.b = builder
        self.fast_ldexp = fast_ldexp  # llvm.ldexp is one instruction (x86 AVX-512 vscalef)
        # outline: math routines are called, not inlined (`outlined`); for kernels that never
        # vectorize (llvm_cpu.is_small), where LLVM's time grows with the inlined body's size
        self.outline = outline

    @property
    def module(self) -> ir.Module:
        return self.b.module

    # ---- constants
    @staticmethod
    def const(t: ir.Type, v) -> ir.Constant:
        return ir.Constant(t, v)

    def const_like(self, x: ir.Value, v) -> ir.Constant:
        return ir.Constant(x.type, v)

    # ---- float arithmetic under the policy above
    def fadd(self, a, b, flags=FLAGS):
        return self.b.fadd(a, b, flags=flags)

    def fsub(self, a, b, flags=FLAGS):
        return self.b.fsub(a, b, flags=flags)

    def fmul(self, a, b, flags=FLAGS):
        return self.b.fmul(a, b, flags=flags)

    def fdiv(self, a, b, flags=FLAGS):
        return self.b.fdiv(a, b, flags=flags)

    def fneg(self, a):
        return self.b.fneg(a)

    def fcmp(self, op: str, a, b):
        """op like '<' (ordered: false when either is NaN); 'u!=' etc. for unordered."""
        if op.startswith("u"):
            return self.b.fcmp_unordered(op[1:], a, b)
        return self.b.fcmp_ordered(op, a, b)

    def isnan(self, x):
        return self.b.fcmp_unordered("uno", x, x)

    def select(self, c, a, b):
        return self.b.select(c, a, b)

    # ---- intrinsics
    def declare(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, args), name=name)
        return fn

    def intrinsic(self, name: str, *args, ret: ir.Type | None = None):
        """intrinsic('rint', x) calls llvm.rint.f32 (overloaded on the first argument's type)."""
        t = args[0].type
        fn = self.declare(f"llvm.{name}.{_suffix(t)}", ret or t, [a.type for a in args])
        return self.b.call(fn, list(args))

    def fptosi_sat(self, x, t: ir.IntType):
        """float -> int, saturating, NaN -> 0 (plain fptosi is poison out of range)."""
        fn = self.declare(f"llvm.fptosi.sat.{_suffix(t)}.{_suffix(x.type)}", t, [x.type])
        return self.b.call(fn, [x])

    def outlined(self, name: str, x, body):
        """body(emitter, x) emitted once per module as an internal function `dq.<name>.<type>`
        of x's type, and called here. The same instructions as inline (the tanh-30 gradient's
        small kernels give bitwise the same results), but LLVM compiles each routine once: a
        30-deep tanh chain's kernel went from 103 KB of IR to 9 KB, and its LLVM time 7x down
        (BENCHMARKS.md, "Small kernels: math called")."""
        fname = f"dq.{name}.{_suffix(x.type)}"
        fn = self.module.globals.get(fname)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(x.type, [x.type]), fname)
            fn.linkage = "internal"
            fn.attributes.add("nounwind")
            fn.attributes.add("noinline")  # a call, whatever pipeline compiles the module
            inner = Emitter(ir.IRBuilder(fn.append_basic_block("entry")), self.fast_ldexp)
            inner.b.ret(body(inner, fn.args[0]))
        return self.b.call(fn, [x])

    def horner(self, x, coeffs):
        """coeffs[0]*x^n + ... + coeffs[n], highest power first."""
        acc = self.const_like(x, coeffs[0])
        for c in coeffs[1:]:
            acc = self.fadd(self.fmul(acc, x), self.const_like(x, c))
        return acc
