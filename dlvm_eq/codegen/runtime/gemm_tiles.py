"""Our GEMM's micro-tiles and cache blocking for the host's vector ISA (`host_tiles`): the
GemmSpec fields (cpu/gemm_ir.py) of the wide tile and of the narrow one (products at most
its NR columns wide).

AVX-512 (32 zmm registers): 12 x 32 (24 accumulators, two B vectors per k) and 24 x 16.

AVX2 + FMA (16 ymm registers): 6 x 16, the BLIS Haswell shape: 12 accumulators, two B vectors
and one broadcast A element live per k, 15 of the 16 registers. On this 2-core EPYC (Zen 3,
/sys/devices/system/cpu/cpu0/cache: L1d 32 KiB 8-way, L2 512 KiB, L3 32 MiB):
  KC = 256: a micro-panel of B (KC x 16 floats, 16 KiB) fills half the L1d and the MR rows of
            A (6 x 1 KiB) stream beside it;
  MC = 144: a packed block of A (MC x KC floats, 144 KiB) stays in the L2 with room for C.
Measured against 4 x 24 and 8 x 8 (the other shapes that fit 16 registers; single-threaded,
CPU time of the calling thread on a loaded machine, so within ~10% noise): 6 x 16 and 4 x 24
alike (47-76 GFLOP/s on the transformer's and MLP's products), 8 x 8 slower on the large
ones. The same tile is the narrow one (16 columns is one tile).
A row-major A is read in place, never packed (`pack_rows`): its 6 rows fit the L1d's 8 ways
even when they all map to one set (2048 x 1024 x 256: 72 GFLOP/s in place, 62 packed).
"""

from __future__ import annotations

AVX512_WIDE = dict(
    mr=12, nr=32, kc=256, mc=288
)  # mc 144 -> 288: 2048^3 72 -> 65 ms (fewer passes over B)
AVX512_NARROW = dict(mr=24, nr=16, kc=256, mc=144)
# Few rows on a pre-packed B (a loop's weight, execution/packed_products.py): a product of 16
# rows runs 24 through the 12-row tile (rows past the edge are computed and dropped); 8 x 32
# (16 accumulators) runs 16. Same NR as the wide tile, so B's packed panels are the same.
# Measured (16 x 256 @ 256 x 1024 on a packed B, one thread, AVX-512 EPYC, load 5.7): 12 x 32
# 120 us, 8 x 32 86 us, OpenBLAS 197 us; 16 x 1024 @ (256 x 1024)^T: 129, 93, 241 us.
AVX512_SHORT = dict(mr=8, nr=32, kc=256, mc=288)
AVX2_TILE = dict(mr=6, nr=16, kc=256, mc=144, lanes=8)


def host_tiles(features: str) -> tuple[dict, dict]:
    """(wide, narrow) tiles for a CPU with these LLVM features ("+avx2,-avx512f,...")."""
    if "+avx512f" in features.split(","):
        return AVX512_WIDE, AVX512_NARROW
    return AVX2_TILE, AVX2_TILE


def short_tile(features: str) -> dict:
    """The tile for products of few rows on a pre-packed B: AVX512_SHORT on AVX-512; on AVX2
    the 6 x 16 tile itself (16 rows pad to 18 there, and fewer rows would leave FMAs idle)."""
    return AVX512_SHORT if "+avx512f" in features.split(",") else AVX2_TILE


def padded_rows(m: int, tile: dict) -> int:
    """Rows a tile computes for an m-row product (whole micro-tiles).

    >>> padded_rows(16, AVX512_WIDE), padded_rows(16, AVX512_SHORT)
    (24, 16)
    """
    return -(-m // tile["mr"]) * tile["mr"]


def with_blocks(tile: dict, blocks: dict | None) -> dict:
    """`tile` with a calibrated profile's cache blocking (its "kc" and "mc"; mc rounded up to
    a multiple of the micro-tile's rows); the register tile (mr, nr, lanes) stays the ISA's.

    >>> with_blocks(AVX2_TILE, {"kc": 128, "mc": 100})["mc"]
    102
    """
    if not blocks:
        return dict(tile)
    mr = tile["mr"]
    return {**tile, "kc": int(blocks["kc"]), "mc": -(-int(blocks["mc"]) // mr) * mr}


def packs_row_major_a(tile: dict) -> bool:
    """Whether a tile packs a row-major A whose rows share L1 sets (see gemm_runtime's
    _rows_collide): the AVX-512 tile's 12 rows overflow the L1's 8 ways, the AVX2 tile's 6 do not."""
    return tile.get("lanes", 16) == 16
