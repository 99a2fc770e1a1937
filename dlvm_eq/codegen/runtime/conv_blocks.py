"""The convolutions' blocking (codegen/runtime/conv_cpu.py runs them so): the shipped constants,
or what this host's calibrated profile measured fastest. Its own small module so that a cpu
compile can set it without loading the convolution runtime (a warm compile of a program
without convolutions loads none of it: tests/test_warm_compile.py)."""

from __future__ import annotations

# Bytes of one chunk's column matrix: the images of a chunk share one product per group
# (64 MB: the CNN's 29 MB batch in one; fewer, longer products measured faster: conv_cpu.py).
CHUNK_BYTES = 64 << 20
# A group's per-image product (multiply-adds) at most this big runs one product per image: in
# OpenBLAS it stays on the calling thread (gemm_runtime.GEMM_MIN_MACS says the same).
PER_IMAGE_MACS = 1 << 18

SHIPPED = {"chunk_bytes": CHUNK_BYTES, "per_image_macs": PER_IMAGE_MACS}
# the blocking in use: the shipped constants, or what this host's calibrated profile measured
# fastest among calibration/measure.CONV_BLOCKS (`use_blocks`, called as a cpu compile starts)
BLOCKS = dict(SHIPPED)


def use_blocks(blocks: dict | None) -> bool:
    """Block the convolutions as a calibrated profile says ({"chunk_bytes", "per_image_macs"};
    None or {}: the shipped constants). True when that changed them. The results do not
    depend on the blocks (tests/test_conv_blocks.py), only the time does."""
    new = {**SHIPPED, **(blocks or {})}
    if new == BLOCKS:
        return False
    BLOCKS.update(new)
    return True
