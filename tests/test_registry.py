"""The op registry (dlvm_eq/ir/registry/): one place per op, checked against the rule files
both ways, and the layers that read it agree with it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import sympy as sp

import dlvm_eq as dq
from dlvm_eq.egraph import registry_check
from dlvm_eq.egraph.registry_check import registry_gaps
from dlvm_eq.egraph.rulefiles import rule_file
from dlvm_eq.egraph.serialized import Graph
from dlvm_eq.ir import ops as ir_ops
from dlvm_eq.ir.ops import CONTROL, ELEMENTWISE_KINDS, OPS
from dlvm_eq.ir.registry import REGISTRY
from dlvm_eq.ir.types import F64

SCHEMA = rule_file("schema.egg").read_text()
ADJOINT = rule_file("adjoint.egg").read_text()


def test_registry_schema_and_adjoint_rules_agree():
    assert registry_gaps() == []


def test_the_op_table_is_the_registry():
    assert OPS is REGISTRY
    assert list(OPS)[:3] == ["negate", "exp", "log"]  # fusion.egg's generated order


def test_an_op_missing_from_the_schema_is_named():
    schema = SCHEMA.replace("(Softplus Term)", "")
    assert "op softplus: no constructor (Softplus ...) in schema.egg" in registry_gaps(schema)


def test_a_schema_constructor_without_op_is_named():
    schema = SCHEMA.replace("(Erf Term)", "(Erf Term) (Gelu Term)")
    gaps = registry_gaps(schema)
    assert "schema.egg constructor Gelu is no op of the registry" in gaps
    assert "schema.egg constructor Gelu has no shape/dtype analysis rule" in gaps


def test_a_missing_adjoint_rule_is_named():
    lines = [ln for ln in ADJOINT.splitlines() if "(Adjoint 0 (Tanh " not in ln]
    gaps = registry_gaps(adjoint="\n".join(lines))
    assert "op tanh: no rule (Adjoint 0 (Tanh ...) g) in adjoint.egg" in gaps


def test_a_rule_for_a_nondifferentiable_operand_is_named():
    extra = ADJOINT + "\n(rewrite (Adjoint 0 (StopGradient x) g) g :ruleset adjoint)\n"
    gaps = registry_gaps(adjoint=extra)
    assert any("operand 0 of StopGradient" in g and "non-differentiable" in g for g in gaps)
    extra = ADJOINT + "\n(rewrite (Adjoint 0 (Frobnicate x) g) g :ruleset adjoint)\n"
    assert "adjoint.egg: a rule for Frobnicate, which no op of the registry has" in registry_gaps(
        adjoint=extra
    )


def test_an_op_without_its_layers_fields_is_named(monkeypatch):
    broken = dict(OPS)
    broken["exp"] = dataclasses.replace(OPS["exp"], batch=None, scalar=None)
    monkeypatch.setattr(registry_check, "OPS", broken)
    gaps = registry_gaps()
    assert "op exp: no batching rule (vmap)" in gaps
    assert "op exp: unary without a kernel formula (scalar)" in gaps
    broken["dot"] = dataclasses.replace(OPS["dot"], symbolic=None)
    broken["xor"] = dataclasses.replace(OPS["xor"], scalar=None)
    gaps = registry_gaps()
    assert "op dot: no meaning on sympy arrays (symbolic) for verify" in gaps
    assert "op xor: binary without a kernel formula (scalar)" in gaps


def test_window_and_attention_meanings_live_in_the_registry(monkeypatch):
    """verify reads the window ops' and attention's sympy meaning from their specs (the
    registry), and registry_check names an op that lacks it."""
    from dlvm_eq.verify.symbolic import SYMBOLIC

    for name in ("conv2d", "maxPool2d", "maxPool2dGather", "avgPool2dBackward", "attention"):
        assert OPS[name].symbolic is not None, name
        assert name in SYMBOLIC, name
    broken = dict(OPS)
    for name in ("maxPool2d", "attention"):
        broken[name] = dataclasses.replace(OPS[name], symbolic=None)
    monkeypatch.setattr(registry_check, "OPS", broken)
    gaps = registry_gaps()
    assert "op maxPool2d: no meaning on sympy arrays (symbolic) for verify" in gaps
    assert "op attention: no meaning on sympy arrays (symbolic) for verify" in gaps


ELEMENTWISE = [n for n, s in OPS.items() if s.kind in ELEMENTWISE_KINDS and s.arity in (1, 2)]


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_sympy_meaning_agrees_with_the_interpreter(name):
    """The registry's two semantics of one op, at sample points (where sympy has one)."""
    spec = OPS[name]
    if spec.sympy is None:
        pytest.skip(f"{name}'s sympy meaning lives in verify/symbolic.py")
    rng = np.random.default_rng(len(name))
    boolean = spec.kind == "logic"
    for _ in range(5):
        if boolean:
            xs = [bool(rng.integers(0, 2)) for _ in range(spec.arity)]
            symbolic = bool(spec.sympy(sp, *(sp.true if x else sp.false for x in xs)))
        else:
            # drawn from a few values, so that comparisons see equal operands too
            xs = [float(rng.choice([0.25, 0.5, 1.25])) for _ in range(spec.arity)]
            value = spec.sympy(sp, *map(sp.Float, xs))
            symbolic = bool(value) if spec.kind == "compare" else complex(value)
        numeric = spec.evaluate([np.asarray(x) for x in xs], {})
        np.testing.assert_allclose(complex(numeric), symbolic, rtol=1e-12)


@pytest.mark.parametrize("name", [n for n in ELEMENTWISE if OPS[n].dsl])
def test_dsl_names_bind_their_op(name):
    spec = OPS[name]
    rng = np.random.default_rng(1)
    args = [rng.uniform(0.2, 1.5, size=3) for _ in range(spec.arity)]
    if spec.kind == "logic":
        args = [a > 0.8 for a in args]
    for dsl_name in spec.dsl:
        got = getattr(dq, dsl_name)(*args)
        np.testing.assert_array_equal(got, spec.evaluate(args, {}))


def test_the_layers_read_the_registry():
    from dlvm_eq.codegen.kernels.spec import DLVM_NAMES, UNARY_OPS
    from dlvm_eq.codegen.llvm.lower_expr import UNARY_LOWER
    from dlvm_eq.extract.target_cost import flops_per_element
    from dlvm_eq.verify.symbolic import SYMBOLIC

    # control flow has no sympy semantics yet (verify covers straight-line programs)
    assert set(SYMBOLIC) == {n for n, s in OPS.items() if s.kind != CONTROL}
    for name, spec in OPS.items():
        if spec.arity == 1 and spec.kind in ELEMENTWISE_KINDS:
            assert spec.kernel in UNARY_LOWER and spec.kernel in UNARY_OPS
        if spec.kernel and spec.kernel != name:
            assert DLVM_NAMES[name] == spec.kernel
    assert flops_per_element("Exp") == 20 and flops_per_element("Divide") == 4
    assert flops_per_element("Add") == 1
    from dlvm_eq.extract.target_cost import MATMULS, VIEWS

    assert {"Broadcast", "ShapeCast", "PadShape", "SqueezeShape"} == VIEWS
    assert {"Dot", "Gemm"} == MATMULS  # Gemm: the e-graph's dot of transposed reads
    assert ir_ops.REDUCE_COMBINATORS["max"] is np.maximum


def test_reduce_inits_are_the_registrys_identities():
    """The DSL's reductions take their init from the registry's combinators (reduction.py);
    each is an identity of its combinator on every dtype, extremes included."""
    from dlvm_eq.ir.registry.reduction import COMBINATORS
    from dlvm_eq.ir.types import BOOL, F32, F64, I32

    big = np.iinfo(np.int32)
    samples = {
        F32: [-np.inf, -3.5, 0.0, 2.0, np.inf],
        F64: [-np.inf, -1e300, 0.0, 1e300, np.inf],
        I32: [big.min, -1, 0, 7, big.max],
        BOOL: [False, True],
    }
    for name, comb in COMBINATORS.items():
        for dtype, values in samples.items():
            init = np.asarray(comb.init(dtype), dtype.numpy)
            for v in values:
                v = np.asarray(v, dtype.numpy)
                assert comb.ufunc(init, v) == v, (name, dtype, v)
    low = np.full(3, big.min, np.int32)
    for target in ("interp", "cpu"):
        assert dq.jit(lambda x: dq.max(x), target=target)(low) == big.min
        assert dq.jit(lambda x: dq.min(-x - 1), target=target)(low) == big.max


@pytest.mark.parametrize("combinator", ["add", "multiply", "max", "min"])
@pytest.mark.parametrize("dt", ["f32", "i32"])
def test_every_registry_combinator_lowers_as_its_ufunc(combinator, dt):
    """The kernel step is the registry's (ir/registry/reduction.py `scalar`): each combinator
    against its numpy ufunc, floats with a NaN row (max and min propagate it)."""
    from dlvm_eq.codegen import KernelInput, Load, ReduceSpec, compile_cpu
    from dlvm_eq.ir.registry.reduction import COMBINATORS

    c = COMBINATORS[combinator]
    rng = np.random.default_rng(len(combinator) + len(dt))
    if dt == "i32":
        x = rng.integers(-3, 4, size=(5, 7)).astype(np.int32)
    else:
        x = rng.uniform(0.5, 1.5, size=(5, 7)).astype(np.float32)
        x[3, 2] = np.nan
    spec = ReduceSpec("r", x.shape, [KernelInput(dt)], Load(0), c.kernel, (1,))
    got = compile_cpu(spec)(x)
    want = c.ufunc.reduce(x, axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)


ALGEBRA = rule_file("algebra.egg").read_text()


def test_an_egraph_constructor_without_entry_is_named():
    """A rule file's Term constructor that is no op and has no e-graph-only entry
    (ir/registry/egraph_only.py) is named, and so is an entry no rule file declares."""
    extra = ALGEBRA + "\n(constructor Frob (Term i64) Term)\n"
    gaps = registry_gaps(rules={"algebra.egg": extra})
    assert (
        "algebra.egg constructor Frob is no op of the registry and has no e-graph-only entry "
        "(ir/registry/egraph_only.py)"
    ) in gaps
    without = ALGEBRA.replace("(constructor Gemm (Term Term i64 i64) Term)", "")
    gaps = registry_gaps(rules={"algebra.egg": without})
    assert "e-graph-only Gemm: no (constructor Gemm ...) in algebra.egg" in gaps
    wrong = ALGEBRA.replace(
        "(constructor Gemm (Term Term i64 i64)", "(constructor Gemm (Term i64 i64)"
    )
    gaps = registry_gaps(rules={"algebra.egg": wrong})
    assert "e-graph-only Gemm: 1 Term arguments, its entry 2, op dot 2" in gaps


def test_an_egraph_only_entry_that_names_no_op_is_named(monkeypatch):
    from dlvm_eq.ir.registry.egraph_only import EGRAPH_ONLY

    broken = dict(EGRAPH_ONLY)
    broken["Gemm"] = dataclasses.replace(EGRAPH_ONLY["Gemm"], through="transpoze")
    monkeypatch.setattr(registry_check, "EGRAPH_ONLY", broken)
    assert "e-graph-only Gemm: reads through transpoze, which is no op" in registry_gaps()


def _gemm_graph(flags):
    """A serialized e-graph holding one (Gemm A B ta tb) over two parameters."""
    ta, tb = flags

    def node(op, eclass, *children):
        return {"op": op, "eclass": eclass, "children": list(children)}

    nodes = {
        "nA": node('"A"', "pA"),
        "nB": node('"B"', "pB"),
        "a": node("Var", "cA", "nA"),
        "b": node("Var", "cB", "nB"),
        "ta": node(str(ta), "p1"),
        "tb": node(str(tb), "p2"),
        "g": node("Gemm", "cG", "a", "b", "ta", "tb"),
    }
    terms = {c: {"type": "Term"} for c in ("cA", "cB", "cG")}
    return Graph({"nodes": nodes, "class_data": terms, "root_eclasses": ["cG"]})


@pytest.mark.parametrize("flags", [(1, 0), (0, 1), (1, 1), (0, 0)])
def test_gemm_is_read_from_its_registry_entry(flags):
    """Gemm, the e-graph's dot of transposed reads, is decoded, typed, rendered, counted and
    unloaded through its registry entry (ir/registry/egraph_only.py): the unloaded function
    computes op(A) @ op(B) (against numpy in float64)."""
    from dlvm_eq.egraph.expr import render
    from dlvm_eq.egraph.loader import LoadedProgram
    from dlvm_eq.egraph.query import _multiplies
    from dlvm_eq.egraph.rule_origin import check_terms
    from dlvm_eq.egraph.unload import unload
    from dlvm_eq.ir import Module, interpret
    from dlvm_eq.ir.module import FunctionBuilder
    from dlvm_eq.ir.types import F64, tensor

    m, k, n = 5, 4, 3
    ta, tb = flags
    shape_a = (k, m) if ta else (m, k)
    shape_b = (n, k) if tb else (k, n)
    g = _gemm_graph(flags)
    d = g.decode("g")
    assert (d.op, d.attrs) == ("dot", {"transpose": flags})
    types = {"cA": tensor(*shape_a, F64), "cB": tensor(*shape_b, F64)}
    check_terms(g, types, {"A": types["cA"], "B": types["cB"]}, {})  # well-typed: no error
    choice = {c: n_ for n_, c in (("a", "cA"), ("b", "cB"), ("g", "cG"))}
    want_text = ("A.T" if ta else "A") + " @ " + ("B.T" if tb else "B")
    assert render(g, choice, "cG", types) == want_text
    assert _multiplies(g, choice, "cG", types) == m * k * n
    b = FunctionBuilder("f", [types["cA"], types["cB"]], ["A", "B"])
    prog = LoadedProgram("f", var_types={"A": types["cA"], "B": types["cB"]}, params=b.params)
    fn = unload(g, choice, prog, ["cG"])
    assert [i.op for i in fn.body].count("transpose") == ta + tb
    mod = Module("m")
    mod.add(fn)
    rng = np.random.default_rng(sum(flags))
    A, B = rng.standard_normal(shape_a), rng.standard_normal(shape_b)
    want = (A.T if ta else A) @ (B.T if tb else B)
    got = interpret(mod, "f", A, B, float64=True)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


def test_a_wrongly_typed_gemm_is_named():
    """The type check reads Gemm's operands through its entry: (Gemm A B 0 0) of a (5, 4) and a
    (3, 4) operand is ill-typed (it would be well-typed with B read transposed)."""
    from dlvm_eq.egraph.rule_origin import IllTypedTerm, check_terms
    from dlvm_eq.ir.types import F64, tensor

    g = _gemm_graph((0, 0))
    types = {"cA": tensor(5, 4, F64), "cB": tensor(3, 4, F64)}
    with pytest.raises(IllTypedTerm, match="Gemm"):
        check_terms(g, types, {"A": types["cA"], "B": types["cB"]}, {})
    check_terms(_gemm_graph((0, 1)), types, {"A": types["cA"], "B": types["cB"]}, {})


def test_an_attribute_layout_that_differs_from_the_schema_is_named(monkeypatch):
    """OpSpec.egg_attrs must list the constructor's primitive arguments in rules/schema.egg's
    order and sorts: the loader writes them and three readers read them from there."""
    schema = SCHEMA.replace("(Take Term Term i64)", "(Take Term Term i64 i64)")
    assert (
        "op take: (Take ...) takes i64 i64 after its operands, the registry's egg_attrs i64"
        in registry_gaps(schema)
    )
    broken = dict(OPS)
    broken["cumsum"] = dataclasses.replace(OPS["cumsum"], egg_attrs=(("axis", "i64"),))
    monkeypatch.setattr(registry_check, "OPS", broken)
    assert (
        "op cumsum: (Cumsum ...) takes i64 i64 after its operands, the registry's egg_attrs i64"
        in registry_gaps()
    )


@pytest.mark.parametrize(
    "op,attrs",
    [
        ("take", {"axis": 1}),
        ("cumsum", {"axis": 0, "reverse": True}),
        ("sliceScatter", {"axis": 1, "lo": 1, "step": 2, "size": 7}),
        ("reduce", {"combinator": "max", "init": -np.inf, "axes": (1,)}),
        ("dataTypeCast", {"dtype": F64}),
        ("transpose", {"perm": (1, 0)}),
    ],
)
def test_egg_attrs_round_trip(op, attrs):
    """What the loader writes (egg_args_of) the readers read back (egg_attrs_from), equal."""
    from dlvm_eq.ir.op_spec import egg_args_of, egg_attrs_from

    spec = OPS[op]
    args = egg_args_of(spec, attrs)
    assert all(isinstance(a, (int, float, str, tuple)) for a in args)
    assert egg_attrs_from(spec, args) == attrs
    with pytest.raises(ValueError, match="attribute"):
        egg_attrs_from(spec, args + (0,))


def test_a_bool_attribute_out_of_range_is_not_read_as_true():
    """verify-rules assigns r = 2 to (Cumsum x k r): the reader keeps 2, and cumsum's type rule
    rejects it (it once read as True, and the adjoint rule (Cumsum g k (- 1 r)) looked wrong)."""
    from dlvm_eq.ir.op_spec import egg_attrs_from
    from dlvm_eq.ir.types import F32, tensor

    spec = OPS["cumsum"]
    assert egg_attrs_from(spec, (0, 1)) == {"axis": 0, "reverse": True}
    bad = egg_attrs_from(spec, (0, 2))
    assert bad == {"axis": 0, "reverse": 2}
    with pytest.raises(dq.DlvmError, match="reverse must be 0 or 1"):
        spec.result_type([tensor(2, F32)], bad)
