"""The CNN demo's dropout and batch norm (issue 31): the model's training and evaluation modes
against a numpy forward pass, the jitted step's state (optimizer, running statistics, key),
a short training run's accuracy, and the command's options."""

from __future__ import annotations

import io

import numpy as np
import pytest

import dlvm_eq as dq
from dlvm_eq.cli import main
from dlvm_eq.models import cnn, cnn_demo

R = dq.random


def conv_same(h, w):  # 3x3, padding 1, NCHW/OIHW, as torch's conv2d, no bias
    n, c, hh, ww = h.shape
    hp = np.pad(h, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], hh, ww))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", hp[:, :, i : i + hh, j : j + ww], w[:, :, i, j])
    return out


def pool(h):
    n, c, hh, ww = h.shape
    return h.reshape(n, c, hh // 2, 2, ww // 2, 2).max(axis=(3, 5))


def numpy_forward(p, x, norm, training, keep=None, rate=0.0):
    """(logits, new running statistics) in float64, torch's batch norm (biased variance to
    normalize, unbiased in the running variance, momentum 0.1)."""
    h, new = x.astype(np.float64), {}
    for i in (1, 2):
        h = conv_same(h, p[f"c{i}"])
        mean, var = norm[f"bn{i}"]
        if training:
            m, v = h.mean(axis=(0, 2, 3)), h.var(axis=(0, 2, 3))
            count = h.size / h.shape[1]
            new[f"bn{i}"] = (0.9 * mean + 0.1 * m, 0.9 * var + 0.1 * v * count / (count - 1))
            mean, var = m, v
        h = (h - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5)
        h = h * p[f"g{i}"][None, :, None, None] + p[f"b{i}"][None, :, None, None]
        h = pool(np.maximum(h, 0))
    h = h.reshape(len(x), -1)
    if keep is not None:
        h = np.where(keep, h / (1 - rate), 0)
    return h @ p["w"] + p["b"], new


def _model(seed=1):
    p = cnn.init_params(seed=seed, batch_norm=True)
    rng = np.random.default_rng(seed)
    p["g1"] = (1 + 0.1 * rng.standard_normal(p["g1"].shape)).astype(np.float32)
    p["b2"] = (0.1 * rng.standard_normal(p["b2"].shape)).astype(np.float32)
    x = rng.random((6, 1, 8, 8), dtype=np.float32)
    norm = cnn.norm_state()
    norm["bn1"] = norm["bn1"]._replace(mean=np.full(32, 0.2, np.float32))
    return p, x, norm


@pytest.mark.parametrize("target", ["interp", "cpu"])
def test_training_and_evaluation_modes_match_numpy(target):
    p, x, norm = _model()
    onehot = np.eye(10, dtype=np.float32)[np.arange(6) % 10]
    key, rate = R.key(4), 0.25
    value, new = dq.jit(lambda p, n, x, y, k: cnn.train_loss(p, n, x, y, k, rate), target=target)(
        p, norm, x, onehot, key
    )
    keep = np.asarray(R.bernoulli(key, 1 - rate, (6, 64 * 4)))
    logits, want_new = numpy_forward(p, x, norm, True, keep, rate)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(value, -(onehot * log_softmax).sum(axis=1).mean(), rtol=1e-4)
    for name, (mean, var) in want_new.items():
        np.testing.assert_allclose(new[name].mean, mean, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(new[name].var, var, rtol=1e-4, atol=1e-5)
    evaluated = dq.jit(cnn.logits, target=target)(p, x, norm)
    want = numpy_forward(p, x, {k: (s.mean, s.var) for k, s in norm.items()}, False)[0]
    np.testing.assert_allclose(evaluated, want, rtol=1e-4, atol=1e-4)


def test_the_step_carries_statistics_and_a_fresh_key():
    p, x, norm = _model(2)
    onehot = np.eye(10, dtype=np.float32)[np.arange(6) % 10]
    optimizer = dq.optim.adam(1e-3)
    step = cnn_demo.regularized_step(optimizer, 0.5, "cpu")
    state = {"opt": optimizer.init(p), "norm": norm, "key": R.key(7)}
    value1, p1, state1 = step(p, state, x, onehot)
    np.testing.assert_array_equal(state1["key"], R.split(R.key(7))[0])
    used = R.split(R.key(7))[1]
    want, _ = dq.jit(lambda p, n, x, y, k: cnn.train_loss(p, n, x, y, k, 0.5))(
        p, norm, x, onehot, used
    )
    np.testing.assert_allclose(value1, want, rtol=1e-5)
    assert not np.allclose(state1["norm"]["bn2"].mean, norm["bn2"].mean)
    value2, _, state2 = step(p, state1, x, onehot)  # same params, another dropout mask
    assert value2 != value1
    assert not np.array_equal(state2["key"], state1["key"])


def test_a_short_run_with_dropout_and_batch_norm_reaches_98_percent():
    out = io.StringIO()
    result = cnn_demo.run(epochs=12, dropout=0.25, batch_norm=True, out=out)
    assert result["accuracy"] >= 0.98
    assert result["losses"][-1] < result["losses"][0] / 10
    assert "batch norm" in out.getvalue() and "dropout 0.25" in out.getvalue()
    stats = result["state"]["norm"]["bn1"]  # moved from torch's initial 0 and 1
    assert np.abs(stats.mean).max() > 0.01 and not np.allclose(stats.var, 1.0)


def test_demo_command_options(capsys):
    assert main(["demo", "--model", "mlp", "--dropout", "0.2"]) == 1
    assert "--dropout and --batch-norm train the CNN demo only" in capsys.readouterr().err
    assert main(["demo", "--model", "cnn", "--dropout", "1.5"]) == 1
    assert "--dropout must be in [0, 1), got 1.5" in capsys.readouterr().err
    assert (
        main(["demo", "--model", "cnn", "--epochs", "1", "--dropout", "0.3", "--batch-norm"]) == 0
    )
    out = capsys.readouterr().out
    assert "dropout 0.3" in out and "batch norm" in out and "test accuracy" in out
