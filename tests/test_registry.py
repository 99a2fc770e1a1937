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
from dlvm_eq.ir import ops as ir_ops
from dlvm_eq.ir.ops import CONTROL, ELEMENTWISE_KINDS, OPS
from dlvm_eq.ir.registry import REGISTRY

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
