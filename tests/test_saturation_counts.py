"""Saturation asks egglog for the e-graph's size only after a step that changed it
(egraph/saturate.py): the size it keeps is the e-graph's true size after every step, on random
programs through the optimizer, the adjoint expansion and the fusion stage."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from ir_programs import functions

import dlvm_eq as dq
from dlvm_eq.ad.driver import adjoint_function
from dlvm_eq.egraph import saturate as saturate_mod
from dlvm_eq.ir import Module
from dlvm_eq.pipeline.planning import plan_function

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@settings(max_examples=10, **SETTINGS)
@given(functions(n_ops=10))
def test_the_kept_size_is_the_true_size_after_every_step(fn):
    module = Module("m")
    module.add(fn)
    steps, skipped, wrong = [0], [0], []
    real_step = saturate_mod._Saturation.step
    real_count = saturate_mod.node_count
    asked = [0]

    def checked_step(self, rs):
        before = asked[0]
        out = real_step(self, rs)
        steps[0] += 1
        skipped[0] += asked[0] == before  # the driver did not ask after this step
        true = real_count(self.session)  # asked here, whatever the step did
        if self.nodes != true:
            wrong.append((rs, self.nodes, true))
        return out

    def counted(session):
        asked[0] += 1
        return real_count(session)

    from dlvm_eq import config

    with pytest.MonkeyPatch.context() as m:
        m.setattr(saturate_mod._Saturation, "step", checked_step)
        m.setattr(saturate_mod, "node_count", counted)
        m.setenv("DLVM_EQ_NO_IR_CACHE", "1")
        config.reload()
        try:
            opt = dq.optimize(module).module
            if fn.result_type.__class__.__name__ == "TensorType" and fn.result_type.dtype.is_float:
                if any(p.type.dtype.is_float for p in fn.params):
                    adjoint_function(module, fn)
            plan_function(opt[fn.name], opt)
        finally:
            m.delenv("DLVM_EQ_NO_IR_CACHE")
            config.reload()
    assert not wrong, wrong
    assert skipped[0] > 0  # the check saw steps whose count was not asked (it is not vacuous)
