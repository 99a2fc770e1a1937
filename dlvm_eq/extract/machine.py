"""Machine descriptions: what the target cost model knows about a target.

The CPU figures are the measurements in MEASUREMENTS.md (2-core EPYC with AVX-512: ~40 GB/s
copy bandwidth, 238-436 GFLOP/s sgemm); the GPU figures are an H100/H200-class device (HBM3,
~4 TB/s, ~60 TFLOP/s fp32). Only ratios matter to extraction; absolute values make the
reported costs read as estimated seconds.

    >>> MACHINES["cpu"].blas_rate > MACHINES["cpu"].flop_rate
    True
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import DlvmError


@dataclass(frozen=True)
class Machine:
    name: str
    bandwidth: float          # bytes/s to and from main memory, read + write
    flop_rate: float          # elementwise flop/s over all cores (vector units)
    blas_rate: float          # matmul flop/s (BLAS / cuBLAS)
    launch: float             # seconds per kernel launch or BLAS call
    fused_fraction: float = 0.25   # share of its output traffic and launch a fusable op pays
    node_overhead: float = 1e-10   # seconds per non-view e-node, so that fewer ops win ties


MACHINES: dict[str, Machine] = {
    "cpu": Machine("cpu", bandwidth=40e9, flop_rate=100e9, blas_rate=300e9, launch=2e-6),
    "gpu": Machine("gpu", bandwidth=4.0e12, flop_rate=60e12, blas_rate=50e12, launch=5e-6),
}


def machine(target: str | Machine) -> Machine:
    """The machine description of a target name (`cpu`, `gpu`), or the Machine itself."""
    if isinstance(target, Machine):
        return target
    try:
        return MACHINES[target]
    except KeyError:
        raise DlvmError(f"unknown target {target!r}; expected one of {', '.join(MACHINES)}") from None
