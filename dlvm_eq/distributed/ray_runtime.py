"""Ray, imported on first use, and a local Ray instance for the demo, the benchmark and tests.

    ray = require_ray()              # a DlvmError naming the extra when Ray is not installed
    start_local(num_cpus=2)          # a private single-machine Ray: no dashboard, no usage stats

`import dlvm_eq` never imports Ray; `dlvm_eq.distributed` imports it when a step is built.
"""

from __future__ import annotations

import logging

from ..config import default_for_libraries
from ..errors import DlvmError


def require_ray():
    try:
        import ray
    except ImportError as e:
        raise DlvmError("dlvm_eq.distributed needs Ray: pip install 'dlvm_eq[distributed]'") from e
    return ray


def start_local(num_cpus: int):
    """Start a Ray instance on this machine only (`address="local"`: never a running cluster,
    whatever RAY_ADDRESS says), with `num_cpus` CPUs, no dashboard, no usage statistics."""
    ray = require_ray()
    if ray.is_initialized():
        raise DlvmError(
            "start_local: Ray is already initialized in this process "
            "(call ray.shutdown() first, or use the instance you started)"
        )
    # read by ray.init itself: set before it, and only where the user did not choose
    default_for_libraries("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=False,
    )
    return ray
