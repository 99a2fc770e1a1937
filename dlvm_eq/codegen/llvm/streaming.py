"""Streaming (non-temporal) output stores for large elementwise kernels on x86.

A plain store to memory that is not in cache first reads the line (read-for-ownership), so a
kernel writing a large output moves 3 bytes per output byte where numpy's copy (which uses
non-temporal stores) moves 2. LLVM's vectorizer will not vectorize a loop whose scalar stores
carry `!nontemporal` (the vector store's alignment is unknown), so the kernel computes a tile
of outputs into an L1-resident scratch buffer with the ordinary vectorized loop and copies the
tile out with explicit 64-byte-aligned non-temporal vector stores. The tile path runs when
every output pointer is 64-byte aligned at the chunk start (the runtime allocates outputs so,
and splits work at multiples of 64 elements); otherwise the plain loop runs.

    >>> tiled_streaming(b, lo, hi, outs, out_dtypes, compute)   # compute(b, t_lo, t_hi, sinks)
"""

from __future__ import annotations

from llvmlite import ir

from .emitter import I32, I64
from .loops import counted_loop, i64
from .lower_expr import storage_type

TILE = 1024  # elements per tile: <= 8 KiB of scratch per f64 output, fits L1


def last_level_cache_bytes() -> int:
    """The largest CPU cache this process sees (Linux sysfs), 0 when unknown."""
    import glob

    best = 0
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:  # closed here, not whenever the GC runs
                text = f.read().strip().upper()
            best = max(
                best, int(text.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(text[-1:], 0)
            )
        except (OSError, ValueError):
            continue
    return best


# Outputs smaller than this are left in cache for the next kernel. Like glibc's memcpy, stream
# only what exceeds 3/4 of the last-level cache: on a part with a 480 MiB L3, 40 MB written with
# plain stores stayed in L3 and beat non-temporal stores by 10% (sigmoid chain, 10M float32).
NT_MIN_BYTES = max(8 << 20, last_level_cache_bytes() * 3 // 4)
VEC = ir.VectorType(I32, 16)  # 64 bytes: one cache line per non-temporal store

_NT_MD = "nontemporal"


def _size(dt: str) -> int:
    return {"f32": 4, "f64": 8, "i32": 4, "bool": 1}[dt]


def _nt_store(b: ir.IRBuilder, value, ptr):
    st = b.store(value, ptr, align=64)
    st.set_metadata(_NT_MD, b.module.add_metadata([ir.Constant(I32, 1)]))


def _sfence(b: ir.IRBuilder):
    """Non-temporal stores are weakly ordered: make them visible before returning."""
    fn = b.module.globals.get("llvm.x86.sse.sfence")
    if fn is None:
        fn = ir.Function(b.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse.sfence")
    b.call(fn, [])


def tiled_streaming(b: ir.IRBuilder, lo, hi, outs, out_dtypes, compute):
    """Run compute(b, t_lo, t_hi, sinks) over [lo, hi): sinks[j](b, flat) is the pointer where
    output j of element `flat` goes (a scratch slot in the tiled part, else the output)."""
    scratch = []
    for dt in out_dtypes:
        with b.goto_entry_block():  # in the entry block: a fixed stack slot
            slot = b.alloca(storage_type(dt), size=ir.Constant(I64, TILE), name="tile")
        slot.align = 64
        scratch.append(slot)
    aligned = None
    for ptr, dt in zip(outs, out_dtypes):
        addr = b.add(b.ptrtoint(ptr, I64), b.mul(lo, i64(_size(dt))))
        ok = b.icmp_unsigned("==", b.and_(addr, i64(63)), i64(0))
        aligned = ok if aligned is None else b.and_(aligned, ok)
    n_tiles = b.select(aligned, b.udiv(b.sub(hi, lo), i64(TILE)), i64(0))
    rest = b.add(lo, b.mul(n_tiles, i64(TILE)))

    def tile(b, q):
        t = b.add(lo, b.mul(q, i64(TILE)))

        def to_scratch(j):
            st = storage_type(out_dtypes[j])
            return lambda b, flat: b.gep(
                scratch[j], [b.sub(flat, t)], inbounds=True, source_etype=st
            )

        compute(b, t, b.add(t, i64(TILE)), [to_scratch(j) for j in range(len(outs))])
        for j, (ptr, dt) in enumerate(zip(outs, out_dtypes)):
            base = b.gep(ptr, [b.mul(t, i64(_size(dt)))], inbounds=True, source_etype=ir.IntType(8))
            lines = TILE * _size(dt) // 64

            def copy(b, k, j=j, base=base):
                src = b.gep(
                    scratch[j], [b.mul(k, i64(64))], inbounds=True, source_etype=ir.IntType(8)
                )
                dst = b.gep(base, [b.mul(k, i64(64))], inbounds=True, source_etype=ir.IntType(8))
                _nt_store(b, b.load(src, typ=VEC, align=64), dst)

            counted_loop(b, i64(0), i64(lines), copy, "nt")

    counted_loop(b, i64(0), n_tiles, tile, "tiles")

    def to_out(j):
        st = storage_type(out_dtypes[j])
        return lambda b, flat: b.gep(outs[j], [flat], inbounds=True, source_etype=st)

    compute(b, rest, hi, [to_out(j) for j in range(len(outs))])
    _sfence(b)
