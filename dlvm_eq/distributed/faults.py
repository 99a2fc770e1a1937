"""What happens when a worker fails: user errors come back as themselves, lost workers retry.

A `DlvmError` raised in a worker (a shape mismatch in the user's step, say) is returned as a
`RaisedInWorker` and raised again on the driver with the same type, message and fields: the
user sees the error their code would raise in one process, not a RayTaskError traceback.
(Exceptions do not pickle faithfully in general: `SourceError.__init__` renders its message,
so re-running it on the rendered text would render twice. The carrier restores the state.)

A worker whose process dies (killed, out of memory) is restarted by Ray (`max_restarts`); its
shard is submitted again with the same parameter ref, so the step's result is the one an
undisturbed step gives. Each such event is logged on the `dlvm_eq.distributed` logger.
"""

from __future__ import annotations

import logging
import time

from ..errors import DlvmError

log = logging.getLogger("dlvm_eq.distributed")


class RaisedInWorker:
    """A user error captured in a worker: its class, args and attributes, rebuilt on the driver."""

    def __init__(self, cls, args, state):
        self.cls, self.args, self.state = cls, args, state

    @classmethod
    def capture(cls, error: DlvmError) -> RaisedInWorker:
        return cls(type(error), error.args, dict(vars(error)))

    def rebuild(self) -> DlvmError:
        error = self.cls.__new__(self.cls)  # not __init__: it may re-render the message
        error.args = self.args
        vars(error).update(self.state)
        return error


RESTART_WAIT_S = 120.0  # how long a restarting worker may take when the step has no timeout


def gather(actors, submit, count: int, max_retries: int, timeout_s: float | None, step_number: int):
    """The results of shards 0..count-1, in that order. `submit(i)` sends shard i to
    `actors[i]` and returns the object ref. A shard whose worker died is sent again (up to
    `max_retries` times per step) once Ray has restarted the worker; a user error is raised
    as itself."""
    ray = _ray()
    refs = [submit(i) for i in range(count)]
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    results, retries = [], 0
    for i in range(count):
        while True:
            try:
                out = ray.get(refs[i], timeout=_left(deadline))
                break
            except ray.exceptions.GetTimeoutError:
                raise _timeout(i, step_number) from None
            except ray.exceptions.RayActorError as e:
                if retries >= max_retries:
                    raise DlvmError(
                        f"data_parallel: worker {i} died during step {step_number} "
                        f"and the step's {max_retries} retries are used up: "
                        f"{type(e).__name__}"
                    ) from None
                retries += 1
                log.warning(
                    "data_parallel: worker %d died during step %d (%s); Ray restarts "
                    "it, its shard is retried with the same parameters (retry %d of %d)",
                    i,
                    step_number,
                    type(e).__name__,
                    retries,
                    max_retries,
                )
                _wait_restarted(ray, actors[i], i, deadline, step_number)
                refs[i] = submit(i)
        if isinstance(out, RaisedInWorker):
            raise out.rebuild()
        results.append(out)
    return results


def _wait_restarted(ray, actor, index: int, deadline, step_number: int) -> None:
    """Until the restarted actor answers (Ray reports it unavailable while it restarts)."""
    until = deadline if deadline is not None else time.monotonic() + RESTART_WAIT_S
    while True:
        try:
            ray.get(actor.pid.remote(), timeout=_left(until))
            return
        except getattr(ray.exceptions, "ActorUnavailableError", ()):  # where this Ray has it
            time.sleep(0.1)
        except ray.exceptions.GetTimeoutError:
            raise _timeout(index, step_number) from None
        except ray.exceptions.ActorDiedError as e:  # out of restarts: Ray gave it up
            raise DlvmError(
                f"data_parallel: worker {index} died during step {step_number} and "
                f"Ray did not restart it: {e}"
            ) from None
        if time.monotonic() > until:
            raise _timeout(index, step_number)


def _timeout(index: int, step_number: int) -> DlvmError:
    return DlvmError(
        f"data_parallel: worker {index} did not answer within the step's time "
        f"limit (step {step_number})"
    )


def _left(deadline):
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _ray():
    from .ray_runtime import require_ray

    return require_ray()
