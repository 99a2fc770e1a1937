"""Getting started: a model trained in ten lines (docs/getting-started.md includes the part
between the markers). Run from the repository root: `python docs/tutorials/ten_lines.py`;
tests/test_tutorials.py runs it and checks what the page claims."""

# --8<-- [start:model]
import numpy as np
from sklearn.datasets import load_digits

import dlvm_eq as dq

x, labels = load_digits(return_X_y=True)  # 1797 8x8 images of digits
x, y = (x / 16).astype(np.float32), np.eye(10, dtype=np.float32)[labels]
params = {"w": np.zeros((64, 10), np.float32), "b": np.zeros(10, np.float32)}
opt = dq.optim.adam(0.05)


def loss(p, x, y):
    return dq.mean(dq.softmax_cross_entropy(x @ p["w"] + p["b"], y))


@dq.jit  # traced, optimized in the e-graph and compiled on the first call
def step(p, state, x, y):
    value, grads = dq.value_and_grad(loss)(p, x, y)
    p, state = opt.update(grads, state, p)
    return p, state, value


state = opt.init(params)
for i in range(100):
    params, state, value = step(params, state, x, y)
# --8<-- [end:model]

accuracy = float(np.mean(np.argmax(x @ params["w"] + params["b"], axis=1) == labels))
print(f"loss {float(value):.3f}, train accuracy {accuracy:.1%}")
assert float(value) < 0.25 and accuracy > 0.95
assert step.cache_size() == 1  # compiled once, for these shapes and dtypes
