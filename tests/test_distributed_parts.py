"""The parts of dlvm_eq.distributed that need no Ray: how a batch is split and weighted, the
fixed-order combine, the transport of user errors, and the training loop. The sharded results
are computed in this process (the step on each shard) and combined as the workers' would be;
the oracle is the step on the whole batch."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.distributed.faults import RaisedInWorker
from dlvm_eq.distributed.reduction import combine
from dlvm_eq.distributed.sharding import batch_rows, shard_plan
from dlvm_eq.distributed.training import train
from dlvm_eq.errors import DlvmError, SourceError


def test_shards_are_contiguous_and_differ_by_at_most_one_row():
    assert shard_plan(10, 3).bounds == ((0, 4), (4, 7), (7, 10))
    assert shard_plan(13, 2).bounds == ((0, 7), (7, 13))
    assert shard_plan(2, 4).bounds == ((0, 1), (1, 2))  # no empty shard
    assert shard_plan(10, 3).weights("mean") == (0.4, 0.3, 0.3)
    assert shard_plan(10, 3).weights("sum") == (1.0, 1.0, 1.0)
    with pytest.raises(DlvmError, match="batch is empty"):
        shard_plan(0, 2)


def test_batch_arguments_must_agree_along_axis_0():
    x, y = np.zeros((5, 2)), np.zeros((4,))
    assert batch_rows((None, x, x), (1, 2)) == 5
    with pytest.raises(DlvmError, match="argument 1 has 5 rows, argument 2 has 4"):
        batch_rows((None, x, y), (1, 2))
    with pytest.raises(DlvmError, match="batch argument 0 is a scalar"):
        batch_rows((np.float32(1),), (0,))


def _sharded(fn, plan, reduction, params, *batch):
    """What data_parallel computes, in this process: fn on each shard, then the combine."""
    outputs = [fn(params, *shard) for shard in plan.slices(batch)]
    return combine(outputs, plan.weights(reduction))


def _assert_close(got, want, rtol=1e-12):
    got_leaves, got_tree = dq.tree_flatten(got)
    want_leaves, want_tree = dq.tree_flatten(want)
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves):
        assert type(g) is type(w) and np.asarray(g).dtype == np.asarray(w).dtype
        np.testing.assert_allclose(g, w, rtol=rtol)


def mean_loss(params, x, y):
    return dq.mean(dq.square(dq.tanh(x @ params["w"]) - y))


def summed_loss(params, x, y):
    return dq.sum(dq.square(x @ params[0] + params[1] - y))


@pytest.mark.parametrize("workers", [2, 3, 5])
def test_mean_weights_give_the_whole_batch_mean(workers):
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((3, 2))}
    x, y = rng.standard_normal((11, 3)), rng.standard_normal((11, 2))
    f = dq.value_and_grad(mean_loss)
    _assert_close(_sharded(f, shard_plan(11, workers), "mean", params, x, y), f(params, x, y))


def test_sum_weights_add_a_summed_loss_and_mean_weights_would_not():
    rng = np.random.default_rng(1)
    params = (rng.standard_normal((3, 2)), rng.standard_normal(2))
    x, y = rng.standard_normal((7, 3)), rng.standard_normal((7, 2))
    f = dq.value_and_grad(summed_loss)
    plan = shard_plan(7, 2)
    want = f(params, x, y)
    _assert_close(_sharded(f, plan, "sum", params, x, y), want)
    wrong_value, _ = _sharded(f, plan, "mean", params, x, y)
    assert not np.isclose(wrong_value, want[0], rtol=1e-3)


def test_combine_is_fixed_order_float64_and_keeps_dtypes():
    a = (np.float32(1e8), [np.array([1.0, 2.0], np.float32)])
    b = (np.float32(1.0), [np.array([3.0, 4.0], np.float32)])
    c = (np.float32(-1e8), [np.array([5.0, 6.0], np.float32)])
    value, (g,) = combine([a, b, c], (1.0, 1.0, 1.0))
    # float32 left to right would lose the 1.0 against 1e8; float64 keeps it
    assert value == np.float32(1.0) and type(value) is np.float32
    assert g.dtype == np.float32 and g.tolist() == [9.0, 12.0]
    assert combine([a, b, c], (1.0, 1.0, 1.0))[0].tobytes() == value.tobytes()
    with pytest.raises(DlvmError, match="only float outputs"):
        combine([np.array([1], np.int32)], (1.0,))


def test_a_user_error_travels_as_itself():
    error = SourceError("expected a type", "model.dl", 3, 7, "  %x = add %a")
    plain = pickle.loads(pickle.dumps(error))  # what Ray would do with the exception
    assert str(plain) != str(error)  # SourceError renders its message twice
    carried = pickle.loads(pickle.dumps(RaisedInWorker.capture(error))).rebuild()
    assert type(carried) is SourceError and str(carried) == str(error)
    assert (carried.filename, carried.line, carried.column) == ("model.dl", 3, 7)


def test_train_runs_the_update_on_the_step_gradients():
    rng = np.random.default_rng(2)
    params = {"w": rng.standard_normal((3, 2))}
    data = [(rng.standard_normal((8, 3)), rng.standard_normal((8, 2))) for _ in range(3)]
    f = dq.value_and_grad(mean_loss)
    got, losses = train(f, params, data, dq.optim.momentum(0.1, beta=0.5))
    want, velocity = params["w"], np.zeros_like(params["w"])
    for i, (x, y) in enumerate(data):  # the loop by hand, the state carried along
        value, grads = f({"w": want}, x, y)
        assert losses[i] == float(value)
        velocity = 0.5 * velocity + grads["w"]
        want = want - 0.1 * velocity
    np.testing.assert_allclose(got["w"], want, rtol=1e-12)


def test_import_dlvm_eq_does_not_import_ray():
    code = "import sys, dlvm_eq; assert 'ray' not in sys.modules; dlvm_eq.distributed"
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        timeout=120,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_compiled_step_pickles_as_its_function_and_compiles_again():
    cloudpickle = pytest.importorskip("ray.cloudpickle")  # what Ray sends actors with
    rng = np.random.default_rng(3)
    params = {"w": rng.standard_normal((3, 2))}
    x, y = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    step = dq.jit(dq.value_and_grad(mean_loss))
    want = step(params, x, y)  # compiled: holds native code and locks
    copy = cloudpickle.loads(cloudpickle.dumps(step))
    assert copy.cache_size() == 0 and copy.target == step.target
    _assert_close(copy(params, x, y), want, rtol=0)


def _run_as_ray_does(worker, *args):
    """worker.run called from a frame of a file outside dlvm_eq and the user's code, as Ray's
    worker loop calls it in a worker process."""
    code = compile("result = worker.run(*args)", "/opt/ray/_private/function_manager.py", "exec")
    scope = {"worker": worker, "args": args}
    exec(code, scope)
    return scope["result"]


def test_a_bundled_models_shape_error_in_a_worker_names_the_drivers_line():
    # the loss is dlvm_eq's own (models/mlp.py): no frame of it is the user's, so in one process
    # the error names the user's call; in a worker it names the driver's line it was given
    from dlvm_eq.distributed.worker import ShardWorker
    from dlvm_eq.models import mlp

    params = mlp.init_params([5, 4, 3])
    bad = (params[0][:4],) + tuple(params[1:])  # 5 inputs, 4 weight rows
    x, y = np.ones((6, 5), np.float32), np.eye(3, dtype=np.float32)[[0, 1, 2, 0, 1, 2]]
    step = dq.value_and_grad(mlp.loss, argnums=(0, 1, 2, 3))
    driver_line = ("/home/user/train.py", 42, 9)
    out = _run_as_ray_does(ShardWorker(step), bad, (len(bad), len(bad) + 1), (x, y), driver_line)
    assert isinstance(out, RaisedInWorker)
    error = out.rebuild()
    assert isinstance(error, dq.ShapeError)
    assert str(error).startswith("/home/user/train.py:42:9: error: ")
    assert "function_manager" not in str(error) and error.location == driver_line
    with pytest.raises(dq.ShapeError) as single:
        step(*bad, x, y)
    assert str(single.value).startswith(f"{__file__}:")  # one process: the user's line

    def message(e):  # the first line after the location (the source line differs)
        return str(e).split(": error: ", 1)[1].splitlines()[0]

    assert message(single.value) == message(error)
