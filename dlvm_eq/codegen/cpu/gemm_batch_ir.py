"""The batch loop of a batched product in native code: one call runs our GEMM (gemm_ir.py) on
batch entries [b0, b1), so a batched matmul costs no Python per entry and its entries can be
split across the native pool's threads (each thread a range of entries).

ABI:
    void gemm_batch(i64 b0, i64 b1, ptr offsets, ptr gemm, <the GEMM's 18 arguments>)
`offsets` is an int64 array of (A, B, C) element offsets per batch entry (3 per entry); entry
i calls gemm(..., A + offA[i], ..., B + offB[i], ..., C + offC[i], ...), the other
arguments as given. Offsets come from the operands' batch strides, so a broadcast batch
dimension (stride 0) reads the same matrix for every entry without a copy.
"""

from __future__ import annotations

from llvmlite import ir

from ..llvm.loops import counted_loop, i64
from .gemm_ir import F32, I32, I64, PTR, FnPtr

GEMM_ARGS = [I64] * 5 + [PTR, I64, I64, PTR, I64, I64, PTR, I64, PTR, PTR, I32, PTR, PTR]
_A, _B, _C = 5, 8, 11  # the GEMM's per-product pointers


def gemm_batch_ir(symbol: str) -> str:
    """LLVM IR text of the batch driver `symbol`."""
    module = ir.Module(name="dq_gemm_batch")
    fn = ir.Function(
        module, ir.FunctionType(ir.VoidType(), [I64, I64, PTR, PTR] + GEMM_ARGS), symbol
    )
    b0, b1, offsets, gemm = fn.args[:4]
    args = list(fn.args[4:])
    gemm_type = ir.FunctionType(ir.VoidType(), GEMM_ARGS)
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def entry(b, i):
        row = b.mul(i, i64(3))
        call = list(args)
        for j, pos in enumerate((_A, _B, _C)):
            off = b.load(b.gep(offsets, [b.add(row, i64(j))], source_etype=I64), typ=I64)
            call[pos] = b.gep(args[pos], [off], source_etype=F32)
        b.call(FnPtr(gemm, gemm_type), call)

    counted_loop(b, b0, b1, entry, "batch")
    b.ret_void()
    return str(module)
