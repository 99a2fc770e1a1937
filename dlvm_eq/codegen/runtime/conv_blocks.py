"""The convolutions' blocking (codegen/runtime/conv_cpu.py runs them so): the shipped constants,
or what this host's calibrated profile measured fastest. Its own small module so that a cpu
compile can set it without loading the convolution runtime (a warm compile of a program
without convolutions loads none of it: tests/test_warm_compile.py).

The rule that turns blocks into work is here too, once: how many images a chunk holds
(`images_per_chunk`), whether each image gets its own product (`one_product_per_image`), and
the products and transposing copies a convolution then runs (`conv_work`), which the cost
model prices (calibration/plan_cost.window_work) for the blocks in use and for alternatives.

    >>> conv_work("conv2d", 128, 288, 196, 64, 1, 4)        # the CNN's second layer
    ConvWork(products=((64, 288, 25088, False, False, 1),), copy_bytes=12845056, strategy='1 chunk of 128 images')
"""

from __future__ import annotations

from ...records import dataclass

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


def images_per_chunk(bytes_per_image: int, images: int, blocks: dict | None = None) -> int:
    """Images whose column matrices share one chunk (at least one, at most `images`).

    >>> images_per_chunk(225792, 128, {"chunk_bytes": 16 << 20, "per_image_macs": 1})
    74
    """
    chunk = (blocks or BLOCKS)["chunk_bytes"]
    return max(1, min(images, chunk // max(1, bytes_per_image)))


def one_product_per_image(group_macs: int, blocks: dict | None = None) -> bool:
    """Whether a group's per-image product of `group_macs` multiply-adds runs one per image
    (straight into NCHW, no transposing copy) rather than one per chunk of images."""
    return group_macs <= (blocks or BLOCKS)["per_image_macs"]


def conv_dims(op: str, in_shapes, out_shape) -> tuple[int, int, int, int]:
    """(images, C·KH·KW, OH·OW, O) of a convolution op from its operands' and result's shapes
    (conv2d: x, w -> y; the input adjoint: dy, w -> dx; the weight adjoint: x, dy -> dw).

    >>> conv_dims("conv2dBackwardInput", [(8, 64, 14, 14), (64, 32, 3, 3)], (8, 32, 16, 16))
    (8, 288, 196, 64)
    """
    a, b = in_shapes[0], in_shapes[1]
    if op == "conv2d":
        return a[0], a[1] * b[2] * b[3], out_shape[2] * out_shape[3], out_shape[1]
    if op == "conv2dBackwardInput":
        return a[0], out_shape[1] * b[2] * b[3], a[2] * a[3], a[1]
    return a[0], a[1] * out_shape[2] * out_shape[3], b[2] * b[3], b[1]


@dataclass(frozen=True)
class ConvWork:
    """What conv_cpu runs for one convolution under some blocks: its products as (m, k, n,
    trans_a, trans_b, count), the bytes its transposing copies (and the per-image weight
    adjoint's sum of parts) move, read and write, and the strategy in words."""

    products: tuple[tuple[int, int, int, bool, bool, int], ...]
    copy_bytes: int
    strategy: str


def conv_work(
    op: str,
    images: int,
    rows: int,
    positions: int,
    out_channels: int,
    groups: int,
    itemsize: int,
    blocks: dict | None = None,
) -> ConvWork:
    """The work of `op` (conv2d, conv2dBackwardInput, conv2dBackwardWeight) over `images`
    images whose column matrix is `rows` (C·KH·KW) x `positions` (OH·OW) each, with
    `out_channels` in `groups`, as conv_cpu runs it under `blocks` (None: the blocks in use).
    Products as they are called: per image, numpy's stacked matmul (one product per image and
    group); chunked, one product per chunk and group over the chunk's positions side by side,
    the weight adjoint computed transposed (conv_cpu.WEIGHT_PRODUCT)."""
    rg, og, p = rows // groups, out_channels // groups, positions
    if one_product_per_image(og * rg * p, blocks):
        shape = {
            "conv2d": (og, rg, p, False, False),
            "conv2dBackwardInput": (rg, og, p, True, False),
            "conv2dBackwardWeight": (og, p, rg, False, True),
        }[op]
        # the weight adjoint's per-image parts (images x O x C/g·KH·KW) are summed after
        parts = images * out_channels * rg * itemsize if op == "conv2dBackwardWeight" else 0
        return ConvWork(((*shape, images * groups),), parts, "one product per image")
    per = images_per_chunk(rows * p * itemsize, images, blocks)
    full, rest = divmod(images, per)
    products = []
    for k, chunks in ((per, full), (rest, 1 if rest else 0)):
        if chunks:
            kp = k * p
            products.append(
                {
                    "conv2d": (og, rg, kp, False, False, groups * chunks),
                    "conv2dBackwardInput": (rg, og, kp, True, False, groups * chunks),
                    "conv2dBackwardWeight": (rg, kp, og, False, True, groups * chunks),
                }[op]
            )
    # the output (forward) or dY (adjoints) between NCHW and (O, images x positions)
    copy = 2 * out_channels * images * p * itemsize
    chunks = full + (1 if rest else 0)
    return ConvWork(tuple(products), copy, f"{chunks} chunk{'s' * (chunks > 1)} of {per} images")


__all__ = [
    "BLOCKS",
    "SHIPPED",
    "ConvWork",
    "conv_dims",
    "conv_work",
    "images_per_chunk",
    "one_product_per_image",
    "use_blocks",
]
