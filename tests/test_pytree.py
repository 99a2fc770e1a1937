"""Pytrees as JAX has them: tree_flatten/unflatten/map/leaves on nested dicts, lists, tuples,
namedtuples and None, and jit / grad / value_and_grad / vjp taking and returning them (argnums
selects whole subtrees; gradients have the parameters' structure; the jit cache keys on the
structure). Oracles: jax.tree_util where installed, float64 numpy, central differences."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dlvm_eq as dq
from dlvm_eq.errors import DlvmError

RNG = np.random.default_rng(11)
Layer = namedtuple("Layer", "w b")


def trees(leaf=st.integers(-9, 9)):
    keys = st.text("abcxyz", min_size=1, max_size=3)
    return st.recursive(
        st.one_of(leaf, st.none()),
        lambda sub: st.one_of(
            st.lists(sub, max_size=3),
            st.lists(sub, max_size=3).map(tuple),
            st.dictionaries(keys, sub, max_size=3),
            st.tuples(sub, sub).map(lambda p: Layer(*p)),
        ),
        max_leaves=8,
    )


# ------------------------------------------------------------------ the tree library


def test_flatten_sorts_dict_keys_and_drops_none():
    tree = {"b": [1, None, (2,)], "a": Layer(w=3, b={"z": 4, "y": 5})}
    leaves, treedef = dq.tree_flatten(tree)
    assert leaves == [3, 5, 4, 1, 2]
    assert repr(treedef) == "PyTreeDef({'a': Layer(w=*, b={'y': *, 'z': *}), 'b': [*, None, (*,)]})"
    back = dq.tree_unflatten(treedef, leaves)
    assert back == tree and isinstance(back["a"], Layer) and list(back["a"].b) == ["y", "z"]


@settings(max_examples=60)
@given(trees())
def test_unflatten_inverts_flatten(tree):
    leaves, treedef = dq.tree_flatten(tree)
    assert dq.tree_unflatten(treedef, leaves) == tree
    assert dq.tree_leaves(tree) == leaves and dq.tree_structure(tree) == treedef
    assert treedef.num_leaves == len(leaves)


@settings(max_examples=60)
@given(trees(), trees())
def test_leaf_order_and_structure_agree_with_jax(tree, other):
    jtu = pytest.importorskip("jax.tree_util")
    leaves, treedef = dq.tree_flatten(tree)
    j_leaves, j_def = jtu.tree_flatten(tree)
    assert leaves == j_leaves
    # two structures are equal in one library exactly when they are in the other
    assert (dq.tree_structure(other) == treedef) == (jtu.tree_structure(other) == j_def)
    same = dq.tree_map(lambda x: x + 1, tree)
    assert dq.tree_structure(same) == treedef and jtu.tree_structure(same) == j_def
    assert dq.tree_unflatten(treedef, [x * 2 for x in leaves]) == jtu.tree_unflatten(
        j_def, [x * 2 for x in leaves]
    )


def test_treedefs_compare_by_structure_and_hash():
    a = dq.tree_structure({"w": 1, "b": (2, 3)})
    assert a == dq.tree_structure({"b": (7, 8), "w": 9}) and hash(a) == hash(
        dq.tree_structure({"b": (7, 8), "w": 9})
    )
    assert a != dq.tree_structure({"w": 1, "c": (2, 3)})  # another key
    assert a != dq.tree_structure({"w": 1, "b": [2, 3]})  # list, not tuple
    assert dq.tree_structure(Layer(1, 2)) != dq.tree_structure((1, 2))


def test_tree_map_over_several_trees():
    p = {"w": np.ones(2), "b": [np.zeros(1), None]}
    g = {"b": [np.full(1, 4.0), None], "w": np.full(2, 2.0)}
    out = dq.tree_map(lambda a, b: a - 0.5 * b, p, g)
    np.testing.assert_array_equal(out["w"], [0.0, 0.0])
    np.testing.assert_array_equal(out["b"][0], [-2.0])
    assert out["b"][1] is None
    with pytest.raises(DlvmError, match=r"tree_map: tree 1 has structure"):
        dq.tree_map(lambda a, b: a, p, {"w": 1, "b": 2})
    assert dq.tree_map(lambda x: x, [[1, 2], 3], is_leaf=lambda x: isinstance(x, list)) == [
        [1, 2],
        3,
    ]


def test_unflatten_checks_the_leaf_count():
    with pytest.raises(DlvmError, match="has 2 leaves, got 3"):
        dq.tree_unflatten(dq.tree_structure((1, 2)), [1, 2, 3])


# ------------------------------------------------------------------ jit


def mlp_loss(params, x, y):
    h = dq.tanh(x @ params["l1"].w + params["l1"].b)
    out = h @ params["l2"]["w"]
    return dq.mean(dq.square(out - y))


def mlp_loss_np(params, x, y):
    h = np.tanh(x @ params["l1"].w + params["l1"].b)
    return np.mean(np.square(h @ params["l2"]["w"] - y))


def mlp_grads_np(params, x, y):
    h = np.tanh(x @ params["l1"].w + params["l1"].b)
    d_out = 2 * (h @ params["l2"]["w"] - y) / y.size
    d_pre = (d_out @ params["l2"]["w"].T) * (1 - h * h)
    return {"l1": Layer(w=x.T @ d_pre, b=d_pre.sum(0)), "l2": {"w": h.T @ d_out}}


def make_params(dtype=np.float64):
    return {
        "l1": Layer(
            w=RNG.standard_normal((3, 4)).astype(dtype), b=RNG.standard_normal(4).astype(dtype)
        ),
        "l2": {"w": RNG.standard_normal((4, 2)).astype(dtype)},
    }


def assert_trees_close(a, b, **tol):
    assert dq.tree_structure(a) == dq.tree_structure(b)
    for x, y in zip(dq.tree_leaves(a), dq.tree_leaves(b)):
        np.testing.assert_allclose(x, y, **tol)


@pytest.mark.parametrize("target", ["interp", "cpu"])
def test_jit_takes_and_returns_pytrees(target):
    params, x = make_params(np.float32), RNG.standard_normal((5, 3)).astype(np.float32)

    def f(p, x):
        return {"h": x @ p["l1"].w + p["l1"].b, "pair": (dq.sum(x), None)}

    out = dq.jit(f, target=target)(params, x)
    assert dq.tree_structure(out) == dq.tree_structure({"h": 0, "pair": (0, None)})
    np.testing.assert_allclose(out["h"], x @ params["l1"].w + params["l1"].b, rtol=1e-5)
    np.testing.assert_allclose(out["pair"][0], x.sum(), rtol=1e-5)


def test_jit_cache_keys_on_the_tree_structure():
    f = dq.jit(lambda p: dq.sum(dq.tree_leaves(p)[0]) * 2.0, target="interp")
    a = np.arange(3.0, dtype=np.float32)
    assert f({"a": a}) == 6.0 and f({"a": a + 1}) == 12.0
    assert f.cache_size() == 1
    assert f({"b": a}) == 6.0  # same leaves, another key: another trace
    assert f([a]) == 6.0 and f((a,)) == 6.0  # list and tuple are distinct structures
    assert f.cache_size() == 4


@settings(max_examples=20)
@given(
    trees(
        leaf=st.lists(st.integers(1, 3), max_size=2).map(lambda shape: RNG.standard_normal(shape))
    ).filter(lambda t: dq.tree_leaves(t))
)
def test_jit_round_trips_drawn_trees(tree):
    out = dq.jit(lambda t: dq.tree_map(lambda a: a * 2.0 + 1.0, t), target="interp")(tree)
    assert_trees_close(out, dq.tree_map(lambda a: a * 2.0 + 1.0, tree), rtol=1e-12)


def test_ir_parameters_are_named_after_their_paths():
    ir = str(
        dq.make_ir(mlp_loss)(
            make_params(np.float32), np.zeros((5, 3), np.float32), np.zeros((5, 2), np.float32)
        )
    )
    assert (
        "%params_l1_w: <3 x 4 x f32>, %params_l1_b: <4 x f32>, %params_l2_w: <4 x 2 x f32>, "
        "%x: <5 x 3 x f32>" in ir
    )


def test_a_bad_leaf_is_named_by_its_path():
    x = np.zeros((5, 3), np.float32)
    params = {"l1": Layer(w="oops", b=np.zeros(4)), "l2": {"w": np.zeros((4, 2))}}
    with pytest.raises(
        DlvmError,
        match=r"jit: mlp_loss\(params, x, y\): argument params\['l1'\]\.w \(str 'oops'\) is not",
    ):
        dq.jit(mlp_loss)(params, x, x)
    with pytest.raises(DlvmError, match=r"argument params\['l1'\]\.w \(str 'oops'\) is not"):
        dq.value_and_grad(mlp_loss)(params, x, x)
    with pytest.raises(
        DlvmError, match=r"make_ir: <lambda>\(p\): argument p\[1\] \(object <object"
    ):
        dq.make_ir(lambda p: p[0])([np.zeros(2), object()])


# ------------------------------------------------------------------ differentiation


def central_difference_check(f, params, grads, eps=1e-6):
    """<grads, v> against (f(p + eps v) - f(p - eps v)) / 2 eps along a random v, in float64."""
    leaves, treedef = dq.tree_flatten(params)
    v = [RNG.standard_normal(np.shape(p)) for p in leaves]
    shifted = [
        dq.tree_unflatten(treedef, [p + s * eps * d for p, d in zip(leaves, v)]) for s in (1, -1)
    ]
    numeric = (f(shifted[0]) - f(shifted[1])) / (2 * eps)
    analytic = sum(np.sum(g * d) for g, d in zip(dq.tree_leaves(grads), v))
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("target", ["interp", "cpu"])
def test_jit_value_and_grad_of_nested_dict_params(target):
    params, x, y = make_params(), RNG.standard_normal((6, 3)), RNG.standard_normal((6, 2))
    step = dq.jit(dq.value_and_grad(mlp_loss), target=target)
    value, grads = step(params, x, y)
    np.testing.assert_allclose(value, mlp_loss_np(params, x, y), rtol=1e-10)
    assert isinstance(grads["l1"], Layer)
    assert_trees_close(grads, mlp_grads_np(params, x, y), rtol=1e-9, atol=1e-12)
    central_difference_check(lambda p: mlp_loss_np(p, x, y), params, grads)


def test_argnums_selects_whole_subtrees():
    params, x, y = make_params(), RNG.standard_normal((6, 3)), RNG.standard_normal((6, 2))

    def loss(l1, x, l2, y):
        return mlp_loss({"l1": l1, "l2": l2}, x, y)

    g_l2, g_x = dq.grad(loss, argnums=(2, 1))(params["l1"], x, params["l2"], y)
    expected = mlp_grads_np(params, x, y)
    assert_trees_close(g_l2, expected["l2"], rtol=1e-9)
    central_difference_check(lambda x_: mlp_loss_np(params, x_, y), x, g_x)
    g_l1 = dq.grad(loss)(params["l1"], x, params["l2"], y)  # a single argnum: no tuple
    assert isinstance(g_l1, Layer)
    assert_trees_close(g_l1, expected["l1"], rtol=1e-9)


def test_grad_inside_jit_with_a_pytree_update():
    params, x, y = make_params(), RNG.standard_normal((6, 3)), RNG.standard_normal((6, 2))

    @dq.jit(target="interp")
    def sgd_step(params, x, y):
        loss, grads = dq.value_and_grad(mlp_loss)(params, x, y)
        return dq.tree_map(lambda p, g: p - 0.1 * g, params, grads), loss

    new, loss = sgd_step(params, x, y)
    expected = dq.tree_map(lambda p, g: p - 0.1 * g, params, mlp_grads_np(params, x, y))
    assert_trees_close(new, expected, rtol=1e-9)
    np.testing.assert_allclose(loss, mlp_loss_np(params, x, y), rtol=1e-10)


def test_vjp_of_pytree_inputs_and_outputs():
    p = {"a": RNG.standard_normal(3), "n": np.int32(2), "b": [RNG.standard_normal(3)]}

    def f(p):
        return {"prod": p["a"] * p["b"][0], "s": dq.sum(dq.sin(p["a"]))}

    out, f_vjp = dq.vjp(f, p)
    np.testing.assert_allclose(out["prod"], p["a"] * p["b"][0])
    ct = {"prod": RNG.standard_normal(3), "s": 0.5}
    (g,) = f_vjp(ct)
    assert g["n"] is None
    np.testing.assert_allclose(g["a"], ct["prod"] * p["b"][0] + 0.5 * np.cos(p["a"]), rtol=1e-12)
    np.testing.assert_allclose(g["b"][0], ct["prod"] * p["a"], rtol=1e-12)
    with pytest.raises(DlvmError, match=r"expected 2 cotangent\(s\) in the output's structure"):
        f_vjp({"prod": ct["prod"]})
