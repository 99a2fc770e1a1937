"""Start n threads that run `work(i)` together (a barrier lets them go at once) and collect
what each raised: shared by the compile-thread and runtime-concurrency tests.

    errors = run_at_once(lambda i: results.__setitem__(i, f(x)), n=4)
"""

from __future__ import annotations

import threading


def run_at_once(work, n: int = 4) -> list:
    """Every exception the threads raised (BaseException included: none may escape unseen);
    fails if a thread is still running after 10 minutes."""
    barrier = threading.Barrier(n)
    errors: list = []

    def run(i):
        try:
            barrier.wait(timeout=60)
            work(i)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    return errors
