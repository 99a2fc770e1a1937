"""GEMM epilogue fusion (CPU plans): a matmul and an elementwise kernel that reads its result
become one step (plan.GemmStep), the kernel running on each tile of the product as soon as the
tile is final, while it is in L1 (codegen/cpu/gemm_ir.py), instead of a pass of its own over a
result that a big GEMM has pushed out of cache. The MLP step: bias + ReLU (+ the ReLU mask)
after x @ w1, and the ReLU's gradient select after dz @ w2.T.

A kernel qualifies when it is a map (not a reduction or row kernel) over the product's 2-D
float32 shape, reads the product element for element (contiguous), and none of its other
inputs depends on the product (the fused step would wait for itself); and the product has at
most MAX_FUSED_ELEMENTS elements and is big enough to go through our GEMM at all
(gemm_runtime.GEMM_MIN_MACS); measured (benchmarks/gemm.py), bias + ReLU + mask fused into
256x784 @ 784x256 took 0.84x of numpy's time against 0.91x unfused, but at 1024^3 fusing cost
3-6% (the epilogue's stores compete with the GEMM's panels for the cache once C no longer fits
in L2). A product gets at most one epilogue: the first qualifying
reader in program order. Whether the step then runs through our GEMM is decided at run time
(operand layouts); otherwise it runs as the matmul followed by the kernel.
"""

from __future__ import annotations

from ..kernels.kernel_spec import KernelSpec, c_strides
from ..runtime import gemm_runtime
from .plan import BlasStep, GemmStep, KernelStep
from .steps_order import Node

MAX_FUSED_ELEMENTS = 1 << 18  # 1 MiB of float32 result: half this machine's L2


def plan_settings() -> str:
    """What a CPU plan depends on besides the module (for the plan cache's key): GEMM epilogue
    fusion's and multi-output fusion's switches, whether, and from which product size, our GEMM
    is used, and whether products write in their reader's layout and concatenations are
    written in place (settable at run time, e.g. by tests)."""
    from ...config import settings
    from . import concat_in_place, product_layout  # by module: switches read at each use

    g = gemm_runtime
    return (
        f"epilogues={g.epilogues_enabled()},gemm={g.enabled()}:{g.GEMM_MIN_MACS},"
        f"layout_writes={product_layout.ENABLED},multi={settings().multi_output},"
        f"concat_in_place={concat_in_place.ENABLED}"
    )


def fuse_epilogues(nodes: list[Node], slots) -> list[Node]:
    """`nodes` with each (matmul, qualifying reader) pair replaced by one GemmStep node."""
    if not gemm_runtime.epilogues_enabled():
        return nodes
    producer = {o: n for n in nodes for o in n.outputs}
    taken: set[int] = set()
    out_nodes = list(nodes)
    for blas_node in nodes:
        blas = blas_node.payload
        if not _fusable_product(blas, slots):
            continue
        downstream = _downstream(blas_node, nodes)
        for node in sorted(nodes, key=lambda n: n.order):
            c = _reads_product(node, blas, slots[blas.out].shape, taken)
            if c is None:
                continue
            others = [s for i, s in enumerate(node.payload.inputs) if i != c]
            if any(producer.get(s) is not None and id(producer[s]) in downstream for s in others):
                continue
            step = GemmStep(blas, node.payload, c)
            fused = Node(
                set(blas_node.inputs) | set(others), [blas.out, *node.outputs], blas.order, step
            )
            out_nodes = [fused if n is blas_node else n for n in out_nodes if n is not node]
            taken.add(id(node))
            break
    return out_nodes


def _fusable_product(blas, slots) -> bool:
    """A 2-D float32 product small enough to fuse into and big enough for our GEMM (numpy
    computes the others: there is no GEMM to fuse into)."""
    if not isinstance(blas, BlasStep):
        return False
    out = slots[blas.out]
    if (
        len(out.shape) != 2
        or out.dtype != "f32"
        or out.shape[0] * out.shape[1] > MAX_FUSED_ELEMENTS
    ):
        return False
    return gemm_runtime.worth_our_gemm(out.shape[0], blas.a.shape[-1], out.shape[1])


def _reads_product(node: Node, blas: BlasStep, shape: tuple, taken: set) -> int | None:
    """The input index through which `node`'s kernel reads the product, if it qualifies."""
    k = node.payload
    if not isinstance(k, KernelStep) or not isinstance(k.spec, KernelSpec) or id(node) in taken:
        return None
    spec = k.spec
    if blas.out not in k.inputs or tuple(spec.shape) != tuple(shape):
        return None
    for i, s in enumerate(k.inputs):
        if s == blas.out:
            inp = spec.inputs[i]
            if (
                inp.dtype == "f32"
                and inp.strides in (None, c_strides(spec.shape))
                and k.inputs.count(s) == 1
            ):
                return i
            return None
    return None


def _downstream(start: Node, nodes: list[Node]) -> set[int]:
    """ids of the nodes that depend on `start` (directly or not)."""
    users: dict[int, list[Node]] = {}
    for n in nodes:
        for s in n.inputs:
            users.setdefault(s, []).append(n)
    seen: set[int] = set()
    stack = list(start.outputs)
    while stack:
        for u in users.get(stack.pop(), []):
            if id(u) not in seen:
                seen.add(id(u))
                stack.extend(u.outputs)
    return seen
