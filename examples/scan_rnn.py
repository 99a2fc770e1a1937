"""The tanh RNN of rnn.py, written with dq.scan: the loop stays one `scan` op whose body is
traced (and compiled) once, whatever the number of steps; its gradient is a reverse scan.

    python examples/scan_rnn.py

h_0 = 0,  h_t = tanh(x_t Wx + h_{t-1} Wh + b),  loss = mean((h_T Wo - y)^2)
"""

import numpy as np
from _support import check_gradients, jit_value_and_grad, sequence_task, train

import dlvm_eq as dq

STEPS, BATCH, FEATURES, HIDDEN = 64, 32, 4, 16


def loss(wx, wh, b, wo, y, xs):
    def step(h, x):  # closes over wx, wh, b: they become the scan's `with` operands
        h = dq.tanh(x @ wx + h @ wh + b)
        return h, None

    h, _ = dq.scan(step, dq.zeros((xs.shape[1], wh.shape[0]), wh.dtype), xs)
    return dq.mean(dq.square(h @ wo - y))


def numpy_loss(wx, wh, b, wo, y, xs):
    h = np.zeros((xs.shape[1], wh.shape[0]))
    for x in xs:
        h = np.tanh(x @ wx + h @ wh + b)
    return np.mean(np.square(h @ wo - y))


def main(train_steps: int = 40, lr: float = 0.2):
    rng = np.random.default_rng(0)
    f32 = lambda *shape: (0.4 * rng.standard_normal(shape)).astype(np.float32)
    xs, y = sequence_task(rng, BATCH, FEATURES, STEPS)
    xs = np.stack(xs)  # (steps, batch, features): scanned along axis 0
    # small recurrent weights: a contracting RNN, whose float64 central differences (step
    # 1e-3) are accurate over many steps (0.4 x randn makes 16 x 16 chaotic)
    wh = (0.05 * rng.standard_normal((HIDDEN, HIDDEN))).astype(np.float32)
    params = [f32(FEATURES, HIDDEN), wh, np.zeros(HIDDEN, np.float32)]
    params.append(f32(HIDDEN, 1))
    args = (*params, y, xs)

    ir = dq.make_ir(loss)(*args)
    ops = [i.op for f in ir.functions.values() for i in f.body]
    print(f"{STEPS} time steps as {ops.count('scan')} scan op ({ops.count('tanh')} tanh in the IR)")
    print(next(line.strip() for line in str(ir).splitlines() if "= scan" in line))

    step, target = jit_value_and_grad(loss, (0, 1, 2, 3), args)
    _, grads = step(*args)
    check_gradients(("wx", "wh", "b", "wo"), grads, numpy_loss, args, rng)
    train(step, params, (y, xs), train_steps, lr, target)


if __name__ == "__main__":
    main()
