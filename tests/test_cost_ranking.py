"""The shipped default cost model ranks measured programs of the benchmark's kinds (issue 36):
a user who never runs `dlvm-eq calibrate` is priced by these defaults, and the never-slower
guard (pipeline/never_slower.py) trusts their ratios.

The measurements are data (tests/data/egraph_value_programs.json, written by
`benchmarks/egraph_value.py --json`: each model's off and on program, one thread, their
fastest calls); the predictions are recomputed here from today's planner and cost model, so
a change that makes the defaults misrank these programs fails this test. No timing is taken."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from scipy.stats import spearmanr

import dlvm_eq as dq
from dlvm_eq.calibration.plan_cost import predict_plan
from dlvm_eq.codegen import set_cache_dir
from dlvm_eq.extract.machine import MACHINES
from dlvm_eq.pipeline.native import lower

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import egraph_models  # noqa: E402  (the benchmark's models: no side effects at import)

DATA = Path(__file__).parent / "data" / "egraph_value_programs.json"
# Every model of the benchmark (about 20 s to build and plan here). A fixed subset of 10 fell
# from 0.91 to 0.89 when a merge lowered one plain program's prediction by 3%: on so few
# programs one pair decides; the benchmark itself ranks all 40 programs (0.94-0.95).
MODELS = tuple(m.__name__ for m in egraph_models.MODELS)


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    set_cache_dir(tmp_path_factory.mktemp("kernel-cache"))


@pytest.fixture(scope="module")
def programs():
    """model -> (recorded record, predicted off seconds, predicted on seconds), defaults."""
    recorded = {r["model"]: r for r in json.loads(DATA.read_text())["programs"]}
    by_name = {m.__name__: m for m in egraph_models.MODELS}
    out = {}
    for name in MODELS:
        model = by_name[name]
        _, plain, fname, _ = egraph_models.build(model, algebra=False)
        _, algebraic, _, _ = egraph_models.build(model, algebra=True)
        optimized = dq.optimize(algebraic, fname, target="cpu").module
        predicted = [
            predict_plan(lower(m, fname, optimize=False).plan, MACHINES["cpu"]).seconds
            for m in (plain, optimized)
        ]
        out[name] = (recorded[name], *predicted)
    return out


def test_recorded_data_covers_the_benchmark():
    recorded = json.loads(DATA.read_text())
    assert recorded["cost_model"] == "shipped defaults"
    names = {r["model"] for r in recorded["programs"]}
    assert len(names) >= 16 and set(MODELS) <= names


def test_defaults_rank_the_programs_as_measured(programs):
    """Predicted order vs measured order over the 20 programs (off and on of each model)."""
    predicted, measured = [], []
    for record, p_off, p_on in programs.values():
        predicted += [p_off, p_on]
        measured += [record["fastest_ms"]["off"], record["fastest_ms"]["on"]]
    rho = spearmanr(predicted, measured).statistic
    assert rho >= 0.9, f"Spearman rho {rho:.2f} between predicted and measured program times"


def test_defaults_see_which_way_each_large_measured_change_goes(programs):
    """Where the rules changed a program's time by more than 15% (measured), the defaults
    predict the change in the same direction."""
    wrong = []
    for name, (record, p_off, p_on) in programs.items():
        measured = record["measured_speedup"]
        if abs(math.log(measured)) > math.log(1.15) and (p_off / p_on - 1) * (measured - 1) <= 0:
            wrong.append(f"{name}: measured {measured:.2f}x, predicted {p_off / p_on:.2f}x")
    assert not wrong, wrong
    assert any(abs(math.log(r["measured_speedup"])) > math.log(1.15) for r, *_ in programs.values())


def test_building_a_model_leaves_the_bundled_loss_named_as_written():
    # build() once renamed dlvm_eq.models.mlp.loss to "mlp" for the rest of the process
    from dlvm_eq.models import mlp

    egraph_models.build(egraph_models.mlp, algebra=False)
    assert mlp.loss.__name__ == "loss"
