"""Data-parallel steps on a local Ray instance (issue 15): two workers give the single-process
step's numbers on the whole batch (unequal shards, pytree parameters, float32 parameters as
separate arguments), 20 SGD steps give its losses, reruns are bitwise equal, a killed worker
is restarted and training ends where it would have, a user error in a worker is the same
DlvmError on the driver, and `dlvm-eq demo --workers 2` prints what one process prints and
exits. The oracle is the undistributed step in this process.

Ray starts once for the module (`num_cpus=2`, `address="local"`: never another machine) and
stops in the fixture's teardown; every wait on a worker has a time limit. Sharding, weights
(mean and sum losses) and the combine without Ray: test_distributed_parts.py.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import dlvm_eq as dq  # noqa: E402
from dlvm_eq.distributed import data_parallel, start_local, train  # noqa: E402
from dlvm_eq.errors import DlvmError, ShapeError  # noqa: E402
from dlvm_eq.models import mlp  # noqa: E402

# under pytest-xdist (`make test`) one worker runs this module and the Ray tutorial, so that one
# local Ray instance runs at a time (tests/test_tutorials.py)
pytestmark = pytest.mark.xdist_group("ray")

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 120  # per step: a hang, not a slow machine (the first step compiles)
ROWS = 13  # two workers get 7 and 6 rows: unequal shards


@pytest.fixture(scope="module")
def local_ray():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started = start_local(num_cpus=2)
    yield started
    started.shutdown()


def make_loss():
    """Defined in a function so that Ray pickles it by value (the workers cannot import this
    test module by name)."""

    def dict_loss(params, x, y):
        h = dq.tanh(x @ params["w1"] + params["b1"])
        return dq.mean(dq.softmax_cross_entropy(h @ params["w2"], y))

    return dict_loss


DICT_LOSS = make_loss()


def dict_problem(dtype=np.float64, rows=ROWS, seed=0):
    """Parameters, and a batch labelled by a fixed teacher (so that SGD has something to learn)."""
    rng = np.random.default_rng(seed)
    params = {
        "w1": rng.standard_normal((5, 4)) * 0.5,
        "b1": rng.standard_normal(4) * 0.1,
        "w2": rng.standard_normal((4, 3)) * 0.5,
    }
    params = {k: v.astype(dtype) for k, v in params.items()}
    x = rng.standard_normal((rows, 5)).astype(dtype)
    teacher = np.random.default_rng(99).standard_normal((5, 3))
    y = np.eye(3, dtype=dtype)[np.argmax(x @ teacher, axis=1)]
    return params, x, y


def batches(n, seed=1):
    return [dict_problem(seed=seed + i)[1:] for i in range(n)]


def assert_trees_close(got, want, rtol):
    got_leaves, got_tree = dq.tree_flatten(got)
    want_leaves, want_tree = dq.tree_flatten(want)
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves):
        assert np.asarray(g).dtype == np.asarray(w).dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=0)


def assert_trees_equal(got, want):
    got_leaves, got_tree = dq.tree_flatten(got)
    want_leaves, want_tree = dq.tree_flatten(want)
    assert got_tree == want_tree
    assert all(np.array_equal(g, w) for g, w in zip(got_leaves, want_leaves))


def compile_the_shards_programs():
    """The workers' programs (shards of 7 and 6 rows) into the disk cache the workers share:
    compiled one after the other here rather than at once in two workers on two cores (what
    made a first step take minutes on a loaded machine). A worker still compiles its own
    program, from the cache's optimized IR, plans and object code."""
    step = dq.value_and_grad(DICT_LOSS, argnums=0)
    for rows in ((ROWS + 1) // 2, ROWS // 2):
        step(*dict_problem(rows=rows))


@pytest.fixture(scope="class")
def dict_step(local_ray):
    """Two workers, shared by the tests of one class (starting workers and compiling in them is
    what takes time). They hold all of Ray's CPUs: other tests start theirs after the class."""
    compile_the_shards_programs()
    with data_parallel(
        dq.value_and_grad(DICT_LOSS, argnums=0), batch_argnums=(1, 2), workers=2, timeout_s=LIMIT_S
    ) as step:
        yield step


class TestTwoWorkersOfOneStep:
    """One step on two workers: the single-process numbers, training, faults, errors."""

    def test_equals_the_whole_batch_with_pytree_params_unequal_shards(self, dict_step):
        params, x, y = dict_problem()
        want = dq.value_and_grad(DICT_LOSS, argnums=0)(params, x, y)
        got = dict_step(params, x, y)
        assert_trees_close(got, want, rtol=1e-5)
        assert isinstance(got[1], dict) and sorted(got[1]) == ["b1", "w1", "w2"]

    def test_twenty_sgd_steps_follow_one_process_and_rerun_bitwise(self, dict_step):
        params, _, _ = dict_problem()
        data = batches(20)
        single = dq.value_and_grad(DICT_LOSS, argnums=0)
        want_params, want_losses = train(single, params, data, dq.optim.sgd(0.5))
        got_params, got_losses = train(dict_step, params, data, dq.optim.sgd(0.5))
        np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5, atol=0)
        assert got_losses[-1] < 0.8 * got_losses[0]  # it trained
        assert_trees_close(got_params, want_params, rtol=1e-5)
        again_params, again_losses = train(dict_step, params, data, dq.optim.sgd(0.5))
        assert again_losses == got_losses
        assert_trees_equal(again_params, got_params)

    def test_killing_a_worker_mid_training_ends_with_the_same_loss(self, dict_step):
        params, _, _ = dict_problem()
        data = batches(10, seed=40)
        want_params, want_losses = train(dict_step, params, data, dq.optim.sgd(0.5))
        before = dict_step.worker_pids()

        def kill_worker_one(i, value):
            if i == 4:
                os.kill(before[1], signal.SIGKILL)

        got_params, got_losses = train(
            dict_step, params, data, dq.optim.sgd(0.5), on_step=kill_worker_one
        )
        after = dict_step.worker_pids()
        assert after[0] == before[0] and after[1] != before[1]  # Ray restarted worker 1
        assert got_losses == want_losses
        assert_trees_equal(got_params, want_params)

    def test_a_user_error_in_a_worker_is_the_same_dlvm_error(self, dict_step):
        params, x, y = dict_problem()
        bad = {**params, "w1": params["w1"][:4]}  # 5 inputs, 4 weight rows
        with pytest.raises(DlvmError) as single:
            dq.value_and_grad(DICT_LOSS, argnums=0)(bad, x, y)
        with pytest.raises(DlvmError) as distributed:
            dict_step(bad, x, y)
        assert type(distributed.value) is type(single.value) is ShapeError
        # the same message (the shard has 7 rows where the whole batch has 13)
        want = str(single.value).replace("(13, 5)", "(7, 5)").replace("<13 x", "<7 x")
        assert str(distributed.value) == want
        value, _ = dict_step(params, x, y)  # the workers are still usable
        assert np.isfinite(value)

    def test_data_parallel_rejects_bad_arguments(self, dict_step):
        params, x, y = dict_problem()
        with pytest.raises(DlvmError, match="disagree along axis 0"):
            dict_step(params, x, y[:5])
        with pytest.raises(DlvmError, match="name argument 2, but the step got 2"):
            dict_step(params, x)
        with pytest.raises(DlvmError, match="reduction must be one of"):
            data_parallel(DICT_LOSS, batch_argnums=1, reduction="max")
        with pytest.raises(DlvmError, match="batch_argnums must be"):
            data_parallel(DICT_LOSS, batch_argnums=(1, 1))


def test_a_worker_dying_inside_a_step_is_retried_and_logged(local_ray, tmp_path, caplog):
    marker = str(tmp_path / "died")
    base = dq.value_and_grad(DICT_LOSS, argnums=0)

    def dies_once(params, x, y):
        try:  # exactly one worker process creates the marker, and kills itself mid-step
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return base(params, x, y)
        os.kill(os.getpid(), signal.SIGKILL)

    params, x, y = dict_problem()
    with (
        caplog.at_level(logging.WARNING, logger="dlvm_eq.distributed"),
        data_parallel(dies_once, batch_argnums=(1, 2), workers=2, timeout_s=LIMIT_S) as step,
    ):
        got = step(params, x, y)
    assert_trees_close(got, base(params, x, y), rtol=1e-5)
    died = [r for r in caplog.records if "died during step 1" in r.getMessage()]
    assert len(died) == 1 and "retry 1 of 3" in died[0].getMessage()


def _printed(text: str) -> tuple[str, str]:
    """The demo's loss curve (the line after its heading) and its accuracy line."""
    lines = [line.strip() for line in text.splitlines()]
    curve = lines[lines.index("loss curve (per epoch):") + 1]
    return curve, next(line for line in lines if line.startswith("test accuracy:"))


def test_the_demo_on_two_workers_prints_what_one_process_prints(local_ray):
    """`dlvm-eq demo --workers 2` in a process of its own: it starts its own local Ray, trains
    the float32 MLP (four parameter arguments, batch 128 in shards of 64) with the compiled
    step pickled to the workers, prints the single process's loss curve and accuracy, and
    exits (a hang at exit would be caught by the time limit)."""
    from dlvm_eq.models import demo

    single = io.StringIO()
    demo.run(epochs=1, out=single)
    # the workers' program (shards of 64 rows) into the disk cache the subprocess inherits:
    # compiled once here rather than twice at once in the two workers
    params = mlp.init_params([64, demo.HIDDEN, 10])
    x = np.zeros((demo.BATCH // 2, 64), np.float32)
    step = dq.jit(dq.value_and_grad(mlp.loss, argnums=(0, 1, 2, 3)))
    step(*params, x, demo.one_hot([0] * len(x)))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from dlvm_eq.cli import main; "
            "sys.exit(main(['demo', '--workers', '2', '--epochs', '1']))",
        ],
        cwd=ROOT,
        env=env,
        timeout=240,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "training data-parallel on 2 Ray worker(s)" in done.stdout
    assert _printed(done.stdout) == _printed(single.getvalue())
