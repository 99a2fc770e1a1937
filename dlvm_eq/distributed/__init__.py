"""Data-parallel training on Ray: one compiled step, run on shards of the batch by Ray actors,
with the single-process step's numbers (a fixed reduction order makes reruns bitwise equal).

    import dlvm_eq as dq
    step = dq.distributed.data_parallel(
        dq.value_and_grad(loss, argnums=(0, 1)), batch_argnums=(2, 3), workers=2)
    value, grads = step(w, b, x, y)

Ray runs where the user says (`ray.init(address=...)` before the first step; a local instance
otherwise). Install with `pip install 'dlvm_eq[distributed]'`; `import dlvm_eq` never imports
Ray. Files: step (data_parallel), sharding (split and weights), reduction (combine), worker
(the actor), faults (user errors, lost workers), training (the loop, a dq.optim optimizer on
the driver), ray_runtime (importing Ray, a local instance).
"""

from .ray_runtime import require_ray, start_local
from .step import DataParallel, data_parallel
from .training import train

__all__ = ["DataParallel", "data_parallel", "require_ray", "start_local", "train"]
